"""orchestra: learn how to run a team of LLM agents.

The Python API is the functions the command line calls, each taking the same config dataclass that the command's
flags fill (a default is declared once, in the dataclass), so a script and ``orchestra COMMAND`` run one code path::

    import orchestra as oc

    rec = oc.record(oc.RecordConfig(team="arithmetic", conductor="round_robin", episodes=8), out="runs/x.jsonl")
    built = oc.build_dataset(oc.DatasetBuildConfig(team="arithmetic", inputs=(str(rec.trajectories),), out="d.npz"))
    bc = oc.train_conductor(oc.TrainConfig(dataset=str(built.path), out="runs/bc"))
    ev = oc.evaluate(oc.EvaluateConfig(teams=("arithmetic",), conductors=("round_robin", bc.spec)), "runs/eval")

=========================  ===========================================  =====================================
function                   config → result                              command
=========================  ===========================================  =====================================
:func:`load_team`          team name or YAML file → :class:`TeamSpec`   ``orchestra teams``
:func:`record`             :class:`RecordConfig` → :class:`RecordResult`  ``orchestra record``
:func:`build_dataset`      :class:`DatasetBuildConfig` → :class:`BuiltDataset`  ``orchestra dataset build``
:func:`train_conductor`    :class:`TrainConfig` → :class:`TrainedConductor`  ``orchestra train``
:func:`evaluate`           :class:`EvaluateConfig` → :class:`Evaluation`  ``orchestra evaluate``
:func:`finetune`           :class:`FinetuneConfig` → :class:`FinetuneResult`  ``orchestra finetune`` (TeamTR)
=========================  ===========================================  =====================================

Names are imported on first use (``import orchestra`` loads no model stack). docs/api.md walks through them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from orchestra.jobs.conductor import (
        BuiltDataset,
        DatasetBuildConfig,
        TrainConfig,
        TrainedConductor,
        build_dataset,
        train_conductor,
    )
    from orchestra.jobs.evaluate import EvaluateConfig, Evaluation, evaluate
    from orchestra.jobs.finetune import FinetuneConfig, FinetuneResult, finetune
    from orchestra.jobs.record import RecordConfig, RecordResult, record
    from orchestra.runtime.session import RunOptions
    from orchestra.runtime.team_file import TeamSpec, load_team
    from orchestra.teamtr.config import TeamTRConfig
    from orchestra.teamtr.llm_config import LLMTeamConfig
    from policies.learning.offline import OfflineConfig

# public name → the module that defines it
_HOME = {
    "load_team": "orchestra.runtime.team_file",
    "TeamSpec": "orchestra.runtime.team_file",
    "RunOptions": "orchestra.runtime.session",
    "record": "orchestra.jobs.record",
    "RecordConfig": "orchestra.jobs.record",
    "RecordResult": "orchestra.jobs.record",
    "build_dataset": "orchestra.jobs.conductor",
    "DatasetBuildConfig": "orchestra.jobs.conductor",
    "BuiltDataset": "orchestra.jobs.conductor",
    "train_conductor": "orchestra.jobs.conductor",
    "TrainConfig": "orchestra.jobs.conductor",
    "TrainedConductor": "orchestra.jobs.conductor",
    "OfflineConfig": "policies.learning.offline",
    "evaluate": "orchestra.jobs.evaluate",
    "EvaluateConfig": "orchestra.jobs.evaluate",
    "Evaluation": "orchestra.jobs.evaluate",
    "finetune": "orchestra.jobs.finetune",
    "FinetuneConfig": "orchestra.jobs.finetune",
    "FinetuneResult": "orchestra.jobs.finetune",
    "TeamTRConfig": "orchestra.teamtr.config",
    "LLMTeamConfig": "orchestra.teamtr.llm_config",
}


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'orchestra' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = [
    "BuiltDataset",
    "DatasetBuildConfig",
    "EvaluateConfig",
    "Evaluation",
    "FinetuneConfig",
    "FinetuneResult",
    "LLMTeamConfig",
    "OfflineConfig",
    "RecordConfig",
    "RecordResult",
    "RunOptions",
    "TeamSpec",
    "TeamTRConfig",
    "TrainConfig",
    "TrainedConductor",
    "build_dataset",
    "evaluate",
    "finetune",
    "load_team",
    "record",
    "train_conductor",
]
