"""The GPU check's report (benchmarks/gpu/report.py) on a real ``orchestra finetune`` run directory of the tiny model:
every figure in the markdown is the one the run's CSVs hold, computed here independently; a run written before
``perf/train_seconds`` existed gets sampling + update seconds, said so."""

from __future__ import annotations

import csv
import json
import statistics
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.usefixtures("one_thread")


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory, duo_file: Path) -> Path:
    from orchestra.cli import main

    run = tmp_path_factory.mktemp("gpu-report") / "run"
    args = ["finetune", "--team", str(duo_file), "--model", "tiny", "--workers", "solver", "critic", "--stages", "2"]
    args += ["--batch-size", "2", "--group-size", "2", "--max-tokens", "3", "--eval-tasks", "2", "--quiet"]
    assert main([*args, "--out", str(run)]) == 0
    return run


def _sampler_run(tmp_path: Path, dtype: str) -> dict[str, Any]:
    """benchmarks/sampler.py's figures for a tiny model folder: batch 2, 4 new tokens."""
    from benchmarks.sampler import run
    from tests.test_backends import tiny_model, tiny_tokenizer

    folder = tmp_path / "tiny-model"
    tiny_model().save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    return run(str(folder), (2,), 4, "cpu", dtype, 0)


def test_the_report_quotes_the_run_directory(tiny_run: Path, tmp_path: Path) -> None:
    from benchmarks.gpu.report import main

    sampler = tmp_path / "sampler.json"  # what benchmarks/sampler.py --out writes, from a real run of it
    sampler.write_text(json.dumps(_sampler_run(tmp_path, "bfloat16")), encoding="utf-8")
    out = tmp_path / "gpu.md"
    assert main(["--run", str(tiny_run), "--sampler", str(sampler), "--stages-asked", "2", "--out", str(out)]) == 0
    md = out.read_text(encoding="utf-8")

    updates, stages = _rows(tiny_run / "updates.csv"), _rows(tiny_run / "stages.csv")
    cells = [
        (float(r[k]), float(r[k.replace("accepted", "optimizer_steps")]))
        for r in updates
        for k in r
        if k.startswith("agent/") and k.endswith("/accepted") and r[k] != ""
    ]
    assert len(cells) == 4  # 2 stages × solver and critic, each updated once per stage (teamtr)
    kept = sum(a > 0 for a, _ in cells)
    assert f"updates kept: {kept} of 4 ({kept / 4:.1%})" in md
    assert f"optimizer steps kept per update: {statistics.fmean(s for _, s in cells):.2f} of 1 " in md
    train = [float(r["perf/train_seconds"]) for r in stages]
    evals = [float(r["perf/eval_seconds"]) for r in stages]
    for t, e, r in zip(train, evals, stages, strict=True):
        assert t + e == pytest.approx(float(r["perf/stage_seconds"]), abs=1e-3)
    assert f"stage time without evaluation: {train[1]:.1f} s (target ≤ 20 s: met); first stage {train[0]:.1f} s" in md
    before, after = float(stages[0]["perf/team_success_start"]), float(stages[-1]["perf/team_success"])
    assert f"held-out success: {before:.1%} before training, {after:.1%} after 2 stages" in md
    fig = json.loads(sampler.read_text(encoding="utf-8"))["batches"]["2"]
    verdict = "met" if fig["ratio"] >= 0.8 else "not met"
    assert (
        f"sampler ratio against plain generate (bfloat16, batch 2): {fig['ratio']:.2f} (target ≥ 0.8: {verdict})" in md
    )
    rates = " | ".join(f"{fig[k]:.0f}" for k in ("orchestra_tok_s", "generate_tok_s"))
    assert f"| bfloat16 | 2 | 4 | {rates} | {fig['ratio']:.2f} | {fig['orchestra_stops_tok_s']:.0f} |" in md
    assert "2 stages completed of 2 asked" in md and "on 2 test tasks (greedy)" in md


def test_a_run_without_train_seconds_falls_back_to_sampling_and_updates(tiny_run: Path, tmp_path: Path) -> None:
    from benchmarks.gpu.report import run_figures, summary_lines

    old = tmp_path / "old"
    old.mkdir()
    for name in ("config.json", "updates.csv"):
        (old / name).write_bytes((tiny_run / name).read_bytes())
    stages = _rows(tiny_run / "stages.csv")
    keep = [k for k in stages[0] if k not in ("perf/train_seconds", "perf/eval_seconds")]
    with (old / "stages.csv").open("w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=keep, extrasaction="ignore")
        w.writeheader()
        w.writerows(stages)
    fig = run_figures(old)
    assert not fig.train_s_measured
    first = [r for r in _rows(old / "updates.csv") if float(r["rollout/stage"]) == 0]
    expect = sum(float(r["perf/sample_seconds"]) + float(r["perf/update_seconds"]) for r in first)
    assert fig.stages[0].train_s == pytest.approx(expect)
    assert "stages.csv has no perf/train_seconds" in "\n".join(summary_lines(fig, []))
