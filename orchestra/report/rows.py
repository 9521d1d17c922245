"""The rows of an evaluation report's three tables (:mod:`orchestra.report.evaluation` computes them, writes them as
CSV and markdown, and :mod:`orchestra.report.plots` draws the first): one conductor's summary, a paired comparison
against a baseline, and how varied a conductor's schedules are."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class ResultRow:
    """One (family, team, conductor): means over its episodes with 95% intervals.

    ``ci_low``/``ci_high`` bound the success rate (Wilson score interval); return, turns and tokens
    have percentile-bootstrap intervals over episodes. Episodes a fault ended (`Episode.error`) are not
    in ``episodes`` or any mean: they are counted in ``errored``."""

    family: str
    team: str
    conductor: str
    episodes: int
    successes: int
    success_rate: float
    ci_low: float
    ci_high: float
    mean_return: float
    mean_turns: float
    mean_tokens: float
    truncated_rate: float
    rule_based: bool
    return_ci_low: float
    return_ci_high: float
    turns_ci_low: float
    turns_ci_high: float
    tokens_ci_low: float
    tokens_ci_high: float
    errored: int = 0
    mean_price: float = 0.0  # the team file's worker prices summed per episode (0 for an unpriced team)


@dataclass(frozen=True)
class PairedRow:
    """``conductor`` − ``baseline`` on the tasks both played (same task id and seed).

    Success (fractions; ×100 = points): ``success_diff`` is the mean per-task difference,
    ``success_lo``/``success_hi`` its 95% Agresti–Min interval, ``wins``/``losses`` the discordant
    tasks, ``mcnemar_p`` the exact McNemar p-value, ``ni_lower`` the one-sided 95% lower bound and
    ``ni_p`` the p-value of "more than ``evaluation.NI_MARGIN`` worse"; the ``*_holm`` columns are Holm-adjusted
    across the rows of one table (a row made alone is its own table). Return: mean difference and t
    interval. Turns, tokens and price: ratio of paired means (conductor / baseline) with a paired BCa
    bootstrap interval (nan when the baseline spends nothing, so always for price on an unpriced team)."""

    family: str
    team: str
    conductor: str
    baseline: str
    rule_based: bool
    n_pairs: int
    success: float
    baseline_success: float
    success_diff: float
    success_lo: float
    success_hi: float
    wins: int
    losses: int
    mcnemar_p: float
    mcnemar_p_holm: float
    ni_lower: float
    ni_p: float
    ni_p_holm: float
    return_diff: float
    return_lo: float
    return_hi: float
    turns_ratio: float
    turns_ratio_lo: float
    turns_ratio_hi: float
    tokens_ratio: float
    tokens_ratio_lo: float
    tokens_ratio_hi: float
    verdict: str
    # a priced team's price (the team file's worker prices per episode): the same ratio; nan when unpriced
    price_ratio: float = math.nan
    price_ratio_lo: float = math.nan
    price_ratio_hi: float = math.nan


@dataclass(frozen=True)
class CollapseRow:
    """How varied a conductor's schedules are over its episodes of one (family, team)."""

    family: str
    team: str
    conductor: str
    rule_based: bool
    episodes: int
    distinct: int
    entropy_bits: float
    top_share: float
    top_sequence: str
    collapsed: bool


__all__ = ["CollapseRow", "PairedRow", "ResultRow"]
