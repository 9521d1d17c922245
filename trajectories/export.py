"""Flat tables of trajectories: Arrow / Parquet / pandas / Hugging Face `datasets`.

Why: JSONL is the durable, append-only record; analysis and training want columns. Two tables:

- ``"steps"``: one row per conductor step, with the episode-level columns repeated (episode_id,
  run_id, task_id, family, split, difficulty, conductor, success, return) so a row stands alone
  for filtering and group-bys; the step's decoded action, the worker's message summary, the reward
  scalar and one ``reward_<name>`` column per named reward (null where an episode lacks that name),
  ``observation`` as ``list<float32>`` (the env's dtype), ``action_mask`` as ``list<int8>`` and the
  raw ``state`` as a JSON string (nested, per-family shapes do not fit a fixed Arrow schema);
- ``"episodes"``: one row per episode (task, team, conductor, outcome, usage, final observation).

The table kind and schema version are stored in the Parquet schema metadata, so `load_pandas`
refuses to read a steps file as an episodes table. pyarrow, pandas and datasets are imported
lazily: importing `trajectories` must stay cheap for the CLI and for worker processes.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from trajectories.schema import SCHEMA_VERSION, Episode
from trajectories.store import PathLike, TrajectoryWarning, read_many

if TYPE_CHECKING:
    import datasets
    import pandas as pd
    import pyarrow as pa

TableKind = Literal["steps", "episodes"]
TABLES: tuple[str, ...] = ("steps", "episodes")
PARQUET_SUFFIXES = (".parquet", ".pq")
_META_TABLE = b"orchestra.table"
_META_VERSION = b"orchestra.schema_version"


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _episodes(source: Iterable[Episode] | PathLike, *, strict: bool) -> list[Episode]:
    """Episodes from objects, or from JSONL file(s)/directory; problems raise unless ``strict=False``."""
    if not isinstance(source, str | os.PathLike):
        return list(source)
    report = read_many(source, strict=strict)
    for problem in report.problems:  # only reached when strict=False: say what was skipped
        warnings.warn(str(problem), TrajectoryWarning, stacklevel=3)
    return report.episodes


def steps_table(episodes: Iterable[Episode]) -> pa.Table:
    """One row per step (see the module docstring for the columns)."""
    import pyarrow as pa

    episodes = list(episodes)
    reward_names = sorted({name for ep in episodes for step in ep.steps for name in step.reward.named})
    if "scalar" in reward_names:
        raise ValueError("a named reward called 'scalar' would collide with the reward_scalar column; rename it")
    fields: list[tuple[str, pa.DataType]] = [
        ("episode_id", pa.string()),
        ("run_id", pa.string()),
        ("task_id", pa.string()),
        ("family", pa.string()),
        ("split", pa.string()),
        ("difficulty", pa.int64()),
        ("conductor", pa.string()),
        ("success", pa.bool_()),
        ("return", pa.float64()),
        ("t", pa.int64()),
        ("action_id", pa.int64()),
        ("action_kind", pa.string()),
        ("worker", pa.string()),
        ("instruction", pa.string()),
        ("message_text", pa.string()),
        ("model_id", pa.string()),
        ("verdict", pa.string()),
        ("prompt_tokens", pa.int64()),
        ("completion_tokens", pa.int64()),
        ("reward_scalar", pa.float64()),
        *[(f"reward_{name}", pa.float64()) for name in reward_names],
        ("terminated", pa.bool_()),
        ("truncated", pa.bool_()),
        ("observation", pa.list_(pa.float32())),
        ("action_mask", pa.list_(pa.int8())),
        ("state", pa.string()),
    ]
    columns: dict[str, list[Any]] = {name: [] for name, _ in fields}
    for ep in episodes:
        for step in ep.steps:
            msg = step.message
            row: dict[str, Any] = {
                "episode_id": ep.episode_id,
                "run_id": ep.run_id,
                "task_id": ep.task.id,
                "family": ep.task.family,
                "split": ep.task.split,
                "difficulty": ep.task.difficulty,
                "conductor": ep.conductor.name,
                "success": ep.success,
                "return": ep.return_,
                "t": step.t,
                "action_id": step.action.id,
                "action_kind": step.action.kind,
                "worker": step.action.worker,
                "instruction": step.action.instruction,
                "message_text": None if msg is None else msg.text,
                "model_id": None if msg is None else msg.model_id,
                "verdict": None if msg is None else msg.verdict,
                "prompt_tokens": None if msg is None else msg.prompt_tokens,
                "completion_tokens": None if msg is None else msg.completion_tokens,
                "reward_scalar": step.reward.scalar,
                **{f"reward_{name}": step.reward.named.get(name) for name in reward_names},
                "terminated": step.terminated,
                "truncated": step.truncated,
                "observation": step.observation,
                "action_mask": step.action_mask,
                "state": _dumps(step.state),
            }
            for name, values in columns.items():
                values.append(row[name])
    return _table(columns, fields, "steps")


def episodes_table(episodes: Iterable[Episode]) -> pa.Table:
    """One row per episode (see the module docstring)."""
    import pyarrow as pa

    fields: list[tuple[str, pa.DataType]] = [
        ("episode_id", pa.string()),
        ("run_id", pa.string()),
        ("schema_version", pa.int64()),
        ("task_id", pa.string()),
        ("family", pa.string()),
        ("split", pa.string()),
        ("task_seed", pa.int64()),
        ("difficulty", pa.int64()),
        ("team", pa.string()),
        ("workers", pa.list_(pa.string())),
        ("conductor", pa.string()),
        ("checkpoint", pa.string()),
        ("seed", pa.int64()),
        ("num_steps", pa.int64()),
        ("return", pa.float64()),
        ("success", pa.bool_()),
        ("score", pa.float64()),
        ("terminated", pa.bool_()),
        ("truncated", pa.bool_()),
        ("total_tokens", pa.int64()),
        ("wall_time_s", pa.float64()),
        ("usage", pa.string()),
        ("metadata", pa.string()),
        ("final_observation", pa.list_(pa.float32())),
    ]
    columns: dict[str, list[Any]] = {name: [] for name, _ in fields}
    for ep in episodes:
        wall = ep.usage.get("wall_time_s")
        row: dict[str, Any] = {
            "episode_id": ep.episode_id,
            "run_id": ep.run_id,
            "schema_version": ep.schema_version,
            "task_id": ep.task.id,
            "family": ep.task.family,
            "split": ep.task.split,
            "task_seed": ep.task.seed,
            "difficulty": ep.task.difficulty,
            "team": ep.team.name,
            "workers": ep.team.workers,
            "conductor": ep.conductor.name,
            "checkpoint": ep.conductor.checkpoint,
            "seed": ep.seed,
            "num_steps": len(ep.steps),
            "return": ep.return_,
            "success": ep.success,
            "score": ep.score,
            "terminated": ep.terminated,
            "truncated": ep.truncated,
            "total_tokens": ep.total_tokens,
            "wall_time_s": None if wall is None else float(wall),
            "usage": _dumps(ep.usage),
            "metadata": _dumps(ep.metadata),
            "final_observation": ep.final_observation,
        }
        for name, values in columns.items():
            values.append(row[name])
    return _table(columns, fields, "episodes")


def _table(columns: dict[str, list[Any]], fields: list[tuple[str, pa.DataType]], kind: str) -> pa.Table:
    import pyarrow as pa

    metadata = {_META_TABLE: kind.encode(), _META_VERSION: str(SCHEMA_VERSION).encode()}
    schema = pa.schema([pa.field(name, dtype) for name, dtype in fields], metadata=metadata)
    return pa.Table.from_pydict(columns, schema=schema)


def to_table(
    episodes_or_path: Iterable[Episode] | PathLike, table: TableKind = "steps", *, strict: bool = True
) -> pa.Table:
    """The Arrow table of episodes, or of JSONL file(s)/directory, or read back from a Parquet file.

    With a JSONL source, ``strict=True`` (default) refuses a file with problems (the error names
    file and line); ``strict=False`` skips bad lines with a `TrajectoryWarning` each.
    """
    if table not in TABLES:
        raise ValueError(f"table must be one of {list(TABLES)}, got {table!r}")
    if isinstance(episodes_or_path, str | os.PathLike) and Path(episodes_or_path).suffix in PARQUET_SUFFIXES:
        return _read_parquet(Path(episodes_or_path), table)
    episodes = _episodes(episodes_or_path, strict=strict)
    return steps_table(episodes) if table == "steps" else episodes_table(episodes)


def to_parquet(
    episodes_or_path: Iterable[Episode] | PathLike,
    out_path: PathLike,
    table: TableKind = "steps",
    *,
    strict: bool = True,
) -> Path:
    """Write the ``table`` of episodes (or of JSONL file(s)/directory) to a Parquet file; returns its path."""
    import pyarrow.parquet as pq

    out = Path(out_path)
    arrow = to_table(episodes_or_path, table, strict=strict)
    out.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(arrow, out)
    return out


def _read_parquet(path: Path, table: TableKind) -> pa.Table:
    import pyarrow.parquet as pq

    if not path.exists():
        raise FileNotFoundError(2, "parquet file not found", str(path))
    arrow = pq.read_table(path)
    kind = (arrow.schema.metadata or {}).get(_META_TABLE)
    if kind is not None and kind.decode() != table:
        raise ValueError(f"{path} holds the {kind.decode()!r} table, not {table!r}; pass table={kind.decode()!r}")
    return arrow


def load_pandas(path: PathLike, table: TableKind = "steps", *, strict: bool = True) -> pd.DataFrame:
    """A DataFrame of the ``table``, from JSONL file(s)/directory or a Parquet file (by suffix)."""
    return to_table(path, table, strict=strict).to_pandas()


def load_dataset(path: PathLike, table: TableKind = "steps", *, strict: bool = True) -> datasets.Dataset:
    """A Hugging Face `datasets.Dataset` of the ``table``, in memory (no cache directory is written)."""
    import datasets

    return datasets.Dataset(to_table(path, table, strict=strict))
