"""TeamTR run directories and checkpoints (orchestra/teamtr/checkpoint.py, train(out_dir=…, resume=…)): a run that
is stopped or killed and resumed from its checkpoint ends bit-identical to a straight run, with one metrics row per
update and per stage; checkpoints load with weights_only=True; damaged files and config mismatches are named."""

from __future__ import annotations

import csv
import json
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from orchestra.teamtr import checkpoint as ckpt_module
from orchestra.teamtr.chain import ChainConfig, ChainTeam
from orchestra.teamtr.chain_team import ChainRollout, ChainTrainable
from orchestra.teamtr.checkpoint import Checkpoint, CheckpointError
from orchestra.teamtr.trainer import TeamTRConfig, TrainHooks, TrainLog, train
from trajectories.rundir import ConfigMismatchError

pytestmark = pytest.mark.usefixtures("one_thread")


CHAIN = ChainConfig(n_agents=3, vocab_size=4, lora_r=4, lora_targets=("lm_head",), seed=0)
STAGES = 4
CONFIGS = {
    # fresh batches, random order, backtracking, one persistent Adam per agent
    "teamtr": TeamTRConfig(
        scheme="teamtr",
        order="random",
        num_stages=STAGES,
        batch_size=32,
        num_epochs=2,
        num_minibatches=2,
        lr=3e-2,
        delta=0.02,
        optimizer_state="persistent",
        seed=5,
    ),
    # stale batch + HAPPO factor, adaptive penalty β_i, KL to the adapters at train start, fresh Adam per update
    "happo": TeamTRConfig(
        scheme="happo",
        num_stages=STAGES,
        batch_size=32,
        num_epochs=2,
        num_minibatches=2,
        lr=3e-2,
        trust_region="penalty",
        delta=1e-3,
        ref_kl_coef=0.1,
        seed=6,
    ),
}
WALL = "_seconds"  # wall-time columns (perf/*_seconds) are the only ones allowed to differ


class Killed(RuntimeError):
    """Stands for the process being killed."""


def _team(cfg: ChainConfig = CHAIN) -> ChainTrainable:
    """A team built from its config alone, as a restarted process would (same seed → same base and adapters)."""
    return ChainTrainable(ChainTeam(cfg))


def _params(team: ChainTrainable) -> list[dict[str, torch.Tensor]]:
    return [team.state(i) for i in range(len(team.agent_names))]


def _same_tensors(a: Any, b: Any, where: str = "") -> None:
    """Recursive bit-identity of nested dicts / lists of tensors and plain values."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            _same_tensors(a[k], b[k], f"{where}/{k}")
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), where
        for j, (x, y) in enumerate(zip(a, b, strict=True)):
            _same_tensors(x, y, f"{where}[{j}]")
    else:
        assert a == b, where


def _strip(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if not k.endswith(WALL)} for r in rows]


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _csv(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        return list(reader.fieldnames or []), list(reader)


def _final_checkpoint(run: Path) -> Checkpoint:
    return ckpt_module.load_checkpoint(run / "checkpoints" / f"stage-{STAGES:04d}")


def _assert_same_run(
    straight: tuple[ChainTrainable, TrainLog, Path], other: tuple[ChainTrainable, TrainLog, Path]
) -> None:
    """Bit-identical parameters, optimizer states, β_i and RNG states; identical metrics (files and log), one row
    per update and per stage."""
    (team_a, log_a, dir_a), (team_b, log_b, dir_b) = straight, other
    _same_tensors(_params(team_a), _params(team_b), "params")
    ca, cb = _final_checkpoint(dir_a), _final_checkpoint(dir_b)
    for field in ("adapters", "references", "optimizers", "kl_coefs", "generators", "stage", "agent_names"):
        _same_tensors(getattr(ca, field), getattr(cb, field), field)
    assert {k: v for k, v in ca.counters.items() if k != "wall_seconds"} == {
        k: v for k, v in cb.counters.items() if k != "wall_seconds"
    }
    n = len(team_a.agent_names)
    for name, count in (("updates", STAGES * n), ("stages", STAGES)):
        rows_a, rows_b = _jsonl(dir_a / f"{name}.jsonl"), _jsonl(dir_b / f"{name}.jsonl")
        assert len(rows_a) == len(rows_b) == count, name
        assert _strip(rows_a) == _strip(rows_b), name
        head_a, csv_a = _csv(dir_a / f"{name}.csv")
        head_b, csv_b = _csv(dir_b / f"{name}.csv")
        assert head_a == head_b and len(csv_a) == len(csv_b) == count, name
        assert set(head_a) == {k for r in rows_a for k in r}  # CSV columns = union of the keys
        assert _strip(csv_a) == _strip(csv_b), name
    assert _strip(log_a.updates) == _strip(log_b.updates) and _strip(log_a.stages) == _strip(log_b.stages)
    assert [r["rollout/stage"] for r in log_b.stages] == [float(s) for s in range(STAGES)]


_STRAIGHT: dict[str, tuple[ChainTrainable, TrainLog, Path]] = {}


@pytest.fixture
def straight(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Straight run of each config, once per session (read-only for the tests)."""

    def get(name: str) -> tuple[ChainTrainable, TrainLog, Path]:
        if name not in _STRAIGHT:
            out = tmp_path_factory.mktemp(f"straight-{name}")
            team = _team()
            _STRAIGHT[name] = (team, train(team, CONFIGS[name], out_dir=out), out)
        return _STRAIGHT[name]

    return get


# ---------------------------------------------------------------------------------------------------------------
# resume = straight, bit for bit


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_stop_and_resume_is_bit_identical(name: str, straight: Any, tmp_path: Path) -> None:
    cfg = CONFIGS[name]
    train(_team(), replace(cfg, num_stages=2), out_dir=tmp_path)  # a run of 2 stages…
    team = _team()  # …continued by a "new process": team rebuilt from its config, new trainer objects
    log = train(team, cfg, out_dir=tmp_path, resume=True)
    _assert_same_run(straight(name), (team, log, tmp_path))
    ckpts = tmp_path / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == ["latest", "stage-0003", "stage-0004"]  # keep_checkpoints=2
    assert (ckpts / "latest").read_text().strip() == "stage-0004"
    assert json.loads((tmp_path / "config.json").read_text())["trainer"]["num_stages"] == STAGES


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_killed_mid_stage_resumes_bit_identical(name: str, straight: Any, tmp_path: Path) -> None:
    """Killed during stage 2 (after stage 1's checkpoint; stage 2's metrics never written)."""

    def kill(stage: int, agents: tuple[int, ...], batch: ChainRollout) -> None:
        if stage == 2:
            raise Killed

    with pytest.raises(Killed):
        train(_team(), CONFIGS[name], out_dir=tmp_path, hooks=TrainHooks(after_update=kill))
    assert len(_jsonl(tmp_path / "stages.jsonl")) == 2
    team = _team()
    log = train(team, CONFIGS[name], out_dir=tmp_path, resume=True)
    _assert_same_run(straight(name), (team, log, tmp_path))


def test_killed_between_metrics_and_checkpoint_drops_the_extra_rows(
    straight: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed after stage 2's metrics rows were appended but before its checkpoint: resume truncates them."""
    save = ckpt_module.save_checkpoint

    def save_or_die(root: Path, ckpt: Checkpoint, keep: int) -> Path:
        if ckpt.stage == 3:
            raise Killed
        return save(root, ckpt, keep)

    monkeypatch.setattr(ckpt_module, "save_checkpoint", save_or_die)
    with pytest.raises(Killed):
        train(_team(), CONFIGS["teamtr"], out_dir=tmp_path)
    assert len(_jsonl(tmp_path / "stages.jsonl")) == 3  # one row more than the latest checkpoint (stage-0002)
    monkeypatch.setattr(ckpt_module, "save_checkpoint", save)
    team = _team()
    log = train(team, CONFIGS["teamtr"], out_dir=tmp_path, resume=True)
    _assert_same_run(straight("teamtr"), (team, log, tmp_path))


def test_resume_without_a_checkpoint_starts_over(straight: Any, tmp_path: Path) -> None:
    def kill(stage: int, agents: tuple[int, ...], batch: ChainRollout) -> None:
        raise Killed

    with pytest.raises(Killed):  # killed in stage 0: config.json written, no checkpoint yet
        train(_team(), CONFIGS["happo"], out_dir=tmp_path, hooks=TrainHooks(before_update=kill))
    team = _team()
    log = train(team, CONFIGS["happo"], out_dir=tmp_path, resume=True)
    _assert_same_run(straight("happo"), (team, log, tmp_path))


# ---------------------------------------------------------------------------------------------------------------
# the files: safe to load, damage and mismatches named


def test_checkpoint_files_load_with_weights_only(straight: Any) -> None:
    _, _, run = straight("teamtr")
    ckpt = run / "checkpoints" / f"stage-{STAGES:04d}"
    pts = sorted(ckpt.rglob("*.pt"))
    assert {p.name for p in pts} == {"rng.pt", "agent_0.pt", "agent_1.pt", "agent_2.pt"}  # persistent Adam
    for p in pts:
        torch.load(p, weights_only=True)
    adapters = sorted(ckpt.glob("adapters/*.safetensors"))
    assert len(adapters) == 3
    assert all(k.endswith(".weight") for k in load_file(str(adapters[0])))
    config = json.loads((ckpt / "config.json").read_text())
    assert config["trainer"]["scheme"] == "teamtr" and config["team"]["n_agents"] == 3
    assert config["team"]["lora_targets"] == ["lm_head"]
    assert config == json.loads((run / "config.json").read_text())
    state = json.loads((ckpt / "trainer_state.json").read_text())
    assert state["stage"] == STAGES and state["counters"]["update_index"] == 3 * STAGES


def _two_stage_run(tmp_path: Path) -> Path:
    train(_team(), replace(CONFIGS["teamtr"], num_stages=2), out_dir=tmp_path)
    return tmp_path / "checkpoints" / "stage-0002"


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete"])
def test_damaged_checkpoint_file_is_named(damage: str, tmp_path: Path) -> None:
    path = _two_stage_run(tmp_path) / "adapters" / "agent_1.safetensors"
    data = bytearray(path.read_bytes())
    if damage == "flip":
        data[-3] ^= 0xFF  # in the tensor data: safetensors alone would load it silently
        path.write_bytes(bytes(data))
    elif damage == "truncate":
        path.write_bytes(bytes(data[: len(data) // 2]))
    else:
        path.unlink()
    with pytest.raises(CheckpointError, match="agent_1.safetensors"):
        train(_team(), CONFIGS["teamtr"], out_dir=tmp_path, resume=True)


def test_damaged_safetensors_is_named_without_the_manifest(tmp_path: Path) -> None:
    ckpt = _two_stage_run(tmp_path)
    path = ckpt / "adapters" / "agent_0.safetensors"
    path.write_bytes(b"\x00" * 16)
    manifest = json.loads((ckpt / "manifest.json").read_text())
    manifest["adapters/agent_0.safetensors"] = ckpt_module._sha256(path)  # a consistent manifest: the loader decides
    (ckpt / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match="agent_0.safetensors"):
        train(_team(), CONFIGS["teamtr"], out_dir=tmp_path, resume=True)
    (ckpt / "manifest.json").unlink()
    with pytest.raises(CheckpointError, match="manifest.json"):
        train(_team(), CONFIGS["teamtr"], out_dir=tmp_path, resume=True)


def test_config_mismatch_names_the_fields(tmp_path: Path) -> None:
    _two_stage_run(tmp_path)
    with pytest.raises(ConfigMismatchError, match=r"trainer\.scheme.*trainer\.seed|trainer\.seed.*trainer\.scheme"):
        train(_team(), replace(CONFIGS["teamtr"], scheme="naive", seed=9), out_dir=tmp_path, resume=True)
    with pytest.raises(ConfigMismatchError, match=r"team\.vocab_size"):
        train(_team(replace(CHAIN, vocab_size=5)), CONFIGS["teamtr"], out_dir=tmp_path, resume=True)
    with pytest.raises(ConfigMismatchError, match=r"trainer\.batch_size") as err:
        train(_team(), replace(CONFIGS["teamtr"], batch_size=16), out_dir=tmp_path, resume=True)
    assert "num_stages" not in str(err.value)  # a resumable knob, never reported
    with pytest.raises(FileExistsError):  # a new run never overwrites an old one
        train(_team(), CONFIGS["teamtr"], out_dir=tmp_path)
    with pytest.raises(ValueError, match="out_dir"):
        train(_team(), CONFIGS["teamtr"], resume=True)


def test_out_dir_does_not_change_the_run(straight: Any) -> None:
    team_a, log_a, _ = straight("happo")
    team = _team()
    log = train(team, CONFIGS["happo"])
    _same_tensors(_params(team_a), _params(team))
    assert _strip(log.updates) == _strip(log_a.updates)
