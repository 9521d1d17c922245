"""The one metrics writer (trajectories.rundir.MetricsWriter): JSONL + CSV + TensorBoard event files, read back
with TensorBoard's own reader, from the offline trainer, the TeamTR trainer (through a resume) and the writer alone."""

from __future__ import annotations

import csv
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from trajectories.rundir import MetricsWriter, read_rows


def _scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar series in the event files under ``folder``, by tag: (step, value) in step order."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder))
    acc.Reload()
    return {t: sorted((e.step, e.value) for e in acc.Scalars(t)) for t in acc.Tags()["scalars"]}


def test_writer_columns_resume_and_tensorboard(tmp_path: Path) -> None:
    w = MetricsWriter(tmp_path, tensorboard=True)
    w.append([{"step": 10, "losses/a": 1.5}, {"step": 20, "losses/a": 1.25, "note": "text", "flag": True}])
    w.write({"step": 30, "losses/a": 1.0, "kl/b": float("nan")})  # a new column late; NaN kept out of TensorBoard
    w.close()
    with (tmp_path / "metrics.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ["step", "losses/a", "note", "flag", "kl/b"] and len(rows) == 3
    tb = _scalars(tmp_path / "tensorboard" / "metrics")
    assert tb["losses/a"] == [(10, 1.5), (20, 1.25), (30, 1.0)]
    assert "step" in tb and "note" not in tb and "flag" not in tb and "kl/b" not in tb
    # a kill mid-write leaves a cut last line: resume drops it and carries on; only new rows reach TensorBoard
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write('{"step": 40, "loss')
    w = MetricsWriter(tmp_path, resume=True, tensorboard=True)
    assert [r["step"] for r in w.rows] == [10, 20, 30]
    w.write({"step": 40, "losses/a": 0.5})
    w.close()
    assert [r["step"] for r in read_rows(tmp_path / "metrics.jsonl")] == [10, 20, 30, 40]
    assert _scalars(tmp_path / "tensorboard" / "metrics")["losses/a"] == [(10, 1.5), (20, 1.25), (30, 1.0), (40, 0.5)]


def test_a_damaged_line_inside_the_file_is_named(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\nnot json\n{"step": 3}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl:2: not a JSON metrics row"):
        MetricsWriter(tmp_path, resume=True)


def test_offline_training_writes_tensorboard(tmp_path: Path) -> None:
    from policies.learning.offline import OfflineConfig, train_offline
    from tests.test_offline import synthetic

    cfg = OfflineConfig(algo="bc", n_steps=200, n_steps_per_epoch=100, seed=0)
    res = train_offline(synthetic(40, 0), cfg, tmp_path, tensorboard=True)
    tb = _scalars(tmp_path / "tensorboard" / "metrics")
    assert [s for s, _ in tb["perf/agreement"]] == [100, 200]  # at the d3rlpy step of each epoch
    np.testing.assert_allclose([v for _, v in tb["perf/agreement"]], [r["perf/agreement"] for r in res.metrics])
    assert any(t.startswith("losses/") for t in tb)
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["epoch"] for x in lines] == [1, 2]


def test_teamtr_stages_and_updates_in_tensorboard_through_a_resume(tmp_path: Path) -> None:
    from orchestra.teamtr.chain import ChainConfig, ChainTeam
    from orchestra.teamtr.chain_team import ChainTrainable
    from orchestra.teamtr.trainer import TeamTRConfig, train

    def team() -> ChainTrainable:
        return ChainTrainable(ChainTeam(ChainConfig(n_agents=2, vocab_size=4, lora_r=2, lora_targets=("lm_head",))))

    cfg = TeamTRConfig(scheme="teamtr", num_stages=3, batch_size=16, lr=3e-2, delta=0.02, seed=1)
    train(team(), replace(cfg, num_stages=2), out_dir=tmp_path, tensorboard=True)
    log = train(team(), cfg, out_dir=tmp_path, resume=True, tensorboard=True)
    stages = _scalars(tmp_path / "tensorboard" / "stages")
    key = next(k for k in stages if k.startswith("rollout/"))
    assert len(stages[key]) == 3  # 2 stages, then 1 more after the resume: no duplicates
    assert [v for _, v in stages[key]] == pytest.approx([r[key] for r in log.stages])
    updates = _scalars(tmp_path / "tensorboard" / "updates")
    assert any(k.startswith("kl/") for k in updates) and len(next(iter(updates.values()))) == 3 * 2


def test_chain_experiment_runs_write_tensorboard(tmp_path: Path) -> None:
    from orchestra.experiments.chain.config import ChainExperimentConfig, chain_config
    from orchestra.experiments.chain.run import run_one
    from orchestra.teamtr.chain import ChainTeam, warm_start

    cfg = ChainExperimentConfig.smoke()
    team = ChainTeam(chain_config(cfg, 2, 0))
    warm_start(team)
    rows, _ = run_one(cfg, team, [team.adapter_state(i) for i in range(2)], 2, "teamtr", 0, tensorboard=tmp_path)
    stages = _scalars(tmp_path / "n2-teamtr-s0" / "tensorboard" / "stages")
    assert [v for _, v in stages["perf/team_success"]] == pytest.approx([r["J"] for r in rows[1:]])
    assert (tmp_path / "n2-teamtr-s0" / "updates.csv").is_file()
