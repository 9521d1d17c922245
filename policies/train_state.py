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
mid-write leaves the previous epoch's state whole. The run's ``config.json`` is compared on resume: a different
algorithm, knob or dataset is refused, naming the field."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from policies.base import PolicyError
from trajectories.durable import atomic_path

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


def global_rng_state() -> tuple[dict[str, Any], dict[str, Any]]:
    """Process-wide RNG states as (tensors, numpy scalars): torch's CPU generator (+ CUDA), numpy's legacy MT19937
    keys as a tensor and its scalars as JSON-able values. Shared with phase 2's checkpoints
    (``orchestra.teamtr.checkpoint``)."""
    import torch

    tensors = {"torch_global": torch.get_rng_state()}
    if torch.cuda.is_available():
        tensors.update({f"torch_cuda_{i}": s for i, s in enumerate(torch.cuda.get_rng_state_all())})
    kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    tensors["numpy_keys"] = torch.from_numpy(np.asarray(keys, dtype=np.int64))
    return tensors, {"kind": kind, "pos": int(pos), "has_gauss": int(has_gauss), "cached_gaussian": float(cached)}


def set_global_rng_state(tensors: dict[str, Any], numpy_scalars: dict[str, Any]) -> None:
    """Restore what :func:`global_rng_state` captured."""
    import torch

    torch.set_rng_state(tensors["torch_global"])
    cuda = [tensors[k] for k in sorted(k for k in tensors if k.startswith("torch_cuda_"))]
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda)
    keys = tensors["numpy_keys"].numpy().astype(np.uint32)
    n = numpy_scalars
    np.random.set_state((n["kind"], keys, n["pos"], n["has_gauss"], n["cached_gaussian"]))


def _rng_state() -> tuple[dict[str, Any], dict[str, Any]]:
    tensors, numpy_scalars = global_rng_state()
    version, internal, gauss_next = random.getstate()
    python = {"version": version, "internal": list(internal), "gauss_next": gauss_next}
    return tensors, {"numpy": numpy_scalars, "python": python}


def _set_rng_state(tensors: dict[str, Any], scalars: dict[str, Any]) -> None:
    set_global_rng_state(tensors, scalars["numpy"])
    p = scalars["python"]
    random.setstate((p["version"], tuple(p["internal"]), p["gauss_next"]))


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
        tensors, scalars = _rng_state()
        torch.save(tensors, tmp / "rng.pt")
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
        _set_rng_state(tensors, state["rng"])
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


def _config_diffs(out: Path, current: dict[str, Any]) -> list[str]:
    path = out / "config.json"
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise PolicyError(f"{path}: cannot read the run's config to resume it ({e})") from e
    now = json.loads(json.dumps(current, default=str))
    return [
        f"{section}.{k}: {saved.get(section, {}).get(k)!r} in the run, {v!r} now"
        for section in ("offline", "dataset")
        for k, v in now.get(section, {}).items()
        if saved.get(section, {}).get(k) != v
    ]


def same_config(out: Path, current: dict[str, Any]) -> bool:
    """Whether ``out`` holds a run of exactly ``current`` (False when it holds none or an unreadable one)."""
    try:
        return not _config_diffs(out, current)
    except PolicyError:
        return False


def check_resume_config(out: Path, current: dict[str, Any]) -> None:
    """Refuse to resume a run whose ``config.json`` differs from ``current`` (naming the first differing fields)."""
    diffs = _config_diffs(out, current)
    if diffs:
        raise PolicyError(f"cannot resume {out}: the config differs ({'; '.join(diffs[:4])})")


def clear_state(out: Path) -> None:
    """A fresh (not resumed) run drops any earlier run's resume state."""
    shutil.rmtree(out / RESUME_DIR, ignore_errors=True)


__all__ = [
    "RESUME_DIR",
    "global_rng_state",
    "set_global_rng_state",
    "TrainState",
    "check_resume_config",
    "same_config",
    "clear_state",
    "load_state",
    "restore_modules",
    "save_state",
]
