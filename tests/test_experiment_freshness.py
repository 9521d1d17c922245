"""The paired freshness experiment (orchestra/experiments/freshness) and the trainer's branch point
(``TrainHooks.at_update``, ``train_until``): the hook stops after exactly the named update, the fresh batch shares the
stale one's random numbers, no upstream update gives identical arms, the statistics, a smoke run, resume, the CLI."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from orchestra.experiments.freshness.analysis import analyse, null_check_passes, paired_summary
from orchestra.experiments.freshness.config import DEFAULT_STEP, FreshnessConfig, team_config, trainer_config
from orchestra.experiments.freshness.run import (
    PAIR_COLUMNS,
    report_from_csv,
    run_freshness_experiment,
    run_pair,
)
from orchestra.experiments.harness import read_rows
from orchestra.teamtr.chain import ChainTeam, policy_matrices, warm_start
from orchestra.teamtr.chain_team import ChainTrainable
from orchestra.teamtr.trainer import TrainHooks, train, train_until
from trajectories.rundir import ConfigMismatchError

pytestmark = pytest.mark.usefixtures("one_thread")

SMOKE = FreshnessConfig.smoke()


def _warm_team(n: int, pair: int = 0) -> tuple[ChainTeam, list[dict[str, torch.Tensor]]]:
    team = ChainTeam(team_config(SMOKE, n, pair))
    warm_start(team)
    return team, [team.adapter_state(i) for i in range(n)]


def test_train_until_stops_after_exactly_that_update() -> None:
    team, warm = _warm_team(3)
    tcfg = trainer_config(SMOKE, 3, 0, DEFAULT_STEP)
    start = policy_matrices(team)
    seen: list[list[np.ndarray]] = []  # the matrices after every update of a full, uninterrupted stage
    train(ChainTrainable(team), tcfg, hooks=TrainHooks(after_update=lambda *_: seen.append(policy_matrices(team))))
    for i, state in enumerate(warm):
        team.load_adapter_state(i, state)

    br = train_until(ChainTrainable(team), tcfg, stage=0, position=1)
    now = policy_matrices(team)
    assert len(br.log.updates) == 2 and not br.log.stages  # stopped mid-stage, no stage record
    assert (br.point.stage, br.point.position, br.point.agents) == (0, 1, (1,))
    for i in range(3):  # exactly workers 0 and 1 moved, and as in the uninterrupted run
        np.testing.assert_array_equal(now[i], seen[1][i])
        assert (not np.allclose(now[i], start[i])) == (i < 2)
    # the snapshot is a copy: moving the team does not change it, and restore puts it back with the optimizers
    snap_params = br.snapshot.params
    team.load_adapter_state(1, warm[1])
    states = br.snapshot.restore(ChainTrainable(team), tcfg)
    np.testing.assert_array_equal(policy_matrices(team)[1], seen[1][1])
    assert states[0].optimizer is not None and states[2].optimizer is None  # worker 2 not updated yet
    assert states[0].optimizer.state_dict()["state"] and snap_params is br.snapshot.params
    with pytest.raises(ValueError, match="ended before"):
        train_until(ChainTrainable(team), tcfg, stage=1, position=0)


def test_fresh_batch_shares_the_stale_batch_random_numbers() -> None:
    team, warm = _warm_team(3)
    tcfg = trainer_config(SMOKE, 3, 0, DEFAULT_STEP)
    br = train_until(ChainTrainable(team), tcfg, stage=0, position=1)
    stale = br.point.batch.chain
    fresh = ChainTrainable(team).sample(tcfg.batch_size, br.point.rollout_generator()).chain
    torch.testing.assert_close(fresh.keys, stale.keys)  # the same keys, episode by episode
    changed = (fresh.messages != stale.messages).float().mean(dim=1)  # (n,) share of episodes changed per agent
    assert 0 < changed[0] < 0.5  # the moved policies change a few messages, not the draws
    # with the stage-start team the same generator state gives the stale batch exactly
    for i, state in enumerate(warm):
        team.load_adapter_state(i, state)
    again = ChainTrainable(team).sample(tcfg.batch_size, br.point.rollout_generator()).chain
    for a, b in ((again.keys, stale.keys), (again.messages, stale.messages), (again.input_ids, stale.input_ids)):
        torch.testing.assert_close(a, b)


def test_no_upstream_update_gives_identical_arms_and_an_update_gives_a_gap() -> None:
    team, warm = _warm_team(2)
    row = run_pair(SMOKE, team, warm, 2, 0, DEFAULT_STEP, upstream=False)
    assert row["J_fresh"] == row["J_stale"] and row["diff"] == 0.0
    assert row["ctx_kl"] == 0.0 and row["rows_changed"] == 0.0 and row["adv_gap"] == 0.0
    assert row["J_branch"] == row["J_start"] and row["upstream_kl"] == 0.0
    real = run_pair(SMOKE, team, warm, 2, 0, DEFAULT_STEP)
    assert real["ctx_kl"] > 0 and real["rows_changed"] > 0 and real["upstream_kl"] > 0
    assert real["J_branch"] != real["J_start"]  # the branch moved the team
    # every arm starts from the same state: J_stale is reproducible bit for bit
    assert run_pair(SMOKE, team, warm, 2, 0, DEFAULT_STEP)["J_stale"] == real["J_stale"]
    assert set(real) == set(PAIR_COLUMNS)


def test_paired_summary_and_null_check() -> None:
    s = paired_summary([1.0, 2.0, 3.0])
    assert s["mean"] == 2.0 and s["sd"] == 1.0
    assert s["ci_low"] == pytest.approx(2.0 - 4.302652729911275 / math.sqrt(3))  # t_{0.975, 2}
    assert s["mde"] > s["ci_high"] - s["mean"]  # 80% power needs more than the CI's half-width
    assert math.isnan(paired_summary([0.0, 0.0])["p"]) and math.isnan(paired_summary([1.0])["sd"])
    # the null check: pure noise around 0 passes, a shifted one fails
    rng = np.random.default_rng(0)
    rows = [
        dict(
            {k: 0 for k in PAIR_COLUMNS},
            step="s",
            n=2,
            pair=p,
            diff=float(d),
            null_diff=float(z),
            seconds=0.0,
        )
        for p, (d, z) in enumerate(zip(rng.normal(1.0, 0.1, 30), rng.normal(0.0, 0.1, 30), strict=True))
    ]
    cells = analyse(rows)["cells"]
    assert cells[0]["pairs"] == 30 and cells[0]["diff_p_holm"] < 1e-10 and null_check_passes(cells)
    shifted = [dict(r, null_diff=r["diff"]) for r in rows]
    assert not null_check_passes(analyse(shifted)["cells"])


def test_smoke_run_files_resume_and_report_from_csv(tmp_path: Path) -> None:
    cfg = replace(SMOKE, ns=(2,), pairs=2)
    out = tmp_path / "fresh"
    result = run_freshness_experiment(cfg, out, say=lambda _: None)
    rows = read_rows(out / "pairs.csv", PAIR_COLUMNS)
    assert len(rows) == 2 * len(cfg.steps) and (out / "config.json").exists() and (out / "cells.csv").exists()
    assert [(c["step"], c["pairs"]) for c in result.tables["cells"]] == [("default", 2), ("large", 2)]
    text = result.summary.read_text()
    assert "Fresh − stale" in text and "Null check" in text and "What it does not show" in text
    # resume with more pairs: the first two are kept, one more runs
    lines: list[str] = []
    again = run_freshness_experiment(replace(cfg, pairs=3), out, say=lines.append)
    assert len(lines) == len(cfg.steps) and f"{len(rows)} pairs reused" in again.summary.read_text()
    assert read_rows(out / "pairs.csv", PAIR_COLUMNS)[: len(rows)] == rows
    with pytest.raises(ConfigMismatchError, match="ns"):
        run_freshness_experiment(replace(cfg, ns=(3,)), out, say=lambda _: None)
    # the report of the CSV alone has the same tables
    rebuilt = report_from_csv(out / "pairs.csv", tmp_path / "rebuilt")
    assert rebuilt.tables == again.tables


def test_cli_from_csv(tmp_path: Path) -> None:
    from orchestra.cli import main

    cfg = replace(SMOKE, ns=(2,), pairs=2, steps=(DEFAULT_STEP,))
    run_freshness_experiment(cfg, tmp_path / "run", say=lambda _: None)
    report = tmp_path / "docs" / "freshness.md"
    code = main(
        [
            "experiment",
            "freshness",
            "--from-csv",
            str(tmp_path / "run" / "pairs.csv"),
            "--out",
            str(tmp_path / "rebuilt"),
            "--report",
            str(report),
        ]
    )
    assert code == 0 and "Fresh − stale" in report.read_text()
    assert (tmp_path / "run" / "summary.md").read_text().split("## Settings")[1] == report.read_text().split(
        "## Settings"
    )[1]
