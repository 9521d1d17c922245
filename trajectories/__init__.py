"""Trajectory records and their store: the lowest layer of orchestra (imports nothing of ours).

- `schema`: `Episode` / `Step` / ... records with validating `to_dict` / `from_dict`.
- `store`: append-only, fsynced, resumable JSONL (`TrajectoryWriter`) and validating readers.
- `rundir`: the run directory: the resolved ``config.json``, the resume check, the process RNGs, the metrics writer,
  tables and atomic writes.
- `export`: Arrow / Parquet / pandas / `datasets` tables (pyarrow and friends imported lazily).
"""

from trajectories.export import episodes_table, load_dataset, load_pandas, steps_table, to_parquet, to_table
from trajectories.schema import (
    SCHEMA_VERSION,
    Action,
    ConductorRef,
    Episode,
    EpisodeError,
    Message,
    Reward,
    SchemaError,
    Step,
    TaskRef,
    TeamRef,
)
from trajectories.store import (
    Problem,
    ReadReport,
    TrajectoryFileError,
    TrajectoryWarning,
    TrajectoryWriter,
    iter_episodes,
    read_many,
    read_trajectories,
    summarize,
)

__all__ = [
    "SCHEMA_VERSION",
    "Action",
    "ConductorRef",
    "Episode",
    "EpisodeError",
    "Message",
    "Problem",
    "ReadReport",
    "Reward",
    "SchemaError",
    "Step",
    "TaskRef",
    "TeamRef",
    "TrajectoryFileError",
    "TrajectoryWarning",
    "TrajectoryWriter",
    "episodes_table",
    "iter_episodes",
    "load_dataset",
    "load_pandas",
    "read_many",
    "read_trajectories",
    "steps_table",
    "summarize",
    "to_parquet",
    "to_table",
]
