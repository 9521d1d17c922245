"""Resumable offline training (``orchestra train --resume``): at the end of every epoch the whole training state is
written to ``OUT/resume/epoch-NNNN/`` and ``OUT/resume/latest`` is pointed at it, so a run killed at any moment
continues from its last finished epoch and ends **bit-identical** to a run that was never interrupted (CPU).

The state is what d3rlpy's ``fit`` carries from one step to the next:

* ``model.pt``: every module d3rlpy checkpoints, the Adam states and target networks included (torch state dicts,
  read back with ``weights_only=True``);
* ``rng.pt``: the process-wide RNGs d3rlpy draws from, torch's global generator and numpy's legacy MT19937 (the
  replay buffer samples its minibatches with ``np.random``), as tensors;
* ``state.json``: the epoch, d3rlpy's gradient-step counter (it schedules the target-network syncs), numpy's and
  Python's RNG scalars, and the metric rows of the finished epochs.

The folder is written beside its final name and renamed into place, then ``latest`` moves (atomically), so a kill
mid-write leaves the previous epoch's state whole. The RNGs are captured and restored by
:mod:`trajectories.rundir`, which also holds the run's ``config.json`` and its check on resume (a different algorithm,
knob or dataset is refused, naming every differing field)."""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from policies.base import PolicyError
from trajectories.rundir import RNGState, atomic_path, capture_rng, restore_rng

RESUME_DIR = "resume"
_EPOCH_DIR = re.compile(r"^epoch-(\d{4,})$")


@dataclass
class TrainState:
    """One finished epoch's training state, as read back by :func:`load_state`."""

    epoch: int
    grad_step: int
    rows: list[dict[str, Any]]  # metric rows of the epochs 1..epoch
    modules: dict[str, Any]  # d3rlpy module name -> state dict
    folder: Path


def save_state(out: Path, algo: Any, epoch: int, rows: list[dict[str, Any]]) -> Path:
    """Write ``out/resume/epoch-NNNN/`` for the epoch just finished, point ``latest`` at it, drop the older ones."""
    import torch

    root = out / RESUME_DIR
    root.mkdir(parents=True, exist_ok=True)
    name = f"epoch-{epoch:04d}"
    final, tmp = root / name, root / f".tmp-{name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        states = {k: m.state_dict() for k, m in algo.impl.modules.create_checkpointer("cpu:0").modules.items()}
        torch.save(states, tmp / "model.pt")
        rng = capture_rng()
        torch.save(rng.tensors, tmp / "rng.pt")
        scalars = {"numpy": rng.numpy, "python": rng.python}
        state = {"epoch": epoch, "grad_step": int(algo.grad_step), "rng": scalars, "rows": rows}
        (tmp / "state.json").write_text(json.dumps(state), encoding="utf-8")
        if final.exists():  # left by a run killed after its rename but before `latest` moved on
            shutil.rmtree(final)
        os.replace(tmp, final)
        with atomic_path(root / "latest", "resume pointer") as p:
            p.write_text(name + "\n", encoding="utf-8")
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise OSError(
            e.errno, f"{e.strerror or e}: could not write the resume state of epoch {epoch}", str(final)
        ) from e
    for old in root.iterdir():
        if (m := _EPOCH_DIR.match(old.name)) and int(m.group(1)) != epoch:
            shutil.rmtree(old, ignore_errors=True)
    return final


def load_state(out: Path) -> TrainState | None:
    """The latest saved state of the run in ``out`` (None if it has none); restores the RNGs as they were then."""
    import torch

    pointer = out / RESUME_DIR / "latest"
    if not pointer.exists():
        return None
    folder = out / RESUME_DIR / pointer.read_text(encoding="utf-8").strip()
    try:
        state = json.loads((folder / "state.json").read_text(encoding="utf-8"))
        modules = torch.load(folder / "model.pt", map_location="cpu", weights_only=True)
        tensors = torch.load(folder / "rng.pt", map_location="cpu", weights_only=True)
        restore_rng(RNGState(tensors, state["rng"]["numpy"], state["rng"]["python"]))
        return TrainState(int(state["epoch"]), int(state["grad_step"]), list(state["rows"]), modules, folder)
    except Exception as e:  # torch raises UnpicklingError / RuntimeError on a damaged file, json ValueError
        raise PolicyError(
            f"{folder}: damaged resume state ({type(e).__name__}: {e}); delete {out} to start over"
        ) from e


def restore_modules(algo: Any, state: TrainState) -> None:
    """Load the saved module states (weights, Adam, targets) into a built algorithm and set its step counter."""
    try:
        for key, module in algo.impl.modules.create_checkpointer("cpu:0").modules.items():
            module.load_state_dict(state.modules[key])
    except (KeyError, RuntimeError, ValueError) as e:
        raise PolicyError(
            f"{state.folder}: the saved modules do not fit this algorithm ({type(e).__name__}: {e})"
        ) from e
    algo.set_grad_step(state.grad_step)  # d3rlpy's hook for restarting mid-training (target-sync schedule)


def clear_state(out: Path) -> None:
    """A fresh (not resumed) run drops any earlier run's resume state."""
    shutil.rmtree(out / RESUME_DIR, ignore_errors=True)


__all__ = [
    "RESUME_DIR",
    "TrainState",
    "clear_state",
    "load_state",
    "restore_modules",
    "save_state",
]
