"""The run directory: what every job, experiment and checkpoint writes beside its results, in one place.

* **The resolved config** (:func:`write_config`): ``config.json``, the config in its JSON form
  (:func:`config_json`: dataclasses → objects in field order, tuples → lists, anything JSON lacks → its ``str``),
  indented by 2, one trailing newline, written atomically; :func:`provenance` adds the machine and the time for
  the runs that depend on them.
* **The resume check** (:func:`check_config`): a run continued in the same directory must run under the config it
  was started with. The saved and the current config are compared leaf by leaf (dotted names, ``trainer.lr``) and
  ONE :class:`ConfigMismatchError` names every differing field with its saved and current values and the file. What a
  resume may legitimately change is declared by the caller: ``may_differ`` (any value: the number of stages to extend
  to, how many checkpoints to keep) and ``may_extend`` (a list that may only grow at its end: schemes appended to a
  benchmark).
* **The process-wide RNGs** (:func:`capture_rng` / :func:`restore_rng`): torch's global generator (+ CUDA),
  numpy's legacy MT19937 (``np.random``) and Python's ``random``, as tensors and JSON scalars, so a killed run
  resumes bit-identical to one that never stopped.
* **Metrics** (:class:`MetricsWriter`): the one writer of flat metrics rows, ``{name}.jsonl`` (the record),
  ``{name}.csv`` (columns = the union of the keys, first-seen order) and, on request, TensorBoard event files.
* **Tables** (:func:`write_table`): a CSV with a fixed header, written whole or appended to row by row.
* **Atomic writes** (:func:`atomic_path`, :func:`write_text_atomic`): a file is written beside its destination and
  renamed over it, so a full disk (ENOSPC), a read-only folder (EROFS) or a kill mid-write leaves the previous file
  (or none) in place, never a half-written one. Used for the config, datasets and checkpoints; trajectory files are
  append-only instead (:mod:`trajectories.store`).
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import io
import json
import math
import os
import platform
import random
import shutil
import time
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

CONFIG_FILE = "config.json"
ABSENT = "<absent>"  # stands for a field one side of a comparison lacks


class RunDirError(ValueError):
    """A run directory's file is missing, damaged or does not fit the current run; the message names the file."""


class ConfigMismatchError(RunDirError):
    """A run continued under a config that differs from the one it was started with; the message names every
    differing field (saved → current) and the file."""


# ----------------------------------------------------------------------------------------------------------------
# atomic writes


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str], what: str = "file") -> Iterator[Path]:
    """``with atomic_path(p) as tmp: write(tmp)``: ``tmp`` is renamed to ``p`` (after an fsync) when the block ends
    without an error; otherwise it is removed and an ``OSError`` names ``p`` and says the old one is unchanged."""
    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f".{final.name}.partial-{os.getpid()}")
    try:
        yield tmp
        if tmp.is_file():
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        os.replace(tmp, final)
    except OSError as e:
        _remove(tmp)
        old = "the previous one is unchanged" if final.exists() else "nothing was left behind"
        raise OSError(e.errno, f"{e.strerror or e}: could not write the {what} ({old})", str(final)) from e
    except BaseException:
        _remove(tmp)
        raise


def _remove(p: Path) -> None:
    with contextlib.suppress(OSError):
        if p.is_dir():
            shutil.rmtree(p)
        else:
            p.unlink()


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` to a temporary sibling, then rename it over ``path`` (readers see the old or the new file).
    No fsync: for files rewritten often (metrics, a checkpoint's pointer), where :func:`atomic_path` is too slow."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


# ----------------------------------------------------------------------------------------------------------------
# the resolved config


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def config_json(config: Any) -> Any:
    """The JSON form of a config, as written and compared: dataclasses → objects (field order), tuples → lists,
    keys → strings, anything else JSON lacks (a ``Path``, a numpy number) → its ``str``."""
    return json.loads(json.dumps(_plain(config), default=str))


def write_config(run_dir: str | os.PathLike[str], config: Any, name: str = CONFIG_FILE) -> Path:
    """Write ``run_dir/name`` (default ``config.json``): :func:`config_json` of ``config``, indented by 2, with a
    trailing newline, atomically (a kill leaves the previous file or none). Returns the path."""
    config_file = Path(run_dir) / name
    with atomic_path(config_file, "resolved config") as tmp:
        tmp.write_text(json.dumps(config_json(config), indent=2) + "\n", encoding="utf-8")
    return config_file


def provenance() -> dict[str, Any]:
    """Where and when a config was written (``machine``: platform and Python version; ``written_at``: local time),
    for the configs of runs that depend on the machine (LLM workers, a team file)."""
    return {
        "machine": {"platform": platform.platform(), "python": platform.python_version()},
        "written_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def read_config(path: str | os.PathLike[str]) -> Any:
    """A saved config; a missing or unreadable file is a :class:`RunDirError` naming it."""
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as e:
        raise RunDirError(f"{path}: no saved config to compare the run with") from e
    except (OSError, ValueError) as e:
        raise RunDirError(f"{path}: cannot read the run's saved config ({e})") from e


# ----------------------------------------------------------------------------------------------------------------
# the resume check


class ConfigDifference(NamedTuple):
    """One leaf where a saved and a current config differ (:data:`ABSENT` where one side lacks it)."""

    field: str  # dotted name: "trainer.lr", "team.model.hidden_size"
    saved: Any
    current: Any


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """A nested JSON object as ``{dotted.name: leaf}``; lists and empty objects are leaves."""
    if isinstance(value, dict) and (value or not prefix):
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: value}


def _same(a: Any, b: Any) -> bool:
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


def _under(name: str, fields: Collection[str]) -> bool:
    return any(name == f or name.startswith(f + ".") for f in fields)


def config_differences(
    saved: Any, current: Any, *, may_differ: Collection[str] = (), may_extend: Collection[str] = ()
) -> list[ConfigDifference]:
    """Every leaf where ``saved`` (as read back from JSON) and ``current`` (any config, taken as :func:`config_json`)
    differ, sorted by name, less the allowed ones: a field in (or under) ``may_differ`` may hold any value; a list
    in ``may_extend`` may be the saved one with items appended."""
    a, b = flatten(saved), flatten(config_json(current))
    out = []
    for k in sorted(a.keys() | b.keys()):
        x, y = a.get(k, ABSENT), b.get(k, ABSENT)
        if _same(x, y) or _under(k, may_differ):
            continue
        if k in may_extend and isinstance(x, list) and isinstance(y, list) and y[: len(x)] == x:
            continue
        out.append(ConfigDifference(k, x, y))
    return out


def same_config(path: str | os.PathLike[str], current: Any) -> bool:
    """Whether ``path`` holds exactly ``current`` (False when it holds no config or an unreadable one): a job that
    reuses a finished run of the same config and starts afresh otherwise."""
    try:
        return not config_differences(read_config(path), current)
    except RunDirError:
        return False


def check_config(
    path: str | os.PathLike[str],
    current: Any,
    *,
    saved: Any = None,
    may_differ: Collection[str] = (),
    may_extend: Collection[str] = (),
    hint: str = "",
) -> None:
    """Refuse to continue the run whose config is saved in ``path`` under another config: ONE
    :class:`ConfigMismatchError` names the file and every differing field with its saved and current values.

    ``saved``: the saved config when already read (a checkpoint's); default: read from ``path``
    (:class:`RunDirError` when it cannot be). ``may_differ`` / ``may_extend``: :func:`config_differences`.
    ``hint``: what to do instead, appended to the message."""
    path = Path(path)
    diffs = config_differences(
        read_config(path) if saved is None else saved, current, may_differ=may_differ, may_extend=may_extend
    )
    if not diffs:
        return
    fields = "; ".join(f"{d.field} {d.saved!r} → {d.current!r}" for d in diffs)
    n = f"{len(diffs)} field{'s' if len(diffs) > 1 else ''}"
    raise ConfigMismatchError(
        f"cannot resume from {path}: its config differs from the current one in {n} (saved → current): {fields}"
        + (f"; {hint}" if hint else "")
    )


# ----------------------------------------------------------------------------------------------------------------
# the process-wide RNGs


@dataclass
class RNGState:
    """The process-wide RNGs at one moment, split as a checkpoint stores them."""

    tensors: dict[str, Any]  # torch.save-able: "torch_global", "torch_cuda_{i}", "numpy_keys" (MT19937 key, int64)
    numpy: dict[str, Any]  # numpy's legacy RNG scalars: kind, pos, has_gauss, cached_gaussian (JSON)
    python: dict[str, Any] | None = None  # random.getstate() as JSON (version, internal, gauss_next); None: not kept


def capture_rng(*, python: bool = True) -> RNGState:
    """The state of torch's CPU generator (+ every CUDA one), numpy's legacy ``np.random`` and, with ``python``,
    Python's ``random``."""
    import numpy as np
    import torch

    tensors = {"torch_global": torch.get_rng_state()}
    if torch.cuda.is_available():
        tensors.update({f"torch_cuda_{i}": s for i, s in enumerate(torch.cuda.get_rng_state_all())})
    kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    tensors["numpy_keys"] = torch.from_numpy(np.asarray(keys, dtype=np.int64))
    numpy = {"kind": kind, "pos": int(pos), "has_gauss": int(has_gauss), "cached_gaussian": float(cached)}
    py = None
    if python:
        version, internal, gauss_next = random.getstate()
        py = {"version": version, "internal": list(internal), "gauss_next": gauss_next}
    return RNGState(tensors, numpy, py)


def restore_rng(state: RNGState) -> None:
    """Set the process-wide RNGs to what :func:`capture_rng` captured (Python's only when it was kept)."""
    import numpy as np
    import torch

    torch.set_rng_state(state.tensors["torch_global"])
    cuda = [state.tensors[k] for k in sorted(k for k in state.tensors if k.startswith("torch_cuda_"))]
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda)
    keys = state.tensors["numpy_keys"].numpy().astype(np.uint32)
    n = state.numpy
    np.random.set_state((n["kind"], keys, n["pos"], n["has_gauss"], n["cached_gaussian"]))
    if state.python is not None:
        p = state.python
        random.setstate((p["version"], tuple(p["internal"]), p["gauss_next"]))


# ----------------------------------------------------------------------------------------------------------------
# metrics


# a row's TensorBoard step: the first of these keys it holds, else its index in the file
STEP_KEYS: tuple[str, ...] = ("step", "global_step", "timesteps", "update", "stage", "epoch")


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a metrics JSONL. A last line cut by a kill is dropped; any other bad line is a ``ValueError``
    naming the file and line."""
    lines = path.read_text(encoding="utf-8").splitlines()
    out: list[dict[str, Any]] = []
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            if n == len(lines):
                break  # the write a kill interrupted
            raise ValueError(f"{path}:{n}: not a JSON metrics row ({e.msg})") from e
        if not isinstance(row, dict):
            raise ValueError(f"{path}:{n}: a metrics row is a JSON object, got {type(row).__name__}")
        out.append(row)
    return out


class MetricsWriter:
    """Appends flat metrics rows to ``{name}.jsonl`` / ``{name}.csv`` of ``run_dir`` (and TensorBoard if asked).

    Rows are flat mappings of namespaced keys (``losses/…``, ``kl/…``, ``rollout/…``, ``perf/…``,
    ``agent/{name}/…``). The JSONL is appended and flushed at every :meth:`append`. The CSV is appended too, and
    rewritten atomically when a row brings a new key, so a column that first appears late still gets its header. In
    TensorBoard (``tensorboard/{name}/``) every numeric value of a row is a scalar under its key, at the row's step
    (:data:`STEP_KEYS`).

    ``rows``: the rows already there that the run keeps (a resume); the files are rewritten to hold exactly them, and
    only the rows appended afterwards go to TensorBoard, so a resume adds no duplicate points. ``resume=True``
    without ``rows`` keeps whatever ``{name}.jsonl`` holds. Otherwise the files start empty."""

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        name: str = "metrics",
        rows: Sequence[Mapping[str, Any]] | None = None,
        *,
        resume: bool = False,
        tensorboard: bool = False,
    ) -> None:
        run_dir = Path(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        self.jsonl = run_dir / f"{name}.jsonl"
        self.csv = run_dir / f"{name}.csv"
        if rows is None and resume and self.jsonl.exists():
            rows = read_rows(self.jsonl)
        self.rows: list[dict[str, Any]] = [dict(r) for r in rows or ()]
        self.columns: list[str] = []
        self._add_columns(self.rows)
        write_text_atomic(self.jsonl, "".join(json.dumps(r) + "\n" for r in self.rows))
        self._rewrite_csv()
        self.tensorboard_dir = run_dir / "tensorboard" / name if tensorboard else None
        self._tb: Any = None
        if self.tensorboard_dir is not None:
            from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package

            self._tb = SummaryWriter(log_dir=str(self.tensorboard_dir))

    def _add_columns(self, rows: Iterable[Mapping[str, Any]]) -> bool:
        seen = set(self.columns)
        new = False
        for r in rows:
            for k in r:
                if k not in seen:
                    seen.add(k)
                    self.columns.append(k)
                    new = True
        return new

    def _rewrite_csv(self) -> None:
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=self.columns, restval="")
        w.writeheader()
        w.writerows(self.rows)
        write_text_atomic(self.csv, buf.getvalue())

    def append(self, new_rows: Sequence[Mapping[str, Any]]) -> None:
        rows = [dict(r) for r in new_rows]
        if not rows:
            return
        first = len(self.rows)
        self.rows.extend(rows)
        with self.jsonl.open("a", encoding="utf-8") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
        if self._add_columns(rows):
            self._rewrite_csv()
        else:
            with self.csv.open("a", encoding="utf-8", newline="") as f:
                csv.DictWriter(f, fieldnames=self.columns, restval="").writerows(rows)
        if self._tb is not None:
            for i, r in enumerate(rows, start=first):
                step = next((int(r[k]) for k in STEP_KEYS if isinstance(r.get(k), int | float)), i)
                for k, v in r.items():
                    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
                        continue
                    self._tb.add_scalar(k, float(v), global_step=step)
            self._tb.flush()

    def write(self, row: Mapping[str, Any]) -> None:
        """Append one row."""
        self.append([row])

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
            self._tb = None


# ----------------------------------------------------------------------------------------------------------------
# tables


def write_table(
    path: str | os.PathLike[str],
    rows: Iterable[Any],
    fields: Iterable[str] | None = None,
    *,
    append: bool = False,
) -> Path:
    """A CSV table at ``path``: the header ``fields`` (default: the first row's keys), then one line per row (a
    mapping or a dataclass). ``append``: add the rows under the file's header (written first when the file is new).
    A table that must never be seen half-written is written to :func:`atomic_path`'s file."""
    path = Path(path)
    rows = [dataclasses.asdict(r) if dataclasses.is_dataclass(r) else r for r in rows]  # type: ignore[arg-type]
    header = list(fields) if fields is not None else list(rows[0])
    new = not append or not path.exists()
    with path.open("a" if append else "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=header)
        if new:
            w.writeheader()
        w.writerows(rows)
    return path


__all__ = [
    "ABSENT",
    "CONFIG_FILE",
    "STEP_KEYS",
    "ConfigDifference",
    "ConfigMismatchError",
    "MetricsWriter",
    "RNGState",
    "RunDirError",
    "atomic_path",
    "capture_rng",
    "check_config",
    "config_differences",
    "config_json",
    "flatten",
    "provenance",
    "read_config",
    "read_rows",
    "restore_rng",
    "same_config",
    "write_config",
    "write_table",
    "write_text_atomic",
]
