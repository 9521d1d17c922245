"""Evaluation statistics: bootstrap CIs, paired verdicts against the best rule-based conductor, the
mode-collapse check and the report files, on hand-built episodes."""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from orchestra.report.evaluation import (
    best_rule_based,
    bootstrap_ci,
    evaluation_report,
    mode_collapse,
    paired_comparison,
    paired_row,
    sequence_entropy,
    summarize,
    verdict,
    write_report,
)
from policies import RULE_BASED
from trajectories import SCHEMA_VERSION, Action, ConductorRef, Episode, Message, Reward, Step, TaskRef, TeamRef

WORKERS = ("solver", "critic")
IDS = {"solver:solve": 0, "critic:check": 1, "submit": 2}


def make_ep(
    conductor: str,
    task: int,
    success: bool,
    *,
    turns: int = 2,
    tokens: int = 100,
    ret: float | None = None,
    family: str = "arith",
    seed: int | None = None,
    labels: Sequence[str] | None = None,
) -> Episode:
    """An episode of ``turns`` worker turns then submit (or the given ``labels``, ending in submit)."""
    labels = (
        list(labels)
        if labels is not None
        else [WORKERS[t % 2] + (":solve" if t % 2 == 0 else ":check") for t in range(turns)] + ["submit"]
    )
    steps = []
    for t, label in enumerate(labels):
        last = t == len(labels) - 1
        if label == "submit":
            action, message = Action(id=IDS[label], kind="submit"), None
        else:
            worker, instruction = label.split(":")
            action = Action(id=IDS[label], kind="worker", worker=worker, instruction=instruction)
            message = Message(worker, instruction, "x", [1], [-0.1], "m", "v1", "stop", 10, 1, False)
        steps.append(
            Step(t, {"transcript": []}, [0.0], [1, 1, 1], action, message, Reward({"success": 0.0}, 0.0), last, False)
        )
    return Episode(
        schema_version=SCHEMA_VERSION,
        episode_id=f"{family}-{conductor}-{task}",
        run_id="r",
        task=TaskRef(id=f"{family}-{task:05d}", family=family, split="test", seed=task, difficulty=1),
        team=TeamRef(name="duo", workers=list(WORKERS), model_ids={}, prompt_versions={}),
        conductor=ConductorRef(name=conductor, checkpoint=None if conductor in RULE_BASED else f"runs/{conductor}"),
        seed=1000 + task if seed is None else seed,
        steps=steps,
        return_=(1.0 if success else 0.0) if ret is None else ret,
        success=success,
        score=float(success),
        terminated=True,
        truncated=False,
        usage={"tokens": {"solver": tokens}},
    )


# ----------------------------------------------------------------------------- bootstrap


def test_bootstrap_ci_covers_the_true_mean_and_is_deterministic() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(3.0, 1.0, size=200)
    lo, hi = bootstrap_ci(x, seed=7)
    assert lo < 3.0 < hi
    assert 0.2 < hi - lo < 0.36  # ≈ 2 · 1.96 / sqrt(200) = 0.277
    assert bootstrap_ci(x, seed=7) == (lo, hi)
    assert bootstrap_ci(x, seed=8) != (lo, hi)
    assert bootstrap_ci([2.0, 2.0, 2.0]) == (2.0, 2.0)
    assert all(math.isnan(v) for v in bootstrap_ci([]))
    med_lo, med_hi = bootstrap_ci(x, stat=np.median, n_resamples=300, seed=1)
    assert med_lo < float(np.median(x)) < med_hi


def test_bootstrap_ci_has_roughly_nominal_coverage() -> None:
    rng = np.random.default_rng(1)
    covered = 0
    for i in range(200):
        lo, hi = bootstrap_ci(rng.exponential(1.0, size=60), n_resamples=500, seed=i)
        covered += lo <= 1.0 <= hi
    assert 0.85 <= covered / 200 <= 0.99


# ----------------------------------------------------------------------------- paired comparison


def _pairs(conductor: str, successes: Sequence[bool], **kw: object) -> list[Episode]:
    return [make_ep(conductor, i, s, **kw) for i, s in enumerate(successes)]  # type: ignore[arg-type]


BASE = [i % 2 == 0 for i in range(40)]  # 50% success
N = 160  # tasks in the verdict tests: enough for a non-inferiority verdict at −5 points
BIG = [i % 2 == 0 for i in range(N)]


def _costly(conductor: str, successes: Sequence[bool], turns: int, tokens: int) -> list[Episode]:
    """Episodes whose token counts vary by task (±20%), so cost ratios have a real interval."""
    return [
        make_ep(conductor, i, s, turns=turns, tokens=tokens + (i % 5 - 2) * tokens // 10)
        for i, s in enumerate(successes)
    ]


def test_verdicts_beats_better_worse_cheaper_non_inferior_and_no_difference() -> None:
    base = _costly("heuristic", BIG, turns=4, tokens=400)
    beats = _costly("bc", [s or i % 4 == 1 for i, s in enumerate(BIG)], turns=4, tokens=400)  # 75%
    better = _costly("fbc", [s or i % 40 == 1 for i, s in enumerate(BIG)], turns=4, tokens=400)  # +2.5 pts
    # same successes, 75% fewer turns, tokens 5% fewer on average but not task by task
    cheaper = [make_ep("cql", i, s, turns=1, tokens=380 + (i * 7 % 11 - 5) * 10) for i, s in enumerate(BIG)]
    worse = _costly("ppo", [s and i % 4 == 0 for i, s in enumerate(BIG)], turns=4, tokens=400)  # 25%
    same = _costly("dqn", BIG, turns=4, tokens=390)  # same successes, 2.5% fewer tokens
    # two losses in 50, no win: the case a "success CI contains 0" rule called cheaper
    few = [make_ep("bcq", i, s and i not in (0, 2), turns=1, tokens=100) for i, s in enumerate(BIG[:50])]
    rows = {
        r.conductor: r for r in paired_comparison(base + beats + better + cheaper + worse + same + few, n_resamples=500)
    }
    assert set(rows) == {"bc", "fbc", "cql", "ppo", "dqn", "bcq"}
    assert all(r.baseline == "heuristic" and not r.rule_based for r in rows.values())
    assert rows["bc"].verdict == "beats" and rows["bc"].success_diff == pytest.approx(0.25)
    assert rows["bc"].wins == 40 and rows["bc"].losses == 0 and rows["bc"].success_lo > 0
    assert rows["fbc"].wins == 4 and rows["fbc"].verdict in ("non-inferior", "no clear difference")  # 4 wins: p > α
    assert rows["cql"].verdict == "cheaper" and rows["cql"].turns_ratio == pytest.approx(0.25)
    assert rows["cql"].turns_ratio_lo == rows["cql"].turns_ratio_hi == pytest.approx(0.25)  # constant turns
    assert rows["cql"].tokens_ratio_lo < rows["cql"].tokens_ratio < rows["cql"].tokens_ratio_hi
    assert rows["cql"].success_lo < 0 < rows["cql"].success_hi, "no discordant task still leaves uncertainty"
    assert rows["ppo"].verdict == "worse" and rows["ppo"].success_hi < 0 and rows["ppo"].mcnemar_p_holm < 0.05
    assert rows["dqn"].verdict == "non-inferior" and rows["dqn"].tokens_ratio == pytest.approx(390 / 400, abs=0.01)
    assert rows["bcq"].n_pairs == 50 and (rows["bcq"].wins, rows["bcq"].losses) == (0, 2)
    assert rows["bcq"].mcnemar_p == pytest.approx(0.5) and rows["bcq"].ni_lower < -0.05
    assert rows["bcq"].verdict == "no clear difference", (
        "75% fewer turns does not make an unproven 4-point loss cheaper"
    )
    # Holm: adjusted p-values are never below the raw ones, and equal them for the smallest
    assert all(r.mcnemar_p_holm >= r.mcnemar_p - 1e-15 and r.ni_p_holm >= r.ni_p - 1e-15 for r in rows.values())


def test_holm_can_withdraw_a_verdict_that_one_comparison_alone_would_give() -> None:
    base = _costly("heuristic", BIG, turns=4, tokens=400)
    # 13 wins, 2 losses: McNemar p ≈ 0.007 alone
    lucky = [s or i in range(1, 27, 2) for i, s in enumerate(BIG)]
    lucky = [False if i in (0, 2) else v for i, v in enumerate(lucky)]
    alone = paired_row(_costly("bc", lucky, turns=4, tokens=400), base, n_resamples=200)
    assert (alone.wins, alone.losses) == (13, 2) and alone.mcnemar_p < 0.01 and alone.verdict == "beats"
    others = [_costly(f"c{k}", BIG, turns=4, tokens=400) for k in range(9)]  # nine identical twins of the baseline
    rows = {
        r.conductor: r
        for r in paired_comparison(base + _costly("bc", lucky, 4, 400) + sum(others, []), n_resamples=200)
    }
    assert rows["bc"].mcnemar_p == alone.mcnemar_p and rows["bc"].mcnemar_p_holm == pytest.approx(
        min(1.0, 10 * alone.mcnemar_p)
    )
    assert rows["bc"].verdict != "beats"


def test_verdict_rule_edges() -> None:
    assert verdict(0.04, 0.01, 0.01) == "better"  # significant but under 5 points
    assert verdict(0.05, 0.01, 0.01) == "beats"
    assert verdict(0.10, 0.06, 0.01) == "non-inferior"  # the difference is not significant
    assert verdict(-0.02, 0.02, 0.01) == "worse"
    assert verdict(0.0, 1.0, 0.01, 0.7, 0.9) == "cheaper"
    assert verdict(0.0, 1.0, 0.01, 0.7, 1.05) == "non-inferior", "a ratio whose interval reaches 1 is not cheaper"
    assert verdict(0.0, 1.0, 0.01, 0.8, 0.9) == "non-inferior", "under 25% lower"
    assert verdict(0.0, 1.0, 0.01, 1.0, 1.1, 0.75, 0.8) == "cheaper"  # tokens alone
    assert verdict(0.0, 1.0, 0.2, 0.1, 0.2, 0.1, 0.2) == "no clear difference", "cheap but not shown non-inferior"
    assert verdict(0.0, 1.0, 0.01, math.nan, math.nan) == "non-inferior"
    # a priced team: the price ratio counts like turns and tokens
    assert verdict(0.0, 1.0, 0.01, 1.0, 1.1, 1.0, 1.1, price_ratio=0.6, price_ratio_hi=0.9) == "cheaper"
    assert verdict(0.0, 1.0, 0.01, 1.0, 1.1, 1.0, 1.1, price_ratio=0.6, price_ratio_hi=1.2) == "non-inferior"
    assert verdict(math.nan, math.nan, math.nan) == "no paired tasks"


def test_best_rule_based_is_chosen_by_success_then_return() -> None:
    eps = (
        _pairs("pipeline", BASE, ret=0.5)
        + _pairs("heuristic", BASE, ret=0.8)
        + _pairs("round_robin", [i % 5 == 0 for i in range(40)], ret=2.0)
        + _pairs("bc", [True] * 40, ret=3.0)  # best overall, but learned: never the baseline
    )
    rows = summarize(eps, n_resamples=200)
    assert best_rule_based(rows) == {("arith", "duo"): "heuristic"}
    paired = paired_comparison(eps, rows, n_resamples=200)
    assert [p.conductor for p in paired] == ["bc", "pipeline", "round_robin"]  # learned first
    assert [p.rule_based for p in paired] == [False, True, True]


def test_pairs_are_matched_on_task_and_seed() -> None:
    base = _pairs("heuristic", [True, False, True])
    other = [make_ep("bc", 0, True), make_ep("bc", 1, True), make_ep("bc", 2, True, seed=5)]  # task 2: other seed
    row = paired_row(other, base, n_resamples=100)
    assert row.n_pairs == 2 and row.success_diff == pytest.approx(0.5) and (row.wins, row.losses) == (1, 0)
    assert paired_comparison(_pairs("bc", [True, False])) == []  # no rule-based conductor: nothing to compare


def test_summary_has_wilson_and_bootstrap_intervals() -> None:
    (row,) = summarize(_pairs("heuristic", BASE, turns=3, tokens=50), n_resamples=300)
    assert row.success_rate == 0.5 and row.ci_low < 0.5 < row.ci_high and row.rule_based
    assert (row.ci_low, row.ci_high) == pytest.approx((0.352, 0.648), abs=1e-3)  # Wilson, 20 of 40
    (none,) = summarize(_pairs("pipeline", [False] * 40), n_resamples=300)
    assert none.ci_low == 0.0 and none.ci_high == pytest.approx(0.0876, abs=1e-3), "0% still has an upper bound"
    assert row.turns_ci_low == row.turns_ci_high == 3.0 and row.tokens_ci_low == 50.0


# ----------------------------------------------------------------------------- mode collapse


def test_sequence_entropy() -> None:
    one = [("a", "submit")] * 10
    assert sequence_entropy(one) == (0.0, 1, 1.0, ("a", "submit"))
    for k in (2, 3, 4, 8):
        seqs = [(f"w{i}", "submit") for i in range(k)] * 5
        h, distinct, share, _ = sequence_entropy(seqs)
        assert h == pytest.approx(math.log2(k)) and distinct == k and share == pytest.approx(1 / k)


def test_mode_collapse_flags_one_dominant_schedule() -> None:
    pipe = [make_ep("pipeline", i, True, labels=["critic:check", "submit"]) for i in range(10)]
    bc = [make_ep("bc", i, True, labels=["solver:solve", "submit"]) for i in range(9)]
    bc.append(make_ep("bc", 9, True, labels=["solver:solve", "critic:check", "submit"]))
    varied = [make_ep("cql", i, True, turns=1 + i % 3) for i in range(9)]
    rows = {r.conductor: r for r in mode_collapse(pipe + bc + varied)}
    assert rows["pipeline"].collapsed and rows["pipeline"].rule_based and rows["pipeline"].entropy_bits == 0.0
    assert rows["bc"].collapsed and rows["bc"].top_share == pytest.approx(0.9) and rows["bc"].distinct == 2
    assert rows["bc"].top_sequence == "solver:solve → submit"
    assert not rows["cql"].collapsed and rows["cql"].entropy_bits == pytest.approx(math.log2(3))


# ----------------------------------------------------------------------------- report files


def test_evaluation_report_writes_every_file(tmp_path: Path) -> None:
    eps = (
        _pairs("heuristic", BIG, turns=4, tokens=400)
        + _pairs("pipeline", BIG, turns=2, tokens=200)
        + _pairs("bc", [True] * N, turns=2, tokens=150)
        + _pairs("heuristic", BIG, family="logic", turns=3)
        + _pairs("bc", BIG, family="logic", turns=1)
    )
    rows, paired, paths = evaluation_report(eps, tmp_path / "run", title="t", n_resamples=200)
    assert {"csv", "md", "png", "paired_csv", "collapse_csv", "cost_png"} <= set(paths)
    for key, p in paths.items():
        assert p.exists() and p.stat().st_size > 0, key
    for key in ("png", "cost_png"):
        assert paths[key].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = paths["md"].read_text()
    assert "## Paired comparison" in md and "## Mode collapse" in md and "beats" in md and "cheaper" in md
    with paths["paired_csv"].open() as f:
        got = {(r["family"], r["conductor"]): r["verdict"] for r in csv.DictReader(f)}
    assert got == {("arith", "bc"): "beats", ("arith", "pipeline"): "cheaper", ("logic", "bc"): "cheaper"}
    assert len(rows) == 5 and len(paired) == 3
    # the old call (rows only) still writes the main files
    old = write_report(rows, tmp_path / "old")
    assert all(old[k].exists() for k in ("csv", "md", "png"))


def test_hull_rules_read_the_menu_at_the_conductors_place() -> None:
    from orchestra.report.evaluation import hull_rules

    menu = {"cheap": (100.0, 0.40), "mid": (200.0, 0.55), "dear": (400.0, 0.60), "waste": (500.0, 0.50)}
    assert hull_rules(menu, 250.0, 0.58) == ("mid", "dear")  # best within its cost; cheapest at least as good
    assert hull_rules(menu, 90.0, 0.30) == ("cheap", "cheap")  # cheaper than every rule: the cheapest
    assert hull_rules(menu, 600.0, 0.70) == ("dear", "dear")  # better than every rule: the most successful
    with pytest.raises(ValueError, match="no rules"):
        hull_rules({}, 1.0, 0.5)


def test_above_the_hull_means_better_at_equal_cost_or_as_good_for_a_quarter_less() -> None:
    from orchestra.report.evaluation import above_hull, hull_comparison

    cheap = _costly("pipeline", BIG, turns=1, tokens=100)  # 50%
    dear = _costly("heuristic", [s or i % 4 == 1 for i, s in enumerate(BIG)], turns=4, tokens=400)  # 75%
    better = _costly("bc", [s or i % 4 in (1, 3) for i, s in enumerate(BIG)], turns=4, tokens=400)  # 100%, same cost
    frugal = _costly("fbc", [s or i % 4 == 1 for i, s in enumerate(BIG)], turns=2, tokens=200)  # 75% at half
    plain = _costly("dqn", BIG, turns=4, tokens=400)  # 50% at the dear rule's cost: below the hull
    eps = cheap + dear + better + frugal + plain
    rows = summarize(eps, n_resamples=200)
    paired = hull_comparison(eps, rows, {"duo": ["pipeline", "heuristic"]}, lambda r: r.mean_tokens, n_resamples=200)
    pairs = {(p.conductor, p.baseline) for p in paired}
    # dqn: the hull at its cost is heuristic, and the cheapest rule as good as it is pipeline
    assert pairs == {("bc", "heuristic"), ("fbc", "pipeline"), ("fbc", "heuristic"), ("dqn", "heuristic"),
                     ("dqn", "pipeline")}  # fmt: skip
    above = above_hull(paired)
    assert above == {("duo", "bc"): True, ("duo", "fbc"): True, ("duo", "dqn"): False}
