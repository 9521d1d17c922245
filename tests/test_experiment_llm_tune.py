"""``orchestra experiment llm-tune``: one protocol for every scheme (the same validation runs per learning rate, the
rule applied alike), the mechanism's figures per learning rate, the choice as flags the experiment accepts, resume,
bad input, the CLI."""

from __future__ import annotations

import csv
import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from orchestra.experiments.llm.config import TUNING_DELTA, LLMExperimentConfig
from orchestra.experiments.llm.tune import LLMTuneConfig, choose, lr_dir, run_llm_tuning, tuning_base

pytestmark = pytest.mark.usefixtures("one_thread")


def _csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def test_choose_takes_the_best_validation_success_and_the_smaller_lr_on_a_tie() -> None:
    table = [
        dict(scheme="teamtr", lr=1e-4, val_success=0.30),
        dict(scheme="teamtr", lr=3e-4, val_success=0.35),
        dict(scheme="teamtr", lr=1e-3, val_success=0.35),
        dict(scheme="naive", lr=1e-4, val_success=0.40),
        dict(scheme="naive", lr=3e-4, val_success=0.20),
        dict(scheme="stale_indep", lr=1e-4, val_success=0.40),
        dict(scheme="stale_indep", lr=3e-4, val_success=math.nan),  # a run not finished: no choice yet
    ]
    assert choose(table, ("teamtr", "naive", "stale_indep")) == {"teamtr": 3e-4, "naive": 1e-4}


def test_the_tuning_base_is_the_experiment_on_validation_at_equal_episodes() -> None:
    base, experiment = tuning_base(), LLMExperimentConfig()
    assert base.eval_split == "validation" and base.team == experiment.team
    # the grid ran at δ = 0.005 (its published tables stay regenerable); the comparison's δ is set so it binds
    assert base.trainer.delta == TUNING_DELTA != experiment.trainer.delta
    assert replace(base.trainer, num_stages=experiment.trainer.num_stages, delta=experiment.trainer.delta) == (
        experiment.trainer
    )
    assert base.episode_stage("naive") == 2 * base.episode_stage("teamtr")  # the same episodes for every scheme
    assert lr_dir(1e-4) == "lr-1e-4" and lr_dir(3e-4) == "lr-3e-4" and lr_dir(1e-3) == "lr-1e-3"
    with pytest.raises(ValueError, match="validation"):
        LLMTuneConfig(experiment=replace(base, eval_split="test"))
    with pytest.raises(ValueError, match="lr_by_scheme"):
        LLMTuneConfig(experiment=replace(base, lr_by_scheme=("naive=1e-3",)))
    for lrs in ((), (1e-3, 1e-3), (0.0,)):
        with pytest.raises(ValueError, match="lrs"):
            LLMTuneConfig(lrs=lrs)


def test_smoke_tuning_runs_every_scheme_at_every_lr_and_writes_a_choice_the_experiment_takes(tmp_path: Path) -> None:
    cfg = LLMTuneConfig.smoke()
    out = tmp_path / "tune"
    result = run_llm_tuning(cfg, out, say=lambda _: None)
    rows = _csv(out / "tuning.csv")
    assert {(r["scheme"], float(r["lr"])) for r in rows} == {(s, lr) for s in cfg.experiment.schemes for lr in cfg.lrs}
    for lr in cfg.lrs:
        for scheme in cfg.experiment.schemes:  # every scheme trained at that lr, for the same episodes
            run = json.loads((out / lr_dir(lr) / "runs" / f"{scheme}-seed0" / "config.json").read_text())["trainer"]
            assert run["lr"] == lr and run["num_stages"] == cfg.experiment.episode_stage(scheme)
        evals = _csv(out / lr_dir(lr) / "evals.csv")
        for r in (r for r in rows if float(r["lr"]) == lr):  # the score is the mean of that run's evaluation
            got = [
                float(e["success"]) for e in evals if e["scheme"] == r["scheme"] and int(e["stage"]) == int(r["stage"])
            ]
            assert len(got) == cfg.experiment.eval_tasks and float(r["val_success"]) == pytest.approx(
                sum(got) / len(got)
            )
            assert float(r["steps_per_update"]) > 1  # 2 epochs × 2 minibatches
    selection = json.loads((out / "selection.json").read_text())
    chosen = {r["scheme"]: float(r["lr"]) for r in rows if r["chosen"] == "True"}
    assert chosen == choose(
        [{**r, "lr": float(r["lr"]), "val_success": float(r["val_success"])} for r in rows], cfg.experiment.schemes
    )
    assert set(chosen) == set(cfg.experiment.schemes)
    # the flags run the experiment with the choice
    tuned = replace(LLMExperimentConfig(), lr_by_scheme=tuple(selection["lr_by_scheme"]))
    assert {s: tuned.trainer_config(s, 0).lr for s in chosen} == chosen
    assert "Rule, fixed before the runs" in result.summary.read_text()
    frozen = [float(e["success"]) for e in _csv(out / lr_dir(cfg.lrs[0]) / "evals.csv") if e["scheme"] == "frozen"]
    assert (
        f"reference every score below is read against: {sum(frozen) / len(frozen):.1%}." in result.summary.read_text()
    )
    # resume: a second run plays nothing and tabulates the same
    before = (out / "tuning.csv").read_text()
    run_llm_tuning(cfg, out, say=lambda _: None)
    assert (out / "tuning.csv").read_text() == before
    # another grid in the same directory is refused
    with pytest.raises(ValueError, match="lrs"):
        run_llm_tuning(replace(cfg, lrs=(1e-2,)), out, say=lambda _: None)


def test_cli_llm_tune_smoke_writes_the_report_and_its_tables(tmp_path: Path) -> None:
    from orchestra.cli import main

    report = tmp_path / "docs" / "tuning.md"
    rc = main(
        [
            "experiment",
            "llm-tune",
            "--smoke",
            "--lrs",
            "0.01",
            "--out",
            str(tmp_path / "t"),
            "--report",
            str(report),
            "--quiet",
            "--threads",
            "1",
        ]
    )
    assert rc == 0 and report.read_text().startswith("# Choosing the real-LLM experiment's learning rate")
    assert json.loads((tmp_path / "docs" / "tuning_selection.json").read_text())["lr_by_scheme"] == [
        "teamtr=0.01",
        "naive=0.01",
    ]
    assert len(_csv(tmp_path / "docs" / "tuning.csv")) == 2
    # the published tables (no checkpoints) give the same table with --report-only, as on a fresh clone
    tables = tmp_path / "tables"
    assert (
        main(
            [
                "experiment",
                "llm-tune",
                "--smoke",
                "--lrs",
                "0.01",
                "--out",
                str(tmp_path / "t"),
                "--quiet",
                "--report-only",
                "--tables",
                str(tables),
            ]
        )
        == 0
    )
    assert not list(tables.rglob("checkpoints"))
    rc = main(["experiment", "llm-tune", "--smoke", "--lrs", "0.01", "--out", str(tables), "--quiet", "--report-only"])
    assert rc == 0 and (tables / "tuning.csv").read_text() == (tmp_path / "t" / "tuning.csv").read_text()
    assert "mechanism columns are blank" not in (tables / "summary.md").read_text()
    # tables without the per-update files (an older publication): the evaluations still choose; the page says why
    # its mechanism columns are blank instead of printing dashes unexplained
    for updates in tables.rglob("updates.csv"):
        updates.unlink()
    rc = main(["experiment", "llm-tune", "--smoke", "--lrs", "0.01", "--out", str(tables), "--quiet", "--report-only"])
    text = (tables / "summary.md").read_text()
    assert rc == 0 and "The mechanism columns are blank for every run" in text and "Chosen: teamtr lr 0.01" in text
