"""The report's statistics (orchestra.report.stats) against independent references: scipy's binomial
test, the Agresti–Min formula, simulated coverage, type-I error and power."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import binomtest
from scipy.stats import t as t_dist

from orchestra.report import stats


def _matched(
    n: int, p_win: float, p_loss: float, rng: np.random.Generator, base: float = 0.5
) -> tuple[np.ndarray, np.ndarray]:
    """Paired outcomes with P(conductor only) = p_win and P(baseline only) = p_loss."""
    u = rng.random(n)
    win, loss = u < p_win, (u >= p_win) & (u < p_win + p_loss)
    both = ~win & ~loss & (rng.random(n) < base)
    return win | both, loss | both


def test_mcnemar_exact_is_the_binomial_test_on_discordant_tasks() -> None:
    rng = np.random.default_rng(0)
    for _ in range(20):
        c, b = _matched(80, rng.uniform(0, 0.2), rng.uniform(0, 0.2), rng)
        m = stats.mcnemar_exact(c, b)
        assert m.wins == int(np.sum(c & ~b)) and m.losses == int(np.sum(~c & b))
        if m.wins + m.losses:
            assert m.p == pytest.approx(binomtest(m.wins, m.wins + m.losses, 0.5).pvalue)
    assert stats.mcnemar_exact([True, False], [True, False]).p == 1.0  # no discordant task
    assert stats.mcnemar_exact([False, True, False], [True, True, True]).p == pytest.approx(0.5)  # 0 of 2: 2 · 0.5²
    with pytest.raises(ValueError, match="paired"):
        stats.mcnemar_exact([True], [True, False])


def test_paired_success_is_the_agresti_min_interval() -> None:
    rng = np.random.default_rng(1)
    c, b = _matched(150, 0.15, 0.08, rng)
    r = stats.paired_success(c, b)
    n, n12, n21 = 150, int(np.sum(c & ~b)), int(np.sum(~c & b))
    p12, p21 = (n12 + 0.5) / (n + 2), (n21 + 0.5) / (n + 2)
    d = p12 - p21
    se = math.sqrt((p12 + p21 - d * d) / (n + 2))
    assert r.diff == pytest.approx((n12 - n21) / n)
    centre = (r.lo + r.hi) / 2
    assert centre == pytest.approx(d)
    # their variance, with the t quantile (n + 1 degrees of freedom) and n + 1 in place of n + 2
    assert (r.hi - r.lo) / 2 == pytest.approx(t_dist.ppf(0.975, n + 1) * se * math.sqrt((n + 2) / (n + 1)))
    assert (r.hi - r.lo) / 2 == pytest.approx(1.96 * se, rel=0.015)
    assert r.lo < r.ni_lower < r.diff < r.hi  # the one-sided bound is tighter than the two-sided one
    # no discordant task: still an interval, narrower as n grows
    w10 = stats.paired_success([True] * 10, [True] * 10)
    w200 = stats.paired_success([True] * 200, [True] * 200)
    assert w10.lo < 0 < w10.hi and w200.hi - w200.lo < (w10.hi - w10.lo) / 3
    assert w10.ni_p > 0.05 and w200.ni_p < 0.05, "ten agreeing tasks do not show non-inferiority; 200 do"


def test_paired_success_interval_has_nominal_coverage() -> None:
    rng = np.random.default_rng(2)
    covered, trials = 0, 600
    for _ in range(trials):
        c, b = _matched(100, 0.12, 0.06, rng)
        r = stats.paired_success(c, b)
        covered += r.lo <= 0.06 <= r.hi
    assert 0.92 <= covered / trials <= 0.98


def test_non_inferiority_keeps_its_level_at_the_margin_and_has_the_predicted_power() -> None:
    rng = np.random.default_rng(3)
    trials, n = 800, 150
    # true difference exactly at the margin: rejections are false claims of non-inferiority
    at_margin = sum(stats.paired_success(*_matched(n, 0.05, 0.10, rng)).ni_p < 0.05 for _ in range(trials))
    assert at_margin / trials <= 0.075
    # no true difference, 10% discordant tasks: power as statsmodels predicts
    hits = sum(stats.paired_success(*_matched(n, 0.05, 0.05, rng)).ni_p < 0.05 for _ in range(trials))
    assert hits / trials == pytest.approx(stats.noninferiority_power(n, 0.10), abs=0.07)


def test_sample_size_for_non_inferiority() -> None:
    n = stats.tasks_for_noninferiority(0.10)
    assert stats.noninferiority_power(n, 0.10) >= 0.8 > stats.noninferiority_power(n - 1, 0.10)
    assert (
        stats.tasks_for_noninferiority(0.05) < n < stats.tasks_for_noninferiority(0.20)
    )  # more disagreement, more tasks
    assert stats.tasks_for_noninferiority(0.10, diff=0.02) < n  # a true gain is easier to show
    with pytest.raises(ValueError, match="discordance"):
        stats.tasks_for_noninferiority(0.02, diff=0.05)


def test_paired_mean_and_ratio_intervals() -> None:
    rng = np.random.default_rng(4)
    base = rng.integers(20, 60, 120).astype(float)
    cost = 0.6 * base + rng.normal(0, 4, 120)
    point, lo, hi = stats.ratio_ci(cost, base, seed=1)
    assert point == pytest.approx(cost.mean() / base.mean()) and lo < point < hi < 0.7
    assert stats.ratio_ci(cost, base, seed=1) == (point, lo, hi)  # a seed fixes the resamples
    assert stats.ratio_ci([3.0, 3.0], [4.0, 4.0]) == (0.75, 0.75, 0.75)
    assert all(math.isnan(v) for v in stats.ratio_ci([1.0, 2.0], [0.0, 0.0]))
    m, mlo, mhi = stats.paired_mean(cost, base)
    assert m == pytest.approx((cost - base).mean()) and mlo < m < mhi
    assert stats.paired_mean([2.0, 3.0], [1.0, 2.0]) == (1.0, 1.0, 1.0)


def test_ratio_interval_has_roughly_nominal_coverage() -> None:
    rng = np.random.default_rng(5)
    covered, trials = 0, 150
    for i in range(trials):
        base = rng.exponential(40.0, 80) + 5
        cost = base * rng.uniform(0.3, 1.1, 80)  # true ratio of means: E[U] = 0.7
        _, lo, hi = stats.ratio_ci(cost, base, n_resamples=800, seed=i)
        covered += lo <= 0.7 <= hi
    assert 0.88 <= covered / trials <= 0.99


def test_holm() -> None:
    assert stats.holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    out = stats.holm([0.01, math.nan, 0.02])
    assert out[0] == pytest.approx(0.02) and math.isnan(out[1]) and out[2] == pytest.approx(0.02)
    assert stats.holm([]) == []


def test_oracle_router_headroom_and_captured_fraction() -> None:
    outcomes = {
        "tool_first": {"t1": (True, 1.0), "t2": (False, 1.0), "t3": (False, 1.0)},
        "solve_check": {"t1": (True, 3.0), "t2": (True, 3.0), "t3": (False, 3.0), "t4": (True, 3.0)},
        "best_of_3": {"t1": (True, 9.0), "t2": (True, 9.0), "t3": (True, 9.0)},
    }
    oracle = stats.oracle_router(outcomes)
    assert set(oracle) == {"t1", "t2", "t3"}, "t4 was not played by every schedule"
    assert oracle["t1"] == stats.OracleChoice("tool_first", True, 1.0)  # success first, then cost
    assert oracle["t2"].schedule == "solve_check" and oracle["t3"].schedule == "best_of_3"
    # success may be a share over runs: the highest share wins, then the cost
    shares = {"a": {"t": (0.5, 0.1)}, "b": {"t": (0.75, 2.0)}, "c": {"t": (0.75, 1.0)}}
    assert stats.oracle_router(shares)["t"] == stats.OracleChoice("c", 0.75, 1.0)
    assert stats.headroom(1.0, 0.6) == pytest.approx(0.4)
    assert stats.captured_fraction(0.7, 0.6, 1.0) == pytest.approx(0.25)
    assert stats.captured_fraction(0.5, 0.6, 1.0) < 0
    assert math.isnan(stats.captured_fraction(0.6, 0.6, 0.6))


def test_the_replicate_oracle_picks_on_one_run_and_is_scored_on_the_other() -> None:
    # two noisy replicates of the same two schedules: on each task a schedule's success is a coin the runs draw apart
    main = {"a": {"t1": (True, 1.0), "t2": (False, 1.0), "t3": (False, 1.0)},
            "b": {"t1": (False, 2.0), "t2": (True, 2.0), "t3": (False, 2.0)}}  # fmt: skip
    replicate = {"a": {"t1": (False, 1.0), "t2": (True, 1.0), "t3": (True, 1.0)},
                 "b": {"t1": (True, 2.0), "t2": (False, 2.0), "t3": (False, 2.0), "t9": (True, 2.0)}}  # fmt: skip
    in_sample = stats.oracle_router(main)
    assert sum(c.success for c in in_sample.values()) == 2  # t1 by a, t2 by b: the union of the draws
    rep = stats.replicate_oracle(replicate, main)
    assert set(rep) == {"t1", "t2", "t3"}, "t9 is not in the scored run"
    # picked on the replicate: t1 → b, t2 → a, t3 → a; scored on main, each pick failed there
    assert rep["t1"] == stats.OracleChoice("b", False, 2.0) and rep["t2"] == stats.OracleChoice("a", False, 1.0)
    assert sum(c.success for c in rep.values()) == 0  # the in-sample surplus here is all luck
    # a schedule that wins the same tasks in both runs keeps its wins: skill survives the replicate
    assert stats.replicate_oracle(main, main) == in_sample
    assert stats.replicate_oracle({}, main) == {} and stats.replicate_oracle({"c": {"t1": (True, 0.0)}}, main) == {}


def test_the_simple_router_fits_one_threshold_on_validation_and_is_scored_elsewhere() -> None:
    """Short prompts go to the cheap rule, long ones to the costly one: the stump finds that split, prefers the
    cheaper of equally good routers, and is scored on other tasks by what the rules it picks did there."""
    feats = {f"t{i}": {"numbers": float(n), "chars": float(40 + 7 * i)} for i, n in enumerate([2, 2, 3, 4, 4, 5])}
    fit = {
        "cheap": {t: (f["numbers"] <= 3, 1.0) for t, f in feats.items()},
        "costly": {t: (f["numbers"] >= 3, 4.0) for t, f in feats.items()},  # both solve the 3-number task
        "never": {t: (False, 0.5) for t in feats},
    }
    router = stats.fit_stump_router(fit, feats)
    # every task solved; the 3-number task goes to the cheap rule (the cheaper of two perfect routers)
    assert (router.low, router.high, router.fit_success) == ("cheap", "costly", 1.0)
    assert router.feature == "chars" or router.threshold == 3.0
    assert router.fit_cost == pytest.approx((3 * 1.0 + 3 * 4.0) / 6)
    assert "`cheap` if" in router.describe() and "else `costly`" in router.describe()
    # scored on other tasks: what the picked rule did there, not the best of the two
    test_feats = {"u1": {"numbers": 1.0, "chars": 30.0}, "u2": {"numbers": 6.0, "chars": 99.0}}
    test = {"cheap": {"u1": (False, 1.0), "u2": (True, 1.0)}, "costly": {"u1": (True, 4.0), "u2": (False, 4.0)}}
    picks = stats.route(router, test, test_feats)
    assert picks == {"u1": stats.OracleChoice("cheap", False, 1.0), "u2": stats.OracleChoice("costly", False, 4.0)}
    # one rule best everywhere: the router is that fixed schedule
    same = stats.fit_stump_router({"a": {"t1": (True, 1.0)}, "b": {"t1": (False, 1.0)}}, {"t1": {"numbers": 2.0}})
    assert same.low == same.high == "a" and same.describe() == "`a` everywhere"
    with pytest.raises(ValueError, match="no task"):
        stats.fit_stump_router({"a": {"t1": (True, 1.0)}}, {"t2": {"numbers": 1.0}})


def test_prompt_statistics_read_only_the_prompt() -> None:
    from orchestra.jobs.phase1_report import prompt_statistics

    got = prompt_statistics("Tom has 4.5 apples. He buys 16 more! How many now?")
    assert got == {"numbers": 2.0, "words": 11.0, "sentences": 3.0, "chars": 50.0}  # "4.5" is one number


def test_fqe_selection() -> None:
    measured = [0.1, 0.5, 0.3, 0.9]
    good = stats.fqe_selection([1.0, 2.0, 1.5, 3.0], measured)
    assert good.spearman == pytest.approx(1.0) and good.picked == 3 and good.regret == 0.0
    bad = stats.fqe_selection([4.0, 2.0, 3.0, 1.0], measured)
    assert bad.spearman == pytest.approx(-1.0) and bad.picked == 0 and bad.regret == pytest.approx(0.8)
    with pytest.raises(ValueError, match="2 policies"):
        stats.fqe_selection([1.0], [1.0])
    assert stats.mean_sd([1.0, 2.0, 3.0]) == (2.0, 1.0) and stats.mean_sd([4.0]) == (4.0, 0.0)
