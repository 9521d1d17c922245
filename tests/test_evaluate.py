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
        conductor=ConductorRef(name=conductor),
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


def test_verdicts_beats_cheaper_worse_and_no_difference() -> None:
    base = _pairs("heuristic", BASE, turns=4, tokens=400)
    better = _pairs("bc", [s or i % 4 == 1 for i, s in enumerate(BASE)], turns=4, tokens=400)  # 75%
    cheaper = _pairs("cql", BASE, turns=1, tokens=380)  # same successes, 75% fewer turns
    worse = _pairs("ppo", [s and i % 4 == 0 for i, s in enumerate(BASE)], turns=4, tokens=400)  # 25%
    same = _pairs("dqn", BASE, turns=4, tokens=390)
    rows = {r.conductor: r for r in paired_comparison(base + better + cheaper + worse + same, n_resamples=500)}
    assert set(rows) == {"bc", "cql", "ppo", "dqn"}
    assert all(r.baseline == "heuristic" and r.n_pairs == 40 and not r.rule_based for r in rows.values())
    assert rows["bc"].verdict == "beats" and rows["bc"].success_diff == pytest.approx(0.25)
    assert rows["bc"].success_lo > 0
    assert rows["cql"].verdict == "cheaper"
    assert rows["cql"].turns_rel == pytest.approx(-0.75) and rows["cql"].tokens_rel == pytest.approx(-0.05)
    assert rows["cql"].success_lo == rows["cql"].success_hi == 0.0
    assert rows["ppo"].verdict == "worse" and rows["ppo"].success_hi < 0
    assert rows["dqn"].verdict == "no clear difference"
    assert rows["dqn"].tokens_diff == pytest.approx(-10.0) and rows["dqn"].turns_diff == 0.0


def test_verdict_rule_edges() -> None:
    assert verdict(0.04, 0.01, 0.08, 0.0, 0.0) == "no clear difference"  # significant but under 5 points
    assert verdict(0.05, 0.01, 0.09, 0.0, 0.0) == "beats"
    assert verdict(0.10, 0.0, 0.2, 0.0, 0.0) == "no clear difference"  # the CI touches 0
    assert verdict(0.10, 0.0, 0.2, -0.3, 0.0) == "cheaper"
    assert verdict(0.0, -0.1, 0.1, -0.2, -0.25) == "cheaper"
    assert verdict(0.0, -0.1, 0.1, -0.2, math.nan) == "no clear difference"
    assert verdict(-0.2, -0.3, -0.01, -0.9, -0.9) == "worse"


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
    assert row.n_pairs == 2 and row.success_diff == pytest.approx(0.5)
    assert paired_comparison(_pairs("bc", [True, False])) == []  # no rule-based conductor: nothing to compare


def test_summary_has_bootstrap_and_wilson_intervals() -> None:
    (row,) = summarize(_pairs("heuristic", BASE, turns=3, tokens=50), n_resamples=300)
    assert row.success_rate == 0.5 and row.ci_low < 0.5 < row.ci_high
    assert row.wilson_low < 0.5 < row.wilson_high and row.rule_based
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
        _pairs("heuristic", BASE, turns=4, tokens=400)
        + _pairs("pipeline", BASE, turns=2, tokens=200)
        + _pairs("bc", [True] * 40, turns=2, tokens=150)
        + _pairs("heuristic", BASE, family="logic", turns=3)
        + _pairs("bc", BASE, family="logic", turns=1)
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
