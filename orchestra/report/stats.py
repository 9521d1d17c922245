"""The statistics behind every verdict of a report, from scipy and statsmodels.

The unit of every comparison is the *task*: two conductors played the same held-out tasks with the same
seeds, so each task gives one paired difference. Pure functions over arrays; ``evaluation`` turns them
into table rows. What each one computes (``docs/statistics.md`` says why these tests):

* ``mcnemar_exact``: exact McNemar test of equal success (a binomial test on the discordant tasks).
* ``paired_success``: the Agresti–Min (2005) interval of a difference of matched proportions (half a
  task added to each cell of the 2×2 table, so a table with no discordant task does not give a
  point interval) and the one-sided non-inferiority test at a margin, both from statsmodels'
  weighted ``DescrStatsW`` on the per-task differences.
* ``paired_mean``: t interval of the mean per-task difference of a continuous measure (return, turns).
* ``ratio_ci``: paired BCa bootstrap interval of ``mean(cost_c) / mean(cost_b)`` (scipy).
* ``holm``: Holm's step-down adjustment across a table's comparisons (statsmodels).
* ``tasks_for_noninferiority`` / ``noninferiority_power``: the sample size a non-inferiority
  verdict needs, and the power a given one has (statsmodels' one-sample t power).
* ``oracle_router``, ``headroom``, ``captured_fraction``: the RouterBench-style ceiling.
* ``fqe_selection``: Spearman rank correlation of FQE with measured returns and the regret of picking
  the policy FQE ranks first.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats as sps
from statsmodels.stats.contingency_tables import mcnemar
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.power import TTestPower
from statsmodels.stats.weightstats import DescrStatsW

ALPHA = 0.05  # family-wise error rate of every table (two-sided intervals at 1 − ALPHA)
NI_MARGIN = 0.05  # non-inferiority margin for success: a conductor may be at most 5 points worse


# ----------------------------------------------------------------------------- success (paired binary)


@dataclass(frozen=True)
class McNemar:
    """Discordant tasks (``wins``: the conductor succeeded and the baseline failed; ``losses``: the
    reverse) and the exact two-sided p-value of H0: P(win) = P(loss)."""

    wins: int
    losses: int
    p: float


def _bool(x: Sequence[bool] | np.ndarray) -> np.ndarray:
    return np.asarray(x, dtype=bool).reshape(-1)


def mcnemar_exact(success: Sequence[bool] | np.ndarray, baseline: Sequence[bool] | np.ndarray) -> McNemar:
    """Exact McNemar test of two paired success vectors (same tasks, same order)."""
    c, b = _bool(success), _bool(baseline)
    if c.shape != b.shape:
        raise ValueError(f"mcnemar_exact: {c.size} and {b.size} outcomes; the samples must be paired")
    table = [[int(np.sum(c & b)), int(np.sum(c & ~b))], [int(np.sum(~c & b)), int(np.sum(~c & ~b))]]
    wins, losses = table[0][1], table[1][0]
    p = 1.0 if wins + losses == 0 else float(mcnemar(table, exact=True).pvalue)
    return McNemar(wins, losses, min(1.0, p))


@dataclass(frozen=True)
class PairedSuccess:
    """Success difference (conductor − baseline, as a fraction; ×100 = points) of matched tasks.

    ``diff`` is the raw mean difference; ``lo``/``hi`` the two-sided Agresti–Min interval at level
    1 − alpha; ``ni_lower`` the one-sided lower bound at 1 − alpha and ``ni_p`` the p-value of
    H0: diff ≤ −margin (non-inferiority shown when ``ni_p < alpha``, equivalently ``ni_lower > −margin``)."""

    n: int
    diff: float
    lo: float
    hi: float
    ni_lower: float
    ni_p: float
    margin: float


def _agresti_min(c: np.ndarray, b: np.ndarray) -> DescrStatsW:
    """Per-task differences with half a task added to each cell of the 2×2 table: one half-weight
    pseudo-task in each of (win, +1), (loss, −1), (both, 0), (neither, 0). The weighted mean is
    Agresti & Min's adjusted difference and the weighted variance theirs; statsmodels divides it by
    n + 1 instead of n + 2 and uses a t quantile, which widens their adjusted Wald interval by about
    1% at n = 150 (3% at n = 50)."""
    d = c.astype(np.float64) - b.astype(np.float64)
    data = np.concatenate([d, [1.0, -1.0, 0.0, 0.0]])
    weights = np.concatenate([np.ones_like(d), np.full(4, 0.5)])
    return DescrStatsW(data, weights=weights)


def paired_success(
    success: Sequence[bool] | np.ndarray,
    baseline: Sequence[bool] | np.ndarray,
    margin: float = NI_MARGIN,
    alpha: float = ALPHA,
) -> PairedSuccess:
    """The interval and the non-inferiority test of a matched success difference."""
    c, b = _bool(success), _bool(baseline)
    if c.shape != b.shape:
        raise ValueError(f"paired_success: {c.size} and {b.size} outcomes; the samples must be paired")
    if c.size == 0:
        return PairedSuccess(0, math.nan, math.nan, math.nan, math.nan, math.nan, margin)
    ds = _agresti_min(c, b)
    lo, hi = ds.tconfint_mean(alpha=alpha)
    ni_lower, _ = ds.tconfint_mean(alpha=2 * alpha)  # lower end of the one-sided (1 − α) interval
    _, ni_p, _ = ds.ttest_mean(value=-margin, alternative="larger")
    diff = float(np.mean(c.astype(np.float64) - b.astype(np.float64)))
    return PairedSuccess(int(c.size), diff, float(lo), float(hi), float(ni_lower), float(ni_p), margin)


# ----------------------------------------------------------------------------- continuous measures and costs


def paired_mean(
    values: Sequence[float] | np.ndarray, baseline: Sequence[float] | np.ndarray, alpha: float = ALPHA
) -> tuple[float, float, float]:
    """Mean per-task difference and its two-sided t interval; a constant difference gives a point."""
    c, b = np.asarray(values, dtype=np.float64), np.asarray(baseline, dtype=np.float64)
    if c.shape != b.shape:
        raise ValueError(f"paired_mean: {c.size} and {b.size} values; the samples must be paired")
    d = c - b
    if d.size == 0:
        return (math.nan, math.nan, math.nan)
    mean = float(d.mean())
    if d.size == 1 or np.ptp(d) == 0:
        return (mean, mean, mean)
    lo, hi = DescrStatsW(d).tconfint_mean(alpha=alpha)
    return (mean, float(lo), float(hi))


def _ratio(c: np.ndarray, b: np.ndarray, axis: int = -1) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.asarray(np.mean(c, axis=axis) / np.mean(b, axis=axis))


def ratio_ci(
    cost: Sequence[float] | np.ndarray,
    baseline: Sequence[float] | np.ndarray,
    alpha: float = ALPHA,
    n_resamples: int = 2000,
    seed: int = 0,
) -> tuple[float, float, float]:
    """``mean(cost) / mean(baseline)`` over matched tasks and its paired BCa bootstrap interval
    (scipy.stats.bootstrap, resampling tasks). nan when the baseline spends nothing; a point when
    every task costs the same under both."""
    c, b = np.asarray(cost, dtype=np.float64), np.asarray(baseline, dtype=np.float64)
    if c.shape != b.shape:
        raise ValueError(f"ratio_ci: {c.size} and {b.size} values; the samples must be paired")
    if c.size == 0 or float(b.mean()) <= 0:
        return (math.nan, math.nan, math.nan)
    point = float(c.mean() / b.mean())
    if c.size == 1 or (np.ptp(c) == 0 and np.ptp(b) == 0):
        return (point, point, point)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # degenerate resamples (a baseline mean of 0) are dropped below
        res = sps.bootstrap(
            (c, b),
            _ratio,
            paired=True,
            vectorized=True,
            n_resamples=n_resamples,
            confidence_level=1 - alpha,
            method="BCa",
            rng=np.random.default_rng(seed),
        )
    lo, hi = float(res.confidence_interval.low), float(res.confidence_interval.high)
    if not (math.isfinite(lo) and math.isfinite(hi)):  # BCa undefined (e.g. a near-constant sample): percentile
        dist = res.bootstrap_distribution[np.isfinite(res.bootstrap_distribution)]
        lo, hi = (float(v) for v in np.quantile(dist, [alpha / 2, 1 - alpha / 2]))
    return (point, lo, hi)


# ----------------------------------------------------------------------------- multiplicity and power


def holm(pvalues: Sequence[float], alpha: float = ALPHA) -> list[float]:
    """Holm-adjusted p-values (statsmodels ``multipletests(method="holm")``); nan entries stay nan and
    do not count as comparisons."""
    p = np.asarray(pvalues, dtype=np.float64)
    out = np.full(p.shape, math.nan)
    ok = np.isfinite(p)
    if ok.any():
        out[ok] = multipletests(p[ok], alpha=alpha, method="holm")[1]
    return [float(v) for v in out]


def _sd_paired(discordance: float, diff: float) -> float:
    """Standard deviation of one matched success difference: it is ±1 on discordant tasks (share
    ``discordance``) and 0 elsewhere, with mean ``diff``."""
    if not 0 <= abs(diff) <= discordance <= 1:
        raise ValueError(f"need |diff| ≤ discordance ≤ 1, got diff={diff}, discordance={discordance}")
    return math.sqrt(discordance - diff * diff)


def noninferiority_power(
    n: int, discordance: float, diff: float = 0.0, margin: float = NI_MARGIN, alpha: float = ALPHA
) -> float:
    """Power of the one-sided non-inferiority test on ``n`` tasks when the true difference is ``diff``
    and a share ``discordance`` of tasks is won or lost."""
    sd = _sd_paired(discordance, diff)
    if sd == 0:
        return 1.0 if diff > -margin else 0.0
    return float(TTestPower().power(effect_size=(diff + margin) / sd, nobs=n, alpha=alpha, alternative="larger"))


def tasks_for_noninferiority(
    discordance: float, diff: float = 0.0, margin: float = NI_MARGIN, alpha: float = ALPHA, power: float = 0.8
) -> int:
    """Tasks needed to show non-inferiority at ``margin`` with the given power (rounded up)."""
    sd = _sd_paired(discordance, diff)
    if sd == 0:
        return 2
    n = TTestPower().solve_power(effect_size=(diff + margin) / sd, alpha=alpha, power=power, alternative="larger")
    return int(math.ceil(float(n)))


# ----------------------------------------------------------------------------- ceiling


@dataclass(frozen=True)
class OracleChoice:
    """The schedule the oracle router picks for one task and what it scores there (``success``: 0/1 for one run,
    a share for a mean over runs)."""

    schedule: str
    success: float
    cost: float


def oracle_router(outcomes: Mapping[str, Mapping[Any, tuple[float, float]]]) -> dict[Any, OracleChoice]:
    """Per task, the best schedule of the menu in hindsight (RouterBench's oracle): the highest success (a bool for
    one run, or a mean success over runs), then the lowest cost, ties by name. ``outcomes[schedule][task] =
    (success, cost)``, where the cost is whatever breaks ties (tokens in phase 1); only tasks every schedule played
    count, so the oracle never sees a task some schedule skipped."""
    if not outcomes:
        return {}
    tasks = set.intersection(*(set(v) for v in outcomes.values()))
    out: dict[Any, OracleChoice] = {}
    for t in sorted(tasks, key=repr):
        best = min(outcomes, key=lambda s: (-float(outcomes[s][t][0]), outcomes[s][t][1], s))
        ok, cost = outcomes[best][t]
        out[t] = OracleChoice(best, float(ok), float(cost))
    return out


def replicate_oracle(
    picks_from: Mapping[str, Mapping[Any, tuple[float, float]]],
    scored_on: Mapping[str, Mapping[Any, tuple[float, float]]],
) -> dict[Any, OracleChoice]:
    """The oracle router without best-of-N luck: per task, the schedule :func:`oracle_router` picks on a replicate run
    (``picks_from``: the same tasks played with other sampling seeds), scored by what that schedule did in the run
    it is compared on (``scored_on``). A router can aim at this (its picks do not know the scored run's draws); the
    in-sample oracle's surplus over it is the luck component. Only tasks both runs played for every schedule count."""
    common = {s: v for s, v in picks_from.items() if s in scored_on}
    if not common:
        return {}
    tasks = set.intersection(*(set(v) for v in common.values()), *(set(scored_on[s]) for s in common))
    picks = oracle_router({s: {t: v[t] for t in tasks} for s, v in common.items()})
    return {t: OracleChoice(c.schedule, float(scored_on[c.schedule][t][0]), float(scored_on[c.schedule][t][1]))
            for t, c in picks.items()}  # fmt: skip


@dataclass(frozen=True)
class StumpRouter:
    """The simplest learned router: one threshold on one prompt statistic, ``low`` for tasks at or below it and
    ``high`` above (``low == high``: a fixed schedule), fitted on one run of the menu (:func:`fit_stump_router`)."""

    feature: str
    threshold: float
    low: str
    high: str
    fit_success: float  # on the tasks it was fitted on
    fit_cost: float

    def pick(self, features: Mapping[str, float]) -> str:
        return self.low if features[self.feature] <= self.threshold else self.high

    def describe(self) -> str:
        if self.low == self.high:
            return f"`{self.low}` everywhere"
        return f"`{self.low}` if {self.feature} ≤ {self.threshold:g}, else `{self.high}`"


def fit_stump_router(
    outcomes: Mapping[str, Mapping[Any, tuple[bool, float]]], features: Mapping[Any, Mapping[str, float]]
) -> StumpRouter:
    """The router of one threshold on one feature, between two rules of a menu, that solves the most of the tasks
    ``outcomes[rule][task] = (success, cost)`` every rule played and ``features`` describes; ties go to the cheaper,
    then to the first in (feature, threshold, rules) order. A baseline a learned conductor must beat before its
    routing counts as more than reading the prompt's size: fit it on validation, score it with :func:`route`."""
    rules = sorted(outcomes)
    tasks = sorted(set.intersection(*(set(outcomes[r]) for r in rules)) & set(features), key=repr)
    if not tasks:
        raise ValueError("fit_stump_router: no task that every rule played and that has features")
    succ = np.array([[float(outcomes[r][t][0]) for t in tasks] for r in rules])  # (rules, tasks)
    cost = np.array([[float(outcomes[r][t][1]) for t in tasks] for r in rules])
    best: tuple[tuple[float, float], StumpRouter] | None = None
    for name in sorted(features[tasks[0]]):
        x = np.array([float(features[t][name]) for t in tasks])
        for thr in np.unique(x):
            low = x <= thr
            for i, a in enumerate(rules):
                for j, b in enumerate(rules):
                    s = float(np.where(low, succ[i], succ[j]).mean())
                    c = float(np.where(low, cost[i], cost[j]).mean())
                    if best is None or (s, -c) > best[0]:
                        best = ((s, -c), StumpRouter(name, float(thr), a, b, s, c))
    assert best is not None
    return best[1]


def route(
    router: StumpRouter,
    outcomes: Mapping[str, Mapping[Any, tuple[bool, float]]],
    features: Mapping[Any, Mapping[str, float]],
) -> dict[Any, OracleChoice]:
    """Per task of ``features`` that the router's rules played, the rule it picks and what that rule scored there."""
    out: dict[Any, OracleChoice] = {}
    for t, f in features.items():
        rule = router.pick(f)
        if t in outcomes.get(rule, {}):
            ok, c = outcomes[rule][t]
            out[t] = OracleChoice(rule, bool(ok), float(c))
    return out


def headroom(oracle: float, best_rule: float) -> float:
    """Success the best rule-based schedule leaves to a router: oracle − best rule."""
    return oracle - best_rule


def captured_fraction(learner: float, best_rule: float, oracle: float) -> float:
    """(learner − best rule) / (oracle − best rule): 0 = no better than the best rule, 1 = the oracle;
    negative when the learner is worse than the best rule; nan without headroom."""
    room = headroom(oracle, best_rule)
    return (learner - best_rule) / room if room > 1e-12 else math.nan


# ----------------------------------------------------------------------------- off-policy evaluation


@dataclass(frozen=True)
class FQESelection:
    """How well FQE ranks policies whose on-policy return was measured on the same initial states."""

    n_policies: int
    spearman: float
    spearman_p: float
    picked: int  # index of the policy FQE ranks first
    regret: float  # best measured return − measured return of the picked policy


def fqe_selection(fqe: Sequence[float], measured: Sequence[float]) -> FQESelection:
    """Spearman rank correlation between FQE estimates and measured returns (scipy), and the regret of
    choosing the policy with the highest FQE estimate."""
    q, r = np.asarray(fqe, dtype=np.float64), np.asarray(measured, dtype=np.float64)
    if q.shape != r.shape or q.size < 2:
        raise ValueError(f"fqe_selection: need ≥ 2 policies with both figures, got {q.size} and {r.size}")
    res = sps.spearmanr(q, r)
    rho, p = float(res.statistic), float(res.pvalue)
    picked = int(np.argmax(q))
    return FQESelection(int(q.size), rho, p, picked, float(r.max() - r[picked]))


def mean_sd(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (ddof = 1; 0 for one value) of per-seed results."""
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        return (math.nan, math.nan)
    return (float(x.mean()), float(x.std(ddof=1)) if x.size > 1 else 0.0)


__all__ = [
    "ALPHA",
    "NI_MARGIN",
    "FQESelection",
    "McNemar",
    "OracleChoice",
    "PairedSuccess",
    "captured_fraction",
    "fqe_selection",
    "headroom",
    "holm",
    "mcnemar_exact",
    "mean_sd",
    "noninferiority_power",
    "oracle_router",
    "StumpRouter",
    "fit_stump_router",
    "route",
    "paired_mean",
    "paired_success",
    "ratio_ci",
    "tasks_for_noninferiority",
]
