"""Evaluation of conductors on the same held-out tasks: per-conductor summaries, paired comparisons
against the best rule-based scheduler with tests that support each verdict, and a mode-collapse check.

Every conductor runs the same test-split tasks with the same per-episode seeds (paired design), per
task family, so two conductors' episodes pair up on ``(task.family, task.id, seed)`` and a comparison
works on per-*task* differences (the unit that varies) instead of treating the two samples as
independent. Output (``write_report`` / ``evaluation_report``): ``results.csv``, ``results.md`` (main
table, paired table, mode-collapse table), ``paired.csv``, ``collapse.csv``, ``success.png`` and
``cost.png`` in the run directory.

Main table: success with its Wilson interval, the other means with percentile-bootstrap intervals
(fixed seed, so a report is reproducible to the digit). Paired table (``orchestra.report.stats``):
exact McNemar for a success difference, the Agresti–Min interval and a one-sided non-inferiority test
at −5 points, paired BCa intervals of cost ratios, Holm's adjustment across the table's rows.
"""

from __future__ import annotations

import csv
import dataclasses
import math
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats as sps
from statsmodels.stats.proportion import proportion_confint

from orchestra.report import stats
from orchestra.report.plots import plot_cost, plot_success
from orchestra.report.rows import CollapseRow, PairedRow, ResultRow
from policies import RULE_BASED
from trajectories import Episode

N_RESAMPLES = 2000  # bootstrap resamples behind every bootstrap interval of the report
ALPHA = stats.ALPHA  # family-wise error rate of each table's tests
CONFIDENCE = 1 - ALPHA  # two-sided level of every interval
BEAT_MARGIN = 0.05  # "beats": a significant success difference of at least +5 points
NI_MARGIN = stats.NI_MARGIN  # "non-inferior" / "cheaper": at most 5 points worse, shown at level ALPHA
CHEAPER_FRACTION = 0.25  # "cheaper": turns or tokens at least 25% lower, the ratio's CI below 1
COLLAPSE_SHARE = 0.9  # "collapsed": one action sequence covers at least 90% of the episodes

Stat = Callable[..., Any]  # a reduction taking ``axis=``, as np.mean


MODEL_CONDUCTORS = ("llm", "llm_instruct", "human")  # conductors that are neither rules nor learned from the logs


def is_rule_based(conductor: str, checkpoint: str | None = None) -> bool:
    """A conductor recorded by a rule: a built-in one (``policies.RULE_BASED``) or a rule the team file
    names (``conductors: {NAME: {type: pipeline, ...}}``). Learned conductors carry a checkpoint; the
    LLM and human conductors are not rules either."""
    if conductor in RULE_BASED:
        return True
    return checkpoint is None and conductor not in MODEL_CONDUCTORS


# ----------------------------------------------------------------------------- intervals


def wilson_ci(successes: int, n: int, alpha: float = ALPHA) -> tuple[float, float]:
    """Wilson score interval of a success rate (statsmodels); it behaves at 0% and 100%, where a
    percentile bootstrap collapses to a point. ``(0, 1)`` for no episodes."""
    if n == 0:
        return (0.0, 1.0)
    lo, hi = proportion_confint(successes, n, alpha=alpha, method="wilson")
    return (max(0.0, float(lo)), min(1.0, float(hi)))


def bootstrap_ci(
    values: Sequence[float] | np.ndarray,
    stat: Stat = np.mean,
    n_resamples: int = N_RESAMPLES,
    seed: int = 0,
    confidence: float = CONFIDENCE,
) -> tuple[float, float]:
    """Percentile bootstrap interval of ``stat(values)`` (scipy.stats.bootstrap, resampling episodes).

    ``stat`` takes ``axis=`` (np.mean, np.median, ...). Deterministic for a seed; a constant sample
    gives a point, empty input ``(nan, nan)``."""
    x = np.asarray(values, dtype=np.float64)  # (n,)
    if x.size == 0:
        return (math.nan, math.nan)
    if x.size == 1 or np.ptp(x) == 0:
        v = float(stat(x, axis=0))
        return (v, v)
    res = sps.bootstrap(
        (x,),
        stat,
        vectorized=True,
        n_resamples=n_resamples,
        confidence_level=confidence,
        method="percentile",
        rng=np.random.default_rng(seed),
    )
    return (float(res.confidence_interval.low), float(res.confidence_interval.high))


# ----------------------------------------------------------------------------- per-conductor summary


def _group(episodes: Iterable[Episode]) -> dict[tuple[str, str, str], list[Episode]]:
    """Task outcomes by (family, team, conductor); episodes a fault ended are left out."""
    groups: dict[tuple[str, str, str], list[Episode]] = defaultdict(list)
    for e in episodes:
        if e.error is None:
            groups[(e.task.family, e.team.name, e.conductor.name)].append(e)
    return dict(sorted(groups.items()))


def summarize(episodes: Iterable[Episode], n_resamples: int = N_RESAMPLES, seed: int = 0) -> list[ResultRow]:
    """One row per (family, team, conductor), sorted: success with its Wilson interval, the other
    means with bootstrap intervals. Episodes a fault ended are counted in ``errored``, nowhere else."""
    episodes = list(episodes)
    errored = Counter((e.task.family, e.team.name, e.conductor.name) for e in episodes if e.error is not None)
    rows = []
    for (family, team, conductor), eps in _group(episodes).items():
        success = np.array([e.success for e in eps], dtype=np.float64)
        ret = np.array([e.return_ for e in eps], dtype=np.float64)
        turns = np.array([e.worker_turns for e in eps], dtype=np.float64)
        tokens = np.array([e.total_tokens for e in eps], dtype=np.float64)
        k, n = int(success.sum()), len(eps)
        s_lo, s_hi = wilson_ci(k, n)
        r_lo, r_hi = bootstrap_ci(ret, n_resamples=n_resamples, seed=seed)
        t_lo, t_hi = bootstrap_ci(turns, n_resamples=n_resamples, seed=seed)
        k_lo, k_hi = bootstrap_ci(tokens, n_resamples=n_resamples, seed=seed)
        rows.append(
            ResultRow(
                family=family,
                team=team,
                conductor=conductor,
                episodes=n,
                successes=k,
                success_rate=k / n,
                ci_low=s_lo,
                ci_high=s_hi,
                mean_return=float(ret.mean()),
                mean_turns=float(turns.mean()),
                mean_tokens=float(tokens.mean()),
                truncated_rate=float(np.mean([e.truncated for e in eps])),
                rule_based=is_rule_based(conductor, eps[0].conductor.checkpoint),
                return_ci_low=r_lo,
                return_ci_high=r_hi,
                turns_ci_low=t_lo,
                turns_ci_high=t_hi,
                tokens_ci_low=k_lo,
                tokens_ci_high=k_hi,
                errored=errored[(family, team, conductor)],
                mean_price=float(np.mean([e.price for e in eps])),
            )
        )
    return rows


def format_table(rows: Sequence[ResultRow]) -> str:
    """A markdown table (readable on screen and in a README): success with its 95% Wilson interval,
    return, turns and tokens with 95% bootstrap intervals."""
    head = "| family | conductor | n | success | 95% CI | return | 95% CI | turns | 95% CI | tokens | 95% CI |"
    sep = "|---|---|---:|---:|---|---:|---|---:|---|---:|---|"
    lines = [head, sep]
    for r in rows:
        lines.append(
            f"| {r.family} | {r.conductor} | {r.episodes} | {100 * r.success_rate:.1f}% "
            f"| [{100 * r.ci_low:.1f}, {100 * r.ci_high:.1f}] "
            f"| {r.mean_return:.3f} | [{r.return_ci_low:.3f}, {r.return_ci_high:.3f}] "
            f"| {r.mean_turns:.2f} | [{r.turns_ci_low:.2f}, {r.turns_ci_high:.2f}] "
            f"| {r.mean_tokens:.1f} | [{r.tokens_ci_low:.1f}, {r.tokens_ci_high:.1f}] |"
        )
    return "\n".join(lines)


# ----------------------------------------------------------------------------- paired comparison


def best_rule_based(rows: Sequence[ResultRow]) -> dict[tuple[str, str], str]:
    """Per (family, team): the rule-based conductor with the highest success rate, ties broken by the
    higher mean return, then by name (so the choice never depends on input order)."""
    best: dict[tuple[str, str], ResultRow] = {}
    for r in rows:
        if not r.rule_based:
            continue
        key = (r.family, r.team)
        cur = best.get(key)
        if cur is None or (r.success_rate, r.mean_return, cur.conductor) > (
            cur.success_rate,
            cur.mean_return,
            r.conductor,
        ):
            best[key] = r
    return {k: r.conductor for k, r in sorted(best.items())}


def _cheaper(ratio: float, hi: float) -> bool:
    return not math.isnan(ratio) and ratio <= 1 - CHEAPER_FRACTION + 1e-12 and hi < 1


def verdict(
    success_diff: float,
    mcnemar_p: float,
    ni_p: float,
    turns_ratio: float = math.nan,
    turns_ratio_hi: float = math.nan,
    tokens_ratio: float = math.nan,
    tokens_ratio_hi: float = math.nan,
    alpha: float = ALPHA,
    price_ratio: float = math.nan,
    price_ratio_hi: float = math.nan,
) -> str:
    """The acceptance rule of a conductor against the best rule-based one, from Holm-adjusted p-values
    (success as fractions), the first that applies:

    * ``beats``: McNemar p < α and Δ success ≥ +5 points;
    * ``better``: McNemar p < α and 0 < Δ success < +5 points;
    * ``worse``: McNemar p < α and Δ success < 0;
    * ``cheaper``: non-inferior (p < α for "more than 5 points worse") and turns, tokens or (on a priced
      team) price at least 25% lower, with that ratio's 95% interval below 1;
    * ``non-inferior``: non-inferior at −5 points, not shown cheaper;
    * ``no clear difference``: none of these (the data do not tell).
    """
    if math.isnan(success_diff):
        return "no paired tasks"
    if mcnemar_p < alpha:
        if success_diff >= BEAT_MARGIN - 1e-12:
            return "beats"
        return "better" if success_diff > 0 else "worse"
    if ni_p < alpha:
        if any(_cheaper(*r) for r in ((turns_ratio, turns_ratio_hi), (tokens_ratio, tokens_ratio_hi),
                                      (price_ratio, price_ratio_hi))):  # fmt: skip
            return "cheaper"
        return "non-inferior"
    return "no clear difference"


def _pair_key(e: Episode) -> tuple[str, str, int]:
    return (e.task.family, e.task.id, e.seed)


def _with_verdict(r: PairedRow, mcnemar_p_holm: float, ni_p_holm: float) -> PairedRow:
    v = verdict(
        r.success_diff,
        mcnemar_p_holm,
        ni_p_holm,
        r.turns_ratio,
        r.turns_ratio_hi,
        r.tokens_ratio,
        r.tokens_ratio_hi,
        price_ratio=r.price_ratio,
        price_ratio_hi=r.price_ratio_hi,
    )
    return dataclasses.replace(r, mcnemar_p_holm=mcnemar_p_holm, ni_p_holm=ni_p_holm, verdict=v)


def paired_row(
    episodes: Sequence[Episode],
    baseline_episodes: Sequence[Episode],
    n_resamples: int = N_RESAMPLES,
    seed: int = 0,
) -> PairedRow:
    """Compare one conductor's episodes with one baseline's on their common ``(family, task, seed)``.

    A key recorded twice (a resumed run) counts once, its first episode. The row is its own table:
    its Holm-adjusted p-values are the raw ones (``paired_comparison`` adjusts across rows)."""
    if not episodes or not baseline_episodes:
        raise ValueError("paired_row: both conductors need episodes")
    mine: dict[tuple[str, str, int], Episode] = {}
    for e in episodes:
        if e.error is None:  # a fault is not an outcome: its pair is dropped
            mine.setdefault(_pair_key(e), e)
    base: dict[tuple[str, str, int], Episode] = {}
    for e in baseline_episodes:
        if e.error is None:
            base.setdefault(_pair_key(e), e)
    keys = sorted(mine.keys() & base.keys())

    def cols(eps: list[Episode]) -> np.ndarray:  # (n_pairs, 5): success, return, turns, tokens, price
        return np.array(
            [[e.success, e.return_, e.worker_turns, e.total_tokens, e.price] for e in eps], dtype=np.float64
        )

    c = cols([mine[k] for k in keys]).reshape(-1, 5)
    b = cols([base[k] for k in keys]).reshape(-1, 5)
    succ = stats.paired_success(c[:, 0] > 0.5, b[:, 0] > 0.5)
    mc = stats.mcnemar_exact(c[:, 0] > 0.5, b[:, 0] > 0.5) if keys else stats.McNemar(0, 0, math.nan)
    ret = stats.paired_mean(c[:, 1], b[:, 1])
    turns = stats.ratio_ci(c[:, 2], b[:, 2], n_resamples=n_resamples, seed=seed)
    tokens = stats.ratio_ci(c[:, 3], b[:, 3], n_resamples=n_resamples, seed=seed)
    priced = len(keys) > 0 and bool((b[:, 4] > 0).any())
    price = stats.ratio_ci(c[:, 4], b[:, 4], n_resamples=n_resamples, seed=seed) if priced else (math.nan,) * 3
    first = episodes[0]
    row = PairedRow(
        family=first.task.family,
        team=first.team.name,
        conductor=first.conductor.name,
        baseline=baseline_episodes[0].conductor.name,
        rule_based=is_rule_based(first.conductor.name, first.conductor.checkpoint),
        n_pairs=len(keys),
        success=float(c[:, 0].mean()) if len(keys) else math.nan,
        baseline_success=float(b[:, 0].mean()) if len(keys) else math.nan,
        success_diff=succ.diff,
        success_lo=succ.lo,
        success_hi=succ.hi,
        wins=mc.wins,
        losses=mc.losses,
        mcnemar_p=mc.p,
        mcnemar_p_holm=mc.p,
        ni_lower=succ.ni_lower,
        ni_p=succ.ni_p,
        ni_p_holm=succ.ni_p,
        return_diff=ret[0],
        return_lo=ret[1],
        return_hi=ret[2],
        turns_ratio=turns[0],
        turns_ratio_lo=turns[1],
        turns_ratio_hi=turns[2],
        tokens_ratio=tokens[0],
        tokens_ratio_lo=tokens[1],
        tokens_ratio_hi=tokens[2],
        verdict="",
        price_ratio=price[0],
        price_ratio_lo=price[1],
        price_ratio_hi=price[2],
    )
    return _with_verdict(row, mc.p, succ.ni_p)


def adjust(rows: Sequence[PairedRow]) -> list[PairedRow]:
    """Holm-adjust the McNemar and the non-inferiority p-values across ``rows`` (one table) and
    recompute each verdict from the adjusted ones."""
    mc = stats.holm([r.mcnemar_p for r in rows])
    ni = stats.holm([r.ni_p for r in rows])
    return [_with_verdict(r, m, n) for r, m, n in zip(rows, mc, ni, strict=True)]


def paired_comparison(
    episodes: Iterable[Episode],
    rows: Sequence[ResultRow] | None = None,
    n_resamples: int = N_RESAMPLES,
    seed: int = 0,
    baselines: Mapping[tuple[str, str], str] | None = None,
) -> list[PairedRow]:
    """Every conductor (learned first, then the other rule-based ones) against the baseline of its
    (family, team), Holm-adjusted across all the rows returned. ``baselines`` names the baseline per
    (family, team), e.g. the best fixed schedule chosen on validation; without it, the best rule-based
    conductor *of these episodes* (chosen on the data it is compared on: fine for a quick look, not for a
    released result). Families without a baseline get no rows."""
    groups = _group(episodes)
    rows = list(rows) if rows is not None else summarize([e for eps in groups.values() for e in eps], n_resamples, seed)
    chosen = dict(baselines) if baselines is not None else best_rule_based(rows)
    out = []
    for (family, team), baseline in sorted(chosen.items()):
        if (family, team, baseline) not in groups:
            continue
        others = [c for (f, t, c) in groups if (f, t) == (family, team) and c != baseline]
        others.sort(key=lambda c: (is_rule_based(c, groups[(family, team, c)][0].conductor.checkpoint), c))
        for c in others:
            out.append(paired_row(groups[(family, team, c)], groups[(family, team, baseline)], n_resamples, seed))
    return adjust(out)


def p_text(x: float) -> str:
    """A p-value as the report's tables print it (3 decimals, ``<0.001``, ``n/a``)."""
    if math.isnan(x):
        return "n/a"
    return f"{x:.3f}" if x >= 0.001 else "<0.001"


def _ratio(x: float, lo: float, hi: float) -> str:
    return "n/a" if math.isnan(x) else f"{x:.2f} [{lo:.2f}, {hi:.2f}]"


def format_paired_table(rows: Sequence[PairedRow]) -> str:
    """Markdown: differences vs the best rule-based conductor on the same tasks, with the tests behind
    each verdict (p-values Holm-adjusted across the table)."""
    head = (
        "| family | conductor | vs | pairs | Δ success (pts) | 95% CI | W / L | McNemar p | NI bound (pts) | NI p "
        "| turns ratio [95% CI] | tokens ratio [95% CI] | Δ return [95% CI] | verdict |"
    )
    sep = "|---|---|---|---:|---:|---|---:|---:|---:|---:|---|---|---|---|"
    priced = any(not math.isnan(r.price_ratio) for r in rows)  # a priced team's price ratio gets its own column
    if priced:
        head = head.replace("| tokens ratio [95% CI] |", "| tokens ratio [95% CI] | price ratio [95% CI] |")
        sep += "---|"
    lines = [head, sep]
    for r in rows:
        price = f"| {_ratio(r.price_ratio, r.price_ratio_lo, r.price_ratio_hi)} " if priced else ""
        lines.append(
            f"| {r.family} | {r.conductor} | {r.baseline} | {r.n_pairs} | {100 * r.success_diff:+.1f} "
            f"| [{100 * r.success_lo:+.1f}, {100 * r.success_hi:+.1f}] | {r.wins} / {r.losses} "
            f"| {p_text(r.mcnemar_p_holm)} | {100 * r.ni_lower:+.1f} | {p_text(r.ni_p_holm)} "
            f"| {_ratio(r.turns_ratio, r.turns_ratio_lo, r.turns_ratio_hi)} "
            f"| {_ratio(r.tokens_ratio, r.tokens_ratio_lo, r.tokens_ratio_hi)} {price}"
            f"| {r.return_diff:+.3f} [{r.return_lo:+.3f}, {r.return_hi:+.3f}] | **{r.verdict}** |"
        )
    return "\n".join(lines)


PAIRED_LEGEND = (
    "Differences are conductor − baseline on the same tasks (task id and seed). Success: Δ with its 95% "
    "Agresti–Min interval, W / L the tasks only the conductor / only the baseline solved, the exact McNemar "
    'p-value, the one-sided 95% lower bound of Δ (NI bound) and the p-value of "more than 5 points worse" '
    "(NI p); both p-values Holm-adjusted across the table's rows. Turns and tokens: conductor / baseline "
    "ratio of means with a paired BCa bootstrap interval (not adjusted). Verdict, the first that applies: "
    "**beats** (McNemar p < 0.05, Δ ≥ +5 points), **better** (McNemar p < 0.05, 0 < Δ < +5), **worse** "
    "(McNemar p < 0.05, Δ < 0), **cheaper** (NI p < 0.05 and a turns or tokens ratio ≤ 0.75 whose interval "
    "lies below 1), **non-inferior** (NI p < 0.05), **no clear difference** otherwise."
)
# what a table with a price column adds to the legend (a priced team's)
PRICE_LEGEND = (
    "Price: the team file's worker prices per episode, the same ratio; a price ratio ≤ 0.75 whose interval lies "
    "below 1 also makes a non-inferior conductor **cheaper**."
)


# ----------------------------------------------------------------------------- the cost–quality hull


def hull_rules(points: Mapping[str, tuple[float, float]], cost: float, success: float) -> tuple[str, str]:
    """The two fixed schedules a conductor at (``cost``, ``success``) is compared with on the cost–quality plane,
    from the menu's ``points`` (rule -> (mean cost, success)), the hull read at the conductor's place:

    * at equal cost: the most successful rule costing no more than the conductor (the cheapest rule when none is
      that cheap); the conductor is above the hull there when it is more successful;
    * at equal success: the cheapest rule at least as successful as the conductor (the most successful rule when
      none is); the conductor is above the hull there when it is as successful for ≥ 25% less.

    Ties go to the cheaper, then the first-named rule."""
    if not points:
        raise ValueError("hull_rules: the menu has no rules")
    names = list(points)
    affordable = [r for r in names if points[r][0] <= cost + 1e-12]
    at_cost = (
        max(affordable, key=lambda r: (points[r][1], -points[r][0], -names.index(r)))
        if affordable
        else min(names, key=lambda r: (points[r][0], -points[r][1], names.index(r)))
    )
    good = [r for r in names if points[r][1] >= success - 1e-12]
    at_success = (
        min(good, key=lambda r: (points[r][0], -points[r][1], names.index(r)))
        if good
        else max(names, key=lambda r: (points[r][1], -points[r][0], -names.index(r)))
    )
    return at_cost, at_success


def hull_comparison(
    episodes: Iterable[Episode],
    rows: Sequence[ResultRow],
    menus: Mapping[str, Sequence[str]],
    cost: Callable[[ResultRow], float],
    n_resamples: int = N_RESAMPLES,
    seed: int = 0,
) -> list[PairedRow]:
    """Every learned conductor of each team (``menus``: team -> its fixed schedules) paired with the two rules of
    :func:`hull_rules` at its place on the plane (``cost`` of a result row: tokens, or a priced team's price).
    Holm-adjusted within each team's comparisons (:func:`above_hull` reads them)."""
    groups = _group(episodes)
    out: list[PairedRow] = []
    for team, menu in menus.items():
        team_rows = {r.conductor: r for r in rows if r.team == team}
        points = {m: (cost(team_rows[m]), team_rows[m].success_rate) for m in menu if m in team_rows}
        if not points:
            continue
        mine: list[PairedRow] = []
        for r in team_rows.values():
            if r.rule_based or r.conductor in menu or r.conductor in MODEL_CONDUCTORS:
                continue
            for rule in dict.fromkeys(hull_rules(points, cost(r), r.success_rate)):
                mine.append(
                    paired_row(groups[(r.family, team, r.conductor)], groups[(r.family, team, rule)], n_resamples, seed)
                )
        out += adjust(mine)
    return out


def above_hull(rows: Sequence[PairedRow], alpha: float = ALPHA) -> dict[tuple[str, str], bool]:
    """(team, conductor) -> whether one of its :func:`hull_comparison` rows puts it above the hull: more successful
    (Holm-adjusted McNemar p < α, Δ > 0), or non-inferior (Holm-adjusted NI p < α) at a cost ≥ 25% lower with the
    ratio's interval below 1, the cost being a priced team's price (else tokens)."""
    out: dict[tuple[str, str], bool] = {}
    for r in rows:
        priced = not math.isnan(r.price_ratio)
        ratio, hi = (r.price_ratio, r.price_ratio_hi) if priced else (r.tokens_ratio, r.tokens_ratio_hi)
        better = r.mcnemar_p_holm < alpha and r.success_diff > 0
        cheaper = r.ni_p_holm < alpha and _cheaper(ratio, hi)
        out[(r.team, r.conductor)] = out.get((r.team, r.conductor), False) or better or cheaper
    return out


# ----------------------------------------------------------------------------- mode collapse


def sequence_entropy(sequences: Sequence[tuple[str, ...]]) -> tuple[float, int, float, tuple[str, ...]]:
    """Shannon entropy ``H = −Σ_s p(s) log2 p(s)`` (bits) of the empirical distribution of action-label
    sequences, the number of distinct sequences, the share of the most common one and that sequence.

    One sequence → H = 0; k equally frequent ones → H = log2 k. Ties for the most common sequence
    go to the lexicographically smallest, so the report is stable."""
    if not sequences:
        return (0.0, 0, 0.0, ())
    counts = Counter(sequences)
    p = np.array(list(counts.values()), dtype=np.float64) / len(sequences)
    h = float(-(p * np.log2(p)).sum()) + 0.0  # + 0.0 turns -0.0 into 0.0
    top, top_n = min(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return (max(h, 0.0), len(counts), top_n / len(sequences), top)


def mode_collapse(episodes: Iterable[Episode], threshold: float = COLLAPSE_SHARE) -> list[CollapseRow]:
    """Per (family, team, conductor): entropy of the action-label sequences; ``collapsed`` when one
    sequence covers ≥ ``threshold`` of the episodes. A fixed pipeline is collapsed by design; the
    check matters for learned conductors that were meant to adapt to the task."""
    out = []
    for (family, team, conductor), eps in _group(episodes).items():
        seqs = [tuple(s.action.label for s in e.steps) for e in eps]
        h, k, share, top = sequence_entropy(seqs)
        out.append(
            CollapseRow(
                family=family,
                team=team,
                conductor=conductor,
                rule_based=is_rule_based(conductor, eps[0].conductor.checkpoint),
                episodes=len(eps),
                distinct=k,
                entropy_bits=h,
                top_share=share,
                top_sequence=" → ".join(top),
                collapsed=share >= threshold - 1e-12,
            )
        )
    return out


def format_collapse_table(rows: Sequence[CollapseRow]) -> str:
    head = "| family | conductor | kind | n | distinct schedules | entropy (bits) | top share | most common schedule | collapsed |"
    sep = "|---|---|---|---:|---:|---:|---:|---|---|"
    lines = [head, sep]
    for r in rows:
        kind = "rule-based" if r.rule_based else "learned"
        flag = "**yes**" if r.collapsed else "no"
        lines.append(
            f"| {r.family} | {r.conductor} | {kind} | {r.episodes} | {r.distinct} | {r.entropy_bits:.2f} "
            f"| {100 * r.top_share:.0f}% | {r.top_sequence} | {flag} |"
        )
    return "\n".join(lines)


# ----------------------------------------------------------------------------- report files


def _write_csv(path: Path, cls: type, rows: Sequence[Any]) -> None:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=[fl.name for fl in fields(cls)])
        w.writeheader()
        for r in rows:
            w.writerow(asdict(r))


def _markdown(
    title: str, rows: Sequence[ResultRow], paired: Sequence[PairedRow], collapse: Sequence[CollapseRow]
) -> str:
    parts = [
        f"# {title}",
        "Success: 95% Wilson interval; return, turns, tokens: 95% percentile bootstrap over episodes "
        "(fixed seed). Every conductor played the same tasks with the same seeds.",
        "## Conductors",
        format_table(rows),
        "![success](success.png)\n\n![success vs cost](cost.png)",
    ]
    if paired:
        parts += [
            "## Paired comparison against the best rule-based conductor",
            PAIRED_LEGEND,
            format_paired_table(paired),
        ]
    if collapse:
        parts += [
            "## Mode collapse",
            f"Entropy of the action-sequence distribution over episodes; **collapsed** when one schedule "
            f"covers ≥ {100 * COLLAPSE_SHARE:.0f}% of them (a fixed pipeline is collapsed by design).",
            format_collapse_table(collapse),
        ]
    return "\n\n".join(parts) + "\n"


def write_report(
    rows: Sequence[ResultRow],
    out_dir: Path,
    title: str = "Conductor evaluation",
    paired: Sequence[PairedRow] = (),
    collapse: Sequence[CollapseRow] = (),
) -> dict[str, Path]:
    """Write results.csv, results.md, paired.csv, collapse.csv, success.png and cost.png into
    ``out_dir``; returns their paths (keys csv, md, png, paired_csv, collapse_csv, cost_png)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {
        "csv": out_dir / "results.csv",
        "md": out_dir / "results.md",
        "png": out_dir / "success.png",
        "paired_csv": out_dir / "paired.csv",
        "collapse_csv": out_dir / "collapse.csv",
        "cost_png": out_dir / "cost.png",
    }
    _write_csv(paths["csv"], ResultRow, rows)
    _write_csv(paths["paired_csv"], PairedRow, paired)
    _write_csv(paths["collapse_csv"], CollapseRow, collapse)
    paths["md"].write_text(_markdown(title, rows, paired, collapse), encoding="utf-8")
    plot_success(rows, paths["png"], title)
    plot_cost(rows, paths["cost_png"], title)
    return paths


def evaluation_report(
    episodes: Iterable[Episode],
    out_dir: Path,
    title: str = "Conductor evaluation",
    n_resamples: int = N_RESAMPLES,
    seed: int = 0,
) -> tuple[list[ResultRow], list[PairedRow], dict[str, Path]]:
    """Summary, paired comparison and mode-collapse check of ``episodes``, written into ``out_dir``."""
    eps = list(episodes)
    rows = summarize(eps, n_resamples, seed)
    paired = paired_comparison(eps, rows, n_resamples, seed)
    paths = write_report(rows, Path(out_dir), title, paired, mode_collapse(eps))
    return rows, paired, paths


__all__ = [
    "ALPHA",
    "BEAT_MARGIN",
    "CHEAPER_FRACTION",
    "NI_MARGIN",
    "PAIRED_LEGEND",
    "above_hull",
    "hull_comparison",
    "hull_rules",
    "PRICE_LEGEND",
    "COLLAPSE_SHARE",
    "N_RESAMPLES",
    "CollapseRow",
    "PairedRow",
    "ResultRow",
    "adjust",
    "best_rule_based",
    "bootstrap_ci",
    "evaluation_report",
    "format_collapse_table",
    "format_paired_table",
    "p_text",
    "format_table",
    "is_rule_based",
    "mode_collapse",
    "paired_comparison",
    "paired_row",
    "plot_cost",
    "plot_success",
    "sequence_entropy",
    "summarize",
    "verdict",
    "wilson_ci",
    "write_report",
]
