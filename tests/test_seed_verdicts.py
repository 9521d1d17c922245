"""Verdicts over seeds (issue 34 item 4): the seed-level statistics on hand-made data, the null check's calibration
on synthetic draws (false positives ≈ α for the same algorithm, a real shift detected), the primary family's Holm,
and the refusal when the null check fails."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as sps

from orchestra.experiments.verdicts import null_pair, null_status, seed_tables, verdict_findings, verdict_section
from orchestra.report.seeds import (
    disjoint_halves,
    iqm,
    iqm_interval,
    minimum_detectable_effect,
    null_check,
    paired_differences,
    paired_seeds,
    stratified_resamples,
)

# ----------------------------------------------------------------------------------------------------------------
# the statistics, by hand


def test_paired_seeds_by_hand() -> None:
    # per-seed differences 1, 1, 3 (seed 3 ran under A only: left out)
    d = paired_seeds({0: 1.0, 1: 2.0, 2: 4.0, 3: 9.0}, {0: 0.0, 1: 1.0, 2: 1.0})
    assert d.seeds == (0, 1, 2) and d.diffs == (1.0, 1.0, 3.0)
    assert d.diff == pytest.approx(5 / 3)
    sd = math.sqrt(4 / 3)  # ((−2/3)² + (−2/3)² + (4/3)²) / 2
    assert d.sd == pytest.approx(sd)
    t = (5 / 3) / (sd / math.sqrt(3))  # = 2.5; Student t with 2 df: F(t) = 1/2 + t / (2 √(t² + 2))
    assert t == pytest.approx(2.5)
    assert d.p == pytest.approx(2 * (0.5 - t / (2 * math.sqrt(t * t + 2))))  # 0.12961
    half = 4.302652729911275 * sd / math.sqrt(3)  # t_{0.975, 2}
    assert (d.lo, d.hi) == (pytest.approx(5 / 3 - half), pytest.approx(5 / 3 + half))
    # no spread, or a single seed: no interval, no test
    flat = paired_seeds({0: 2.0, 1: 3.0}, {0: 1.0, 1: 2.0})
    assert flat.diff == 1.0 and flat.lo == flat.hi == 1.0 and math.isnan(flat.p) and math.isnan(flat.mde)
    one = paired_differences([0.3])  # one seed: the difference, no interval, no test
    assert one[0] == 0.3 and all(math.isnan(v) for v in one[1:])


def test_minimum_detectable_effect_has_the_stated_power() -> None:
    # independent of statsmodels: the two-sided t-test's power from the noncentral t, at the MDE
    for n, sd in ((8, 2.0), (12, 0.05), (3, 1.0)):
        mde = minimum_detectable_effect(sd, n)
        crit = sps.t.ppf(0.975, n - 1)
        nc = mde / sd * math.sqrt(n)
        power = sps.nct.sf(crit, n - 1, nc) + sps.nct.cdf(-crit, n - 1, nc)
        assert power == pytest.approx(0.8, abs=1e-4)
    assert minimum_detectable_effect(1.0, 16) < minimum_detectable_effect(1.0, 8)  # more seeds, smaller effects
    assert math.isnan(minimum_detectable_effect(0.0, 8)) and math.isnan(minimum_detectable_effect(1.0, 1))


def test_iqm_and_its_stratified_bootstrap() -> None:
    # 8 runs: the 2 lowest and the 2 highest are trimmed, the mean of 3 4 5 6 is left
    assert iqm(np.array([1, 2, 3, 4, 100, 5, 6, 7], dtype=float).reshape(-1, 1)) == pytest.approx(4.5)
    assert iqm(np.array([[0.0], [1.0], [5.0]])) == pytest.approx(2.0)  # 3 runs: nothing trimmed
    # stratified: each task's column draws only from that task's own runs
    scores = np.array([[1.0, 10.0], [2.0, 20.0], [3.0, 30.0]])  # (runs, tasks)
    boot = stratified_resamples(scores, 500, np.random.default_rng(0))
    assert boot.shape == (500, 3, 2)
    assert set(np.unique(boot[:, :, 0])) == {1.0, 2.0, 3.0} and set(np.unique(boot[:, :, 1])) == {10.0, 20.0, 30.0}
    # the percentile interval is the quantiles of the resampled IQMs (the same generator, drawn by hand)
    x = np.array([0.2, 0.5, 0.1, 0.9, 0.4, 0.45, 0.3, 0.6])
    ci = iqm_interval(x, reps=400, seed=3)
    rng = np.random.default_rng(3)
    idx = rng.integers(0, 8, size=(400, 8, 1))
    by_hand = [sps.trim_mean(x[i[:, 0]], 0.25) for i in idx]
    assert ci.point == pytest.approx(sps.trim_mean(x, 0.25))
    assert (ci.lo, ci.hi) == (pytest.approx(np.quantile(by_hand, 0.025)), pytest.approx(np.quantile(by_hand, 0.975)))
    assert ci.lo < ci.point < ci.hi
    same = iqm_interval([0.7, 0.7, 0.7, 0.7])
    assert same.point == same.lo == same.hi == pytest.approx(0.7)
    one = iqm_interval([0.3])  # one run: its score, no interval
    assert one.point == 0.3 and math.isnan(one.lo) and math.isnan(one.hi)


# ----------------------------------------------------------------------------------------------------------------
# the null check


def test_disjoint_halves() -> None:
    seeds = {s: 0.0 for s in range(7)}
    a, b = disjoint_halves(seeds, seeds)  # one scheme twice: 3 + 3 seeds, the odd one dropped
    assert (a, b) == ([0, 1, 2], [3, 4, 5]) and not set(a) & set(b)
    a, b = disjoint_halves({s: 0.0 for s in range(8)}, {s: 1.0 for s in range(2, 10)})  # two schemes, common seeds
    assert (a, b) == ([2, 3, 4], [5, 6, 7])


def test_null_check_false_positive_rate_is_alpha_and_a_shift_is_detected() -> None:
    rng = np.random.default_rng(0)
    draws = 4000
    rejected = 0
    for _ in range(draws):  # the same algorithm: one seed-level distribution (with a run-to-run SD of 0.1)
        v = rng.normal(0.5, 0.1, size=16)
        check = null_check(dict(enumerate(v)), dict(enumerate(v)))  # one scheme twice: 8 seeds against 8
        assert check.passes is not None and len(check.result.diffs) == 8
        rejected += not check.passes
    rate = rejected / draws
    assert abs(rate - 0.05) < 0.012, rate  # binomial SE 0.0034 at 4000 draws: about 3.5 SE
    # a real shift of 3 run SDs, 12 seeds each: 6 pseudo-pairs whose differences have SD 0.1·√2. Detected at the
    # t-test's power (noncentral t, computed here), about 0.97
    crit, nc = sps.t.ppf(0.975, 5), 0.3 / (0.1 * math.sqrt(2)) * math.sqrt(6)
    power = sps.nct.sf(crit, 5, nc) + sps.nct.cdf(-crit, 5, nc)
    caught = 0
    for _ in range(400):
        a = dict(enumerate(rng.normal(0.5, 0.1, size=12)))
        b = dict(enumerate(rng.normal(0.8, 0.1, size=12)))
        caught += null_check(a, b).passes is False
    assert power > 0.9 and abs(caught / 400 - power) < 0.04, (caught, power)


def test_null_check_catches_a_procedure_that_ignores_run_to_run_variance() -> None:
    """Tasks as the unit (each run's task outcomes pooled, the run effect ignored) calls the same algorithm different
    far more often than α; the seed-level procedure does not."""
    rng = np.random.default_rng(1)

    def per_task(d: np.ndarray, alpha: float) -> tuple[float, float, float, float, float]:
        # each pseudo-pair difference stands for 50 task-level differences around it: n inflated 50×
        tasks = np.repeat(d, 50) + rng.normal(0, 0.01, size=d.size * 50)
        res = sps.ttest_1samp(tasks, 0.0)
        ci = res.confidence_interval(1 - alpha)
        return float(tasks.mean()), float(ci.low), float(ci.high), float(res.pvalue), float(tasks.std(ddof=1))

    wrong = right = 0
    for _ in range(300):
        v = dict(enumerate(rng.normal(0.5, 0.1, size=8)))
        wrong += null_check(v, v, procedure=per_task).passes is False
        right += null_check(v, v).passes is False
    assert wrong / 300 > 0.5 and right / 300 < 0.12


# ----------------------------------------------------------------------------------------------------------------
# the tables and the section


def _readings(shift: float, null_gap: float = 0.0, seeds: int = 8) -> dict[str, dict[str, dict[int, float]]]:
    rng = np.random.default_rng(4)
    init = rng.normal(0, 0.1, size=seeds)  # the seed's initial team: shared by every scheme (paired)
    noise = {c: rng.normal(0, 0.01, size=seeds) for c in ("teamtr", "naive", "stale_indep", "happo")}
    base = {"teamtr": shift, "naive": 0.0, "stale_indep": 0.0, "happo": 0.0}
    one = {c: {s: 0.5 + init[s] + base[c] + noise[c][s] for s in range(seeds)} for c in base}
    # naive's second half of seeds moved by null_gap: a null check that must fail
    one["naive"] = {s: v + (null_gap if s >= seeds // 2 else 0.0) for s, v in one["naive"].items()}
    return {"equal_stages": one, "equal_episodes": {c: dict(v) for c, v in one.items()}}


def test_seed_tables_primary_family_holm_and_secondary() -> None:
    readings = _readings(shift=0.05)
    readings["equal_episodes"]["naive"] = {s: v + 0.01 for s, v in readings["equal_episodes"]["naive"].items()}
    tables = seed_tables(readings)
    rows = {(r["accounting"], r["vs"]): r for r in tables["seed_verdicts"]}
    assert {r["family"] for r in tables["seed_verdicts"] if r["vs"] in ("naive", "stale_indep")} == {"primary"}
    assert rows[("equal_stages", "happo")]["family"] == "secondary"
    assert math.isnan(rows[("equal_stages", "happo")]["p_holm"])
    # stale_indep reads alike at both accountings: one test, counted once; naive differs: two tests → a family of 3
    assert rows[("equal_episodes", "stale_indep")]["same_as"] == "equal_stages"
    fam = [rows[("equal_stages", "naive")], rows[("equal_stages", "stale_indep")], rows[("equal_episodes", "naive")]]
    p = sorted(r["p"] for r in fam)
    holm_by_hand = np.maximum.accumulate([3 * p[0], 2 * p[1], p[2]]).clip(max=1)
    assert sorted(r["p_holm"] for r in fam) == pytest.approx(list(holm_by_hand))
    assert rows[("equal_episodes", "stale_indep")]["p_holm"] == rows[("equal_stages", "stale_indep")]["p_holm"]
    d = [readings["equal_stages"]["teamtr"][s] - readings["equal_stages"]["naive"][s] for s in range(8)]
    assert rows[("equal_stages", "naive")]["diff"] == pytest.approx(np.mean(d))
    assert rows[("equal_stages", "naive")]["verdict"] == "teamtr better"  # +0.05 with a paired SD of about 0.014
    assert null_status(tables["null_check"]) == "passes"
    null = tables["null_check"][0]
    assert (null["a"], null["b"], null["seeds_a"], null["seeds_b"]) == ("naive", "naive", "0 1 2 3", "4 5 6 7")
    iqms = {(r["accounting"], r["configuration"]): r for r in tables["seed_iqm"]}
    teamtr = [readings["equal_stages"]["teamtr"][s] for s in range(8)]
    assert iqms[("equal_stages", "teamtr")]["iqm"] == pytest.approx(sps.trim_mean(teamtr, 0.25))
    text = "\n".join(verdict_section(tables, lambda v: f"{v:+.3f}", "its J", str))
    assert "**Null check: passes.**" in text and "**Primary family**" in text and "Holm over the 3 distinct" in text
    assert "Secondary comparisons** (exploratory: p uncorrected" in text and "refused" not in text


def test_a_failing_null_check_refuses_the_verdicts() -> None:
    tables = seed_tables(_readings(shift=0.05, null_gap=0.6))
    assert null_status(tables["null_check"]) == "FAILS"
    assert {r["verdict"] for r in tables["seed_verdicts"]} == {"refused"}
    text = "\n".join(verdict_section(tables, lambda v: f"{v:+.3f}", "its J", str))
    assert "**Null check: FAILS.**" in text and "**Verdicts refused: the null check FAILS.**" in text


def test_one_seed_gives_differences_and_no_verdict() -> None:
    """A run stopped after seed 0: every comparison is a difference with no interval and no test, and the findings
    say so in one sentence that quotes each difference from the table (no interval of zero width)."""
    from orchestra.report.findings import check_findings, findings_section

    one = {acc: {c: {0: by[c][0]} for c in by} for acc, by in _readings(shift=0.05).items()}
    tables = seed_tables(one)
    assert {r["verdict"] for r in tables["seed_verdicts"]} == {"not testable"}
    assert all(math.isnan(r["lo"]) and math.isnan(r["hi"]) for r in tables["seed_verdicts"])
    assert all(math.isnan(r["lo"]) for r in tables["seed_iqm"])
    fmt = lambda v: "—" if math.isnan(v) else f"{v:+.3f}"  # noqa: E731
    found = verdict_findings(tables, fmt, str)
    (untestable,) = [f for f in found if "not testable" in f.text]
    assert untestable.text.startswith("not testable over 1 seed (") and "so no verdict" in untestable.text
    assert len(untestable.cites) == len([r for r in tables["seed_verdicts"] if not r["same_as"]])
    page = "\n".join(["# p", "", *findings_section(found), *verdict_section(tables, fmt, "its J", str)])
    assert check_findings(page, found) == [] and "| [—, —] |" in page


def test_null_pair_prefers_naive_and_joint_indep() -> None:
    r = _readings(shift=0.0)
    assert null_pair(r) == ("naive", "naive")
    for by in r.values():
        by["joint_indep"] = dict(by["naive"])
    assert null_pair(r) == ("naive", "joint_indep")
    few = _readings(shift=0.0, seeds=3)  # 3 seeds: no configuration can be halved into 2 pseudo-pairs
    tables = seed_tables(few)
    assert null_status(tables["null_check"]) == "not run"
    assert "the verdicts below are unchecked" in "\n".join(verdict_section(tables, str, "its J", str))


# ----------------------------------------------------------------------------------------------------------------
# both experiments' analyses feed the section from their runs


def test_llm_analysis_scores_each_run_by_its_held_out_success(tmp_path: Path) -> None:
    from orchestra.experiments.llm.analysis import analyse
    from orchestra.experiments.llm.config import LLMExperimentConfig
    from orchestra.experiments.llm.report import summary_sections
    from tests.test_experiment_llm import _rows

    cfg = replace(LLMExperimentConfig(), schemes=("teamtr", "naive"), eval_tasks=20, seeds=8)
    rng = np.random.default_rng(5)
    frozen = np.repeat((rng.random((1, 20)) < 0.3).astype(float), 8, axis=0)
    teamtr = (rng.random((8, 20)) < 0.5).astype(float)
    naive = (rng.random((8, 20)) < 0.4).astype(float)
    tables = analyse(cfg, _rows(cfg, {"frozen": frozen, "teamtr": teamtr, "naive": naive}), tmp_path)
    row = next(r for r in tables["seed_verdicts"] if r["accounting"] == "equal_stages" and r["vs"] == "naive")
    d = teamtr.mean(axis=1) - naive.mean(axis=1)  # one score per run: its share of the 20 tasks solved
    assert row["family"] == "primary" and row["seeds"] == 8 and row["diff"] == pytest.approx(d.mean())
    assert row["p"] == pytest.approx(sps.ttest_1samp(d, 0.0).pvalue)
    null = tables["null_check"][0]
    halves = naive.mean(axis=1)
    assert (null["a"], null["b"]) == ("naive", "naive")
    assert null["diff"] == pytest.approx((halves[:4] - halves[4:]).mean())
    sections = summary_sections(cfg, tables, 0.0)
    assert (
        "## Verdicts over seeds" in sections["seeds"] and "(task level: descriptive only)" in sections["vs_frozen"][0]
    )
    reading = "\n".join(sections["reading"])
    assert "Null check over seeds (naive against itself on disjoint seeds)" in reading
    assert "Every sentence below is task level and descriptive only" in reading


def test_chain_analysis_reads_j_at_the_largest_n(tmp_path: Path) -> None:
    from orchestra.experiments.chain.analysis import analyse
    from orchestra.experiments.chain.config import ChainExperimentConfig
    from orchestra.experiments.chain.report import summary_sections
    from orchestra.experiments.chain.run import RUN_FIELDS

    cfg = ChainExperimentConfig.smoke(ns=(2, 3), schemes=("teamtr", "naive", "stale_indep"), seeds=8)
    rng = np.random.default_rng(6)
    final_j = {(n, sc, s): float(rng.uniform(0.3, 0.7)) for n in cfg.ns for sc in cfg.schemes for s in range(8)}
    rows = []
    for (n, scheme, seed), j in final_j.items():
        last = cfg.stages_for(scheme, n)
        for stage in range(last + 1):
            row = {k: 0 for k in RUN_FIELDS} | dict(n=n, scheme=scheme, seed=seed, stage=stage)
            per_stage = n * cfg.batch_size if scheme in ("teamtr", "stale_indep") else cfg.batch_size
            row |= dict(J=j * stage / last, episodes=stage * per_stage, kl_max_ratio=math.nan)
            row |= dict(drift_b=0.01, drift_d=0.01, stale_gap=0.0, certificate=math.nan)
            rows.append(row)
    tables = analyse(cfg, rows)
    got = {(r["accounting"], r["vs"]): r for r in tables["seed_verdicts"]}
    # naive runs 3 × 2 stages at n = 3: equal stages read it at stage 2 (a third of its final J), equal episodes at 6
    d = [final_j[(3, "teamtr", s)] - final_j[(3, "naive", s)] / 3 for s in range(8)]
    assert got[("equal_stages", "naive")]["diff"] == pytest.approx(np.mean(d))
    assert got[("equal_stages", "stale_indep")]["family"] == "primary"
    d_eps = [final_j[(3, "teamtr", s)] - final_j[(3, "naive", s)] for s in range(8)]
    assert got[("equal_episodes", "naive")]["diff"] == pytest.approx(np.mean(d_eps))
    assert got[("equal_episodes", "stale_indep")]["same_as"] == "equal_stages"  # read at the same stage: one test
    text = "\n".join(summary_sections(cfg, tables, 0.0)["seeds"])
    assert "## Verdicts over seeds" in text and "its exact J at n = 3" in text and "Holm over the 3 distinct" in text
