"""Verdicts over seeds: a training run is the unit (issue 34 item 4).

A phase-2 comparison asks whether *training with* scheme A beats training with scheme B, so the independent unit is
the run (one seed), not a task or an episode: task-level intervals hold the trained adapters fixed and read
run-to-run chaos as a scheme effect. Every function here takes, per configuration, one score per seed
(``seed → value``: a run's held-out success, its exact J, …). Pure functions over those; the experiments turn them
into tables (:mod:`orchestra.experiments.verdicts`).

* :func:`iqm_interval`: the interquartile mean over runs (the 25% trimmed mean, scipy's ``trim_mean``) with a
  stratified percentile bootstrap interval: runs resampled with replacement within each task (Agarwal et al. 2021,
  "Deep RL at the edge of the statistical precipice", NeurIPS; the ``StratifiedBootstrap`` of their ``rliable``).
  Re-implemented here in numpy: rliable 1.2.0, its latest release, needs ``arch < 8``, and arch 7.2 no longer imports
  under pandas 3 (the pandas this project runs).
* :func:`paired_seeds`: scheme A − scheme B over the seeds both ran (same seed = same initial team and trainer seed:
  paired): the mean per-seed difference, its two-sided t interval over seeds and the paired t-test p (scipy), and
  :func:`minimum_detectable_effect` at that seed count.
* :func:`null_check`: the same procedure applied to two configurations that are the same algorithm, on disjoint
  seeds (naive against joint_indep, or one scheme's seeds split in two halves). Its seeds are matched in order into
  pseudo-pairs and :func:`paired_seeds` is applied unchanged: under the null, pseudo-pair differences are independent
  with mean 0, so a calibrated procedure rejects at rate α. A procedure that calls them different is wrong.
* :func:`holm` (from :mod:`orchestra.report.stats`): the correction of a declared primary family.

Why a t interval over seeds rather than a bootstrap for the differences: with 3–12 seeds a percentile bootstrap of a
mean undercovers (its width is about √((n − 1)/n) · z/t of the t interval's: 0.53 at 4 seeds, 0.78 at 8), while the t interval is exact for normal
differences and robust enough for sums of many episodes; the null check measures the calibration on the data.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats as sps

from orchestra.report.stats import ALPHA, holm

POWER = 0.8  # the power at which the minimum detectable effect is stated
IQM_CUT = 0.25  # the IQM trims this share of runs from each end (rliable's ``aggregate_iqm``)
BOOTSTRAP_REPS = 2000  # bootstrap resamples of the IQM interval

SeedValues = Mapping[int, float]  # seed → the run's score


# ----------------------------------------------------------------------------------------------------------------
# one configuration: the IQM over runs


def iqm(scores: np.ndarray) -> float:
    """Interquartile mean of every entry of ``scores`` (runs, tasks): scipy's 25% trimmed mean over all of them
    (rliable's ``aggregate_iqm``). With fewer than 4 runs nothing is trimmed: the mean."""
    return float(sps.trim_mean(np.asarray(scores, dtype=np.float64), IQM_CUT, axis=None))


def stratified_resamples(scores: np.ndarray, reps: int, rng: np.random.Generator) -> np.ndarray:
    """``reps`` stratified bootstrap resamples of ``scores`` (runs, tasks): in each, every task's column is ``runs``
    draws with replacement from that task's own runs (rliable's ``StratifiedBootstrap``, over runs only). Returns
    (reps, runs, tasks)."""
    x = np.asarray(scores, dtype=np.float64)
    runs, tasks = x.shape
    idx = rng.integers(0, runs, size=(reps, runs, tasks))  # (reps, runs, tasks) run drawn for each cell
    return np.take_along_axis(np.broadcast_to(x, (reps, runs, tasks)), idx, axis=1)


@dataclass(frozen=True)
class Interval:
    """A point estimate and its two-sided interval at level 1 − alpha."""

    point: float
    lo: float
    hi: float


def iqm_interval(
    scores: np.ndarray | Sequence[float],
    alpha: float = ALPHA,
    reps: int = BOOTSTRAP_REPS,
    seed: int = 0,
) -> Interval:
    """IQM over runs and its stratified percentile bootstrap interval (module docstring). ``scores``: (runs, tasks),
    or one score per run. A single run gives a point and no interval (nan): nothing to resample."""
    x = np.asarray(scores, dtype=np.float64)
    x = x.reshape(-1, 1) if x.ndim == 1 else x
    if x.size == 0:
        return Interval(math.nan, math.nan, math.nan)
    point = iqm(x)
    if x.shape[0] < 2:
        return Interval(point, math.nan, math.nan)
    boot = stratified_resamples(x, reps, np.random.default_rng(seed))
    stats = sps.trim_mean(boot.reshape(reps, -1), IQM_CUT, axis=1)  # (reps,)
    lo, hi = (float(v) for v in np.quantile(stats, [alpha / 2, 1 - alpha / 2]))
    return Interval(point, lo, hi)


# ----------------------------------------------------------------------------------------------------------------
# two configurations: paired differences over seeds


def minimum_detectable_effect(sd: float, n: int, alpha: float = ALPHA, power: float = POWER) -> float:
    """The smallest true mean difference the two-sided paired t-test over ``n`` seeds detects with ``power`` at
    ``alpha``, taking ``sd`` (the SD of the per-seed differences) as the true one (statsmodels' ``TTestPower``):
    a difference inside ±MDE that the test misses is not evidence of no effect. nan below 2 seeds or without spread."""
    if n < 2 or not sd > 0:
        return math.nan
    return _standardised_mde(n, alpha, power) * sd


@functools.lru_cache(maxsize=256)
def _standardised_mde(n: int, alpha: float, power: float) -> float:
    """The MDE in SDs of the differences: it depends on (n, alpha, power) only (solved once each: solve_power
    iterates)."""
    from statsmodels.stats.power import TTestPower

    return float(TTestPower().solve_power(nobs=n, alpha=alpha, power=power, alternative="two-sided"))


@dataclass(frozen=True)
class SeedDiff:
    """A − B over paired seeds: ``diffs`` the per-seed differences (in seed order), ``diff`` their mean, ``lo``/``hi``
    the two-sided t interval at 1 − alpha, ``p`` the paired t-test's p, ``sd`` the SD of the differences (ddof 1)
    and ``mde`` the minimum detectable effect at this seed count. With fewer than 2 seeds, or no spread, no
    interval and no test: ``lo = hi = diff`` and ``p`` nan (a Holm family leaves it out)."""

    seeds: tuple[int, ...]
    diffs: tuple[float, ...]
    diff: float
    lo: float
    hi: float
    p: float
    sd: float
    mde: float


def paired_differences(
    d: np.ndarray | Sequence[float], alpha: float = ALPHA
) -> tuple[float, float, float, float, float]:
    """Mean, t interval (lo, hi), paired t-test p and SD of per-seed differences ``d`` (scipy's ``ttest_1samp``)."""
    x = np.asarray(d, dtype=np.float64)
    if x.size == 0:
        return (math.nan, math.nan, math.nan, math.nan, math.nan)
    mean = float(x.mean())
    if x.size < 2:  # one seed: a difference, no interval and no test
        return (mean, math.nan, math.nan, math.nan, math.nan)
    if np.ptp(x) == 0:  # every seed the same difference: the interval collapses to it, no test
        return (mean, mean, mean, math.nan, 0.0)
    res = sps.ttest_1samp(x, 0.0)
    ci = res.confidence_interval(1 - alpha)
    return (mean, float(ci.low), float(ci.high), float(res.pvalue), float(x.std(ddof=1)))


def paired_seeds(a: SeedValues, b: SeedValues, alpha: float = ALPHA) -> SeedDiff:
    """A − B over the seeds both configurations ran (a seed only one ran is left out)."""
    seeds = tuple(sorted(set(a) & set(b)))
    d = np.asarray([a[s] - b[s] for s in seeds], dtype=np.float64)
    return _seed_diff(seeds, d, alpha)


def _seed_diff(seeds: tuple[int, ...], d: np.ndarray, alpha: float) -> SeedDiff:
    mean, lo, hi, p, sd = paired_differences(d, alpha)
    return SeedDiff(
        seeds, tuple(float(v) for v in d), mean, lo, hi, p, sd, minimum_detectable_effect(sd, d.size, alpha)
    )


# ----------------------------------------------------------------------------------------------------------------
# the null check


def disjoint_halves(a: SeedValues, b: SeedValues) -> tuple[list[int], list[int]]:
    """Seeds for a null check of A against B on disjoint seeds. Over the seeds both ran (sorted; every seed of A when
    B is the same configuration), the first half goes to A and the next half to B, so the two never share a seed
    (an odd one out is dropped). Pseudo-pair i is (A at the i-th seed of the first half, B at the i-th of the
    second)."""
    common = sorted(set(a) & set(b))
    k = len(common) // 2
    return common[:k], common[k : 2 * k]


@dataclass(frozen=True)
class NullCheck:
    """The null check of one pair of same-algorithm configurations: the seeds each half used, the paired procedure's
    result on the pseudo-pairs, and whether it calls them not different (``passes``; None when it cannot be run:
    fewer than 2 pseudo-pairs, or no spread)."""

    seeds_a: tuple[int, ...]
    seeds_b: tuple[int, ...]
    result: SeedDiff
    passes: bool | None


Procedure = Callable[[np.ndarray, float], tuple[float, float, float, float, float]]


def null_check(
    a: SeedValues, b: SeedValues, alpha: float = ALPHA, procedure: Procedure = paired_differences
) -> NullCheck:
    """A against B on disjoint seeds (:func:`disjoint_halves`), with the verdicts' procedure (``procedure``: per-seed
    differences → mean, lo, hi, p, sd; default :func:`paired_differences`, the one :func:`paired_seeds` uses). It
    passes when the procedure does not reject at ``alpha``."""
    sa, sb = disjoint_halves(a, b)
    d = np.asarray([a[x] - b[y] for x, y in zip(sa, sb, strict=True)], dtype=np.float64)
    mean, lo, hi, p, sd = procedure(d, alpha)
    result = SeedDiff(
        tuple(sa), tuple(float(v) for v in d), mean, lo, hi, p, sd, minimum_detectable_effect(sd, d.size, alpha)
    )
    return NullCheck(tuple(sa), tuple(sb), result, None if math.isnan(p) else bool(p >= alpha))


__all__ = [
    "BOOTSTRAP_REPS",
    "IQM_CUT",
    "POWER",
    "Interval",
    "NullCheck",
    "SeedDiff",
    "SeedValues",
    "disjoint_halves",
    "holm",
    "iqm",
    "iqm_interval",
    "minimum_detectable_effect",
    "null_check",
    "paired_differences",
    "paired_seeds",
    "stratified_resamples",
]
