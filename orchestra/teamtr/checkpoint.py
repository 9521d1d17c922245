"""Run directory of a TeamTR run: resolved config, metrics files and stage checkpoints (docs/architecture.md §6). Torch only.

Layout of ``out_dir`` (written by :func:`orchestra.teamtr.trainer.train`)::

    config.json                  resolved config: {"format", "trainer": TeamTRConfig, "team": the team's config}
    updates.jsonl  updates.csv   one flat metrics row per update (CSV columns = union of keys, first-seen order)
    stages.jsonl   stages.csv    one flat metrics row per stage
    checkpoints/
        latest                   name of the newest complete checkpoint (written to a temp file, then renamed)
        stage-0003/              the state after 3 completed stages (the run resumes at stage index 3)
            config.json          the resolved config this checkpoint was written under
            trainer_state.json   stage, counters, metrics row counts, β_i, the team's exact success, numpy RNG scalars
            rng.pt               torch.Generator states (rollouts, orders), torch global (+ CUDA), numpy MT19937 keys
            adapters/{agent}.safetensors    every agent's trainable parameters (TrainableTeam.state)
            reference/{agent}.safetensors   the adapters at train start (only when ref_kl_coef > 0)
            optimizers/{agent}.pt           optimizer state_dict (only optimizer_state="persistent", once created)
            manifest.json        sha256 of every file above: a damaged file is named, never silently loaded

Every ``.pt`` file holds only tensors, numbers, strings, lists, tuples and dicts and is read with
``torch.load(..., weights_only=True)``: nothing is unpickled beyond that allow-list. A checkpoint directory is written
under a temporary name and renamed when complete, so a killed run never leaves a half-written ``stage-XXXX``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor

from orchestra.teamtr.config import RESUMABLE_FIELDS, TeamTRConfig
from orchestra.teamtr.protocols import Metrics, TrainableTeam
from trajectories.rundir import (
    CONFIG_FILE,
    MetricsWriter,
    RNGState,
    capture_rng,
    check_config,
    config_json,
    restore_rng,
    write_config,
    write_text_atomic,
)

FORMAT = "orchestra.teamtr.run/1"
METRICS_FILES = ("updates", "stages")
_STAGE_DIR = re.compile(r"^stage-(\d{4,})$")


class CheckpointError(RuntimeError):
    """A checkpoint or metrics file is missing, damaged or does not fit the team; the message names the file."""


# ----------------------------------------------------------------------------------------------------------------
# resolved config


def resolved_config(cfg: TeamTRConfig, team_config: Any, team_type: str) -> dict[str, Any]:
    """The config written into the run directory and every checkpoint (and compared on resume), in its JSON form."""
    return config_json({"format": FORMAT, "trainer": cfg, "team_type": team_type, "team": team_config})


def check_resume(path: Path, current: dict[str, Any], saved: dict[str, Any] | None = None) -> None:
    """Refuse to resume the run whose config is in ``path`` (or ``saved``, read from it) under another config: a
    :class:`~trajectories.rundir.ConfigMismatchError` names every differing field but the trainer knobs in
    :data:`~orchestra.teamtr.config.RESUMABLE_FIELDS`."""
    check_config(path, current, saved=saved, may_differ=[f"trainer.{name}" for name in sorted(RESUMABLE_FIELDS)])


def read_json(path: Path) -> Any:
    """JSON of ``path``; a missing or unreadable file is a :class:`CheckpointError` naming it."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as e:
        raise CheckpointError(f"missing file {path}") from e
    except (OSError, ValueError) as e:
        raise CheckpointError(f"damaged file {path}: {e}") from e


# ----------------------------------------------------------------------------------------------------------------
# metrics: one writer, JSONL (the record) + CSV (columns = union of keys)


def read_metrics(run_dir: Path, name: str, num_rows: int) -> list[Metrics]:
    """The first ``num_rows`` rows of ``{name}.jsonl`` (a resumed run drops the rows written after its checkpoint)."""
    path = run_dir / f"{name}.jsonl"
    if num_rows == 0:
        return []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
        rows = [json.loads(line) for line in lines[:num_rows]]
    except FileNotFoundError as e:
        raise CheckpointError(f"missing metrics file {path} (the checkpoint expects {num_rows} rows)") from e
    except (OSError, ValueError) as e:
        raise CheckpointError(f"damaged metrics file {path}: {e}") from e
    if len(rows) < num_rows:
        raise CheckpointError(f"metrics file {path} holds {len(rows)} rows, the checkpoint expects {num_rows}")
    return [{k: float(v) for k, v in r.items()} for r in rows]


# ----------------------------------------------------------------------------------------------------------------
# checkpoints


@dataclass
class Checkpoint:
    """Everything a run needs to continue after ``stage`` completed stages (the in-memory ``stage-XXXX/``)."""

    config: dict[str, Any]  # resolved config (:func:`resolved_config`)
    stage: int  # completed stages = the next stage index
    counters: dict[str, Any]  # update_index, episodes, tokens, wall_seconds, success, metrics row counts
    agent_names: tuple[str, ...]
    adapters: list[dict[str, Tensor]]  # per agent, TrainableTeam.state
    references: list[dict[str, Tensor]] | None  # per agent, adapters at train start (ref_kl_coef > 0)
    optimizers: list[dict[str, Any] | None]  # per agent, optimizer state_dict or None
    kl_coefs: list[float]  # per agent, penalty β_i
    generators: dict[str, Tensor]  # torch.Generator.get_state() by purpose ("rollout", "order")
    rng: RNGState | None = None  # process-wide torch (+ CUDA) and numpy RNGs (filled on load)
    source: Path | None = None  # the directory it was read from (error messages)

    def restore_global_rng(self) -> None:
        """Set the process-wide torch (+ CUDA) and numpy RNGs to their state when the checkpoint was written."""
        if self.rng is not None:
            restore_rng(self.rng)


def stage_dir_name(stage: int) -> str:
    return f"stage-{stage:04d}"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def save_checkpoint(root: Path, ckpt: Checkpoint, keep: int) -> Path:
    """Write ``root/stage-XXXX/`` (temp dir + rename), point ``root/latest`` at it, keep the newest ``keep``."""
    root.mkdir(parents=True, exist_ok=True)
    name = stage_dir_name(ckpt.stage)
    final = root / name
    tmp = root / f".tmp-{name}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    files: list[Path] = []

    def _save_tensors(path: Path, state: dict[str, Tensor]) -> None:
        path.parent.mkdir(exist_ok=True)
        save_file({k: v.detach().cpu().contiguous() for k, v in state.items()}, str(path))
        files.append(path)

    for agent, state in zip(ckpt.agent_names, ckpt.adapters, strict=True):
        _save_tensors(tmp / "adapters" / f"{agent}.safetensors", state)
    for agent, state in zip(ckpt.agent_names, ckpt.references or [], strict=False):
        _save_tensors(tmp / "reference" / f"{agent}.safetensors", state)
    for agent, opt in zip(ckpt.agent_names, ckpt.optimizers, strict=True):
        if opt is not None:
            (tmp / "optimizers").mkdir(exist_ok=True)
            torch.save(opt, tmp / "optimizers" / f"{agent}.pt")
            files.append(tmp / "optimizers" / f"{agent}.pt")
    rng = capture_rng(python=False)  # the loop draws from torch and numpy only
    torch.save({**{f"generator_{k}": v for k, v in ckpt.generators.items()}, **rng.tensors}, tmp / "rng.pt")
    trainer_state = {
        "stage": ckpt.stage,
        "agent_names": list(ckpt.agent_names),
        "counters": ckpt.counters,
        "kl_coefs": ckpt.kl_coefs,
        "optimizers": [opt is not None for opt in ckpt.optimizers],
        "references": ckpt.references is not None,
        "numpy_rng": rng.numpy,
    }
    (tmp / "trainer_state.json").write_text(json.dumps(trainer_state, indent=2), encoding="utf-8")
    files += [tmp / "rng.pt", tmp / "trainer_state.json", write_config(tmp, ckpt.config)]
    manifest = {str(p.relative_to(tmp)): _sha256(p) for p in files}
    (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2), encoding="utf-8")
    if final.exists():  # left by a killed run after its rename but before `latest` moved on
        shutil.rmtree(final)
    os.replace(tmp, final)
    write_text_atomic(root / "latest", name + "\n")
    stages = sorted((int(m.group(1)), p) for p in root.iterdir() if (m := _STAGE_DIR.match(p.name)) and p.is_dir())
    for _, old in stages[:-keep]:
        if old != final:
            shutil.rmtree(old)
    return final


def latest_checkpoint(root: Path) -> Path | None:
    """The checkpoint ``root/latest`` names; None if there is none yet. A ``latest`` naming a missing directory is a
    :class:`CheckpointError`."""
    pointer = root / "latest"
    if not pointer.exists():
        return None
    path = root / pointer.read_text(encoding="utf-8").strip()
    if not path.is_dir():
        raise CheckpointError(f"{pointer} names {path}, which does not exist")
    return path


def _load_tensors(path: Path) -> dict[str, Tensor]:
    try:
        return load_file(str(path))
    except Exception as e:  # safetensors raises its own SafetensorsError / OSError
        raise CheckpointError(f"damaged checkpoint file {path}: {e}") from e


def _load_pt(path: Path) -> Any:
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # UnpicklingError (not on the weights_only allow-list), RuntimeError (truncated zip)
        raise CheckpointError(f"damaged checkpoint file {path}: {e}") from e


def load_checkpoint(path: Path) -> Checkpoint:
    """Read ``stage-XXXX/`` back, verifying every file against its manifest first (no process state is touched).

    Raises :class:`CheckpointError` naming the first missing or damaged file, or the checkpoint when a file that
    passed its checksum still does not hold what a checkpoint holds (a hand-edited manifest, a foreign folder).
    """
    try:
        return _load_checkpoint(path)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
        raise CheckpointError(f"damaged checkpoint {path}: {type(e).__name__}: {e}") from e


def _load_checkpoint(path: Path) -> Checkpoint:
    manifest = read_json(path / "manifest.json")
    if not isinstance(manifest, dict):
        raise CheckpointError(f"damaged checkpoint file {path / 'manifest.json'}: not a JSON object")
    for rel, digest in manifest.items():
        file = path / rel
        if not file.is_file():
            raise CheckpointError(f"missing checkpoint file {file}")
        if _sha256(file) != digest:
            raise CheckpointError(f"damaged checkpoint file {file}: sha256 differs from {path / 'manifest.json'}")
    state = read_json(path / "trainer_state.json")
    names = tuple(state["agent_names"])
    for required in [*(f"adapters/{a}.safetensors" for a in names), "rng.pt", "trainer_state.json", CONFIG_FILE]:
        if required not in manifest:
            raise CheckpointError(f"missing checkpoint file {path / required} (not in its manifest)")
    adapters = [_load_tensors(path / "adapters" / f"{a}.safetensors") for a in names]
    references = (
        [_load_tensors(path / "reference" / f"{a}.safetensors") for a in names] if state["references"] else None
    )
    optimizers = [
        _load_pt(path / "optimizers" / f"{a}.pt") if has else None
        for a, has in zip(names, state["optimizers"], strict=True)
    ]
    rng = _load_pt(path / "rng.pt")
    return Checkpoint(
        config=read_json(path / CONFIG_FILE),
        stage=int(state["stage"]),
        counters=state["counters"],
        agent_names=names,
        adapters=adapters,
        references=references,
        optimizers=optimizers,
        kl_coefs=[float(b) for b in state["kl_coefs"]],
        generators={k.removeprefix("generator_"): v for k, v in rng.items() if k.startswith("generator_")},
        rng=RNGState({k: v for k, v in rng.items() if not k.startswith("generator_")}, state["numpy_rng"]),
    )


def check_adapter_state(file: Path, loaded: dict[str, Tensor], expected: dict[str, Tensor]) -> None:
    """A loaded adapter must have the team's parameter names, shapes and dtypes; else a :class:`CheckpointError`."""
    if loaded.keys() != expected.keys():
        missing, extra = sorted(expected.keys() - loaded.keys()), sorted(loaded.keys() - expected.keys())
        raise CheckpointError(f"checkpoint file {file} does not fit the team: missing {missing[:3]}, extra {extra[:3]}")
    for k, v in expected.items():
        if loaded[k].shape != v.shape or loaded[k].dtype != v.dtype:
            raise CheckpointError(
                f"checkpoint file {file}: {k} is {tuple(loaded[k].shape)} {loaded[k].dtype}, "
                f"the team has {tuple(v.shape)} {v.dtype}"
            )


# ----------------------------------------------------------------------------------------------------------------
# the run directory


class RunDirectory:
    """``out_dir`` of one run: checks and writes ``config.json`` (:mod:`trajectories.rundir`), finds the checkpoint to
    resume from, truncates the metrics files back to it, then appends metrics and writes a checkpoint at the end of
    every stage.

    ``resume``: False = a new run (``out_dir`` must not hold one); True = continue from ``checkpoints/latest`` (a fresh
    start if there is no checkpoint yet); a path = continue from that ``stage-XXXX`` directory.
    """

    def __init__(
        self, path: str | Path, config: dict[str, Any], resume: bool | str | Path, *, tensorboard: bool = False
    ) -> None:
        self.path = Path(path)
        self.checkpoints = self.path / "checkpoints"
        config_file = self.path / CONFIG_FILE
        self.checkpoint: Checkpoint | None = None
        if resume is False:
            if config_file.exists() or self.checkpoints.exists():
                raise FileExistsError(f"{self.path} already holds a run: pass resume=True or use a new out_dir")
        else:
            source = latest_checkpoint(self.checkpoints) if resume is True else Path(resume)
            if source is not None:
                self.checkpoint = load_checkpoint(source)
                self.checkpoint.source = source
                check_resume(source / CONFIG_FILE, config, saved=self.checkpoint.config)
            elif config_file.exists():
                check_resume(config_file, config)
        write_config(self.path, config)
        ckpt = self.checkpoint
        counts = (int(ckpt.counters["update_index"]), ckpt.stage) if ckpt is not None else (0, 0)
        self.writers = {
            name: MetricsWriter(self.path, name, read_metrics(self.path, name, count), tensorboard=tensorboard)
            for name, count in zip(METRICS_FILES, counts, strict=True)
        }

    def end_stage(self, update_rows: Sequence[Metrics], stage_row: Metrics, ckpt: Checkpoint, keep: int) -> Path:
        """Append the stage's metrics (flushed), then write its checkpoint: a run killed at any point resumes from
        the previous checkpoint, whose row counts truncate any rows written after it."""
        self.writers["updates"].append(update_rows)
        self.writers["stages"].append([stage_row])
        return save_checkpoint(self.checkpoints, ckpt, keep)


# ----------------------------------------------------------------------------------------------------------------
# a team's state in and out of a Checkpoint


def capture(
    team: TrainableTeam[Any],
    config: dict[str, Any],
    stage: int,
    counters: dict[str, Any],
    optimizers: Sequence[torch.optim.Optimizer | None],
    kl_coefs: Sequence[float],
    references: dict[int, dict[str, Tensor]] | None,
    generators: dict[str, torch.Generator],
) -> Checkpoint:
    """The loop's whole state after ``stage`` completed stages (what :func:`restore` puts back)."""
    n = len(team.agent_names)
    return Checkpoint(
        config=config,
        stage=stage,
        counters=counters,
        agent_names=team.agent_names,
        adapters=[team.state(i) for i in range(n)],
        references=None if references is None else [references[i] for i in range(n)],
        optimizers=[None if opt is None else opt.state_dict() for opt in optimizers],
        kl_coefs=list(kl_coefs),
        generators={k: g.get_state() for k, g in generators.items()},
    )


def restore(
    team: TrainableTeam[Any],
    ckpt: Checkpoint,
    generators: dict[str, torch.Generator],
    make_optimizer: Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer],
) -> tuple[list[torch.optim.Optimizer | None], dict[int, dict[str, Tensor]] | None]:
    """Put a checkpoint back into ``team`` and ``generators`` and set the process-wide RNGs. Returns the per-agent
    optimizer built by ``make_optimizer`` with its saved state (None where there was none) and the reference adapters (those at the ORIGINAL train start, or None)."""
    source = ckpt.source or Path("<checkpoint>")
    if ckpt.agent_names != team.agent_names:
        raise CheckpointError(f"{source} holds agents {ckpt.agent_names}, the team has {team.agent_names}")
    optimizers: list[torch.optim.Optimizer | None] = []
    for i, name in enumerate(team.agent_names):
        check_adapter_state(source / "adapters" / f"{name}.safetensors", ckpt.adapters[i], team.state(i))
        if ckpt.references is not None:
            check_adapter_state(source / "reference" / f"{name}.safetensors", ckpt.references[i], team.state(i))
        team.load_state(i, ckpt.adapters[i])
        opt_state = ckpt.optimizers[i]
        if opt_state is None:
            optimizers.append(None)
            continue
        opt = make_optimizer(list(team.parameters(i)))
        try:
            opt.load_state_dict(opt_state)
        except (KeyError, ValueError, RuntimeError) as e:
            raise CheckpointError(f"checkpoint file {source / 'optimizers' / f'{name}.pt'}: {e}") from e
        optimizers.append(opt)
    for purpose, gen in generators.items():
        gen.set_state(ckpt.generators[purpose])
    ckpt.restore_global_rng()
    return optimizers, None if ckpt.references is None else dict(enumerate(ckpt.references))
