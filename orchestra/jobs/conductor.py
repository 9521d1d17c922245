"""The conductor-learning jobs of phase 1, one step each: build an offline dataset from trajectories, train an offline
conductor with d3rlpy, estimate its value from logs (FQE), and distil a conductor into readable rules.
(``orchestra reproduce conductor`` runs them all: :mod:`orchestra.jobs.phase1`; online PPO:
:mod:`orchestra.jobs.conductor_ppo`.)"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from policies.learning.dataset import ConductorDataset, DatasetFilter
from policies.learning.distill import DistillConfig, DistillResult
from policies.learning.offline import FQEConfig, OfflineConfig, TrainResult


def team_encoder(team: str) -> tuple[Any, Any]:
    """(TeamSpec, ObservationEncoder) of a team name or file."""
    from envs.observation import ObservationEncoder
    from orchestra.runtime.team_file import load_team

    spec = load_team(team)
    return spec, ObservationEncoder(spec.env)


def parse_weights(items: tuple[str, ...]) -> dict[str, float]:
    """``("turn_cost=0.05", …)`` → ``{"turn_cost": 0.05}`` (ValueError naming the bad item)."""
    out: dict[str, float] = {}
    for item in items:
        key, sep, value = item.partition("=")
        try:
            if not sep:
                raise ValueError
            out[key.strip()] = float(value)
        except ValueError:
            raise ValueError(f"--weight {item!r}: expected COMPONENT=NUMBER, e.g. turn_cost=0.05") from None
    return out


# ----------------------------------------------------------------------------------------------------------------
# dataset


@dataclass(frozen=True)
class DatasetBuildConfig:
    """``orchestra dataset build``: trajectory files → an offline dataset (.npz), states re-encoded with the team's
    current encoder, rewards re-scalarised with the weights chosen now."""

    team: str  # the team the trajectories were recorded with (built-in name or YAML)
    inputs: tuple[str, ...]  # trajectory JSONL files or directories
    out: str  # output .npz (a .summary.json is written beside it)
    filters: DatasetFilter = DatasetFilter()  # which episodes to keep
    weights: tuple[str, ...] = ()  # reward weights COMPONENT=NUMBER (default: the team's)
    seed: int = 0  # accepted like every command's; building a dataset draws no random numbers


@dataclass(frozen=True)
class BuiltDataset:
    """What :func:`build_dataset` made: the dataset, its summary (episodes, decisions, actions, returns) and the
    ``.npz`` written (its ``.summary.json`` beside it)."""

    dataset: ConductorDataset
    summary: dict[str, Any]
    path: Path


def build_dataset(cfg: DatasetBuildConfig) -> BuiltDataset:
    """Trajectory files → an offline dataset of conductor decisions, written to ``cfg.out``."""
    from policies.learning.dataset import build_dataset as encode_episodes

    weights = parse_weights(cfg.weights)
    team, enc = team_encoder(cfg.team)
    paths: list[Path] = []
    for item in cfg.inputs:
        p = Path(item)
        paths.extend(sorted(p.glob("*.jsonl")) if p.is_dir() else [p])
    ds = encode_episodes(paths, team.env, enc, weights=weights, filters=cfg.filters)
    out = ds.save(cfg.out)
    summary = ds.summary()
    out.with_suffix(".summary.json").write_text(json.dumps(summary, indent=2))
    return BuiltDataset(ds, summary, out)


# ----------------------------------------------------------------------------------------------------------------
# train


@dataclass(frozen=True)
class TrainConfig:
    """``orchestra train``: an offline conductor trained with d3rlpy on a dataset."""

    dataset: str  # dataset .npz from `orchestra dataset build`
    out: str  # checkpoint / run directory
    team: str | None = None  # check the dataset's layout against this team first (built-in name or YAML)
    offline: OfflineConfig = field(default_factory=OfflineConfig)  # the algorithm and every training knob
    # continue a killed run in --out from its last finished epoch (bit-identical to an uninterrupted run on CPU;
    # the same dataset and knobs are required)
    resume: bool = False
    tensorboard: bool = False  # also write the metrics as TensorBoard event files (OUT/tensorboard/metrics/)


@dataclass(frozen=True)
class TrainedConductor:
    """What :func:`train_conductor` made: the dataset it learned from and d3rlpy's result (the conductor, its
    checkpoint folder, one metrics row per epoch)."""

    dataset: ConductorDataset
    result: TrainResult
    algo: str

    @property
    def spec(self) -> str:
        """The conductor as ``record``/``evaluate`` name it: ``ALGO:CHECKPOINT``."""
        return f"{self.algo}:{self.result.run_dir}"


def train_conductor(cfg: TrainConfig, progress: bool = True) -> TrainedConductor:
    """An offline conductor trained on ``cfg.dataset`` into ``cfg.out`` (``cfg.resume`` continues a killed run)."""
    from policies.learning.offline import train_offline

    ds = ConductorDataset.load(cfg.dataset)
    if cfg.team:
        team, enc = team_encoder(cfg.team)
        ds.check_layout(team.env, enc, where=cfg.dataset)
    res = train_offline(ds, cfg.offline, cfg.out, progress=progress, resume=cfg.resume, tensorboard=cfg.tensorboard)
    return TrainedConductor(ds, res, cfg.offline.algo)


# ----------------------------------------------------------------------------------------------------------------
# off-policy evaluation


@dataclass(frozen=True)
class OPEConfig:
    """``orchestra ope``: a learned conductor's value estimated from logged data alone (d3rlpy FQE)."""

    checkpoint: str  # conductor checkpoint folder
    dataset: str  # logged data .npz to evaluate on
    team: str  # the team (its encoder recovers action masks)
    out: str | None = None  # write the estimate as JSON here
    fqe: FQEConfig = field(default_factory=FQEConfig)  # FQE's knobs


def ope_job(cfg: OPEConfig) -> dict[str, Any]:
    """The FQE estimate (and the logged behaviour's return) as a JSON-able dict, also written to ``cfg.out``."""
    from policies.learning.learned import load_conductor
    from policies.learning.offline import fqe_evaluate

    team, enc = team_encoder(cfg.team)
    ds = ConductorDataset.load(cfg.dataset)
    ds.check_layout(team.env, enc, where=cfg.dataset)
    conductor = load_conductor(cfg.checkpoint, team.env, enc)
    predict = getattr(conductor, "predict", None)
    if predict is None:  # a conductor without a batched predict: one decision at a time

        def predict(obs: Any, masks: Any) -> Any:
            return np.array([conductor.act(o, m) for o, m in zip(obs, masks, strict=True)])

    res = fqe_evaluate(predict, ds, enc.legal_mask, cfg.fqe)
    out = {
        "checkpoint": cfg.checkpoint,
        "dataset": cfg.dataset,
        "episodes": res.episodes,
        "fqe_estimate": res.estimate,
        "behaviour_return": res.behaviour_return,
        "gamma": cfg.fqe.gamma,
    }
    if cfg.out:
        Path(cfg.out).parent.mkdir(parents=True, exist_ok=True)
        Path(cfg.out).write_text(json.dumps(out, indent=2))
    return out


# ----------------------------------------------------------------------------------------------------------------
# distillation


@dataclass(frozen=True)
class DistillJob:
    """``orchestra distill``: a conductor (learned or rule-based) distilled into a readable decision tree."""

    dataset: str  # states to label (.npz)
    team: str  # the team (built-in name or YAML)
    out: str  # folder for rules.txt, tree.npz, distill.json
    checkpoint: str | None = None  # learned conductor folder (or give conductor)
    conductor: str | None = None  # rule-based conductor name (or give checkpoint)
    distill: DistillConfig = field(default_factory=DistillConfig)  # tree depth, features, held-out share, seed


def distill_job(cfg: DistillJob) -> DistillResult:
    from orchestra.runtime.conductors import conductor_factory
    from policies.learning.distill import distill, labels_from_conductor

    if (cfg.checkpoint is None) == (cfg.conductor is None):
        raise ValueError(
            "distill: give exactly one of checkpoint (a learned conductor) and conductor (a rule-based one)"
        )
    team, enc = team_encoder(cfg.team)
    ds = ConductorDataset.load(cfg.dataset)
    ds.check_layout(team.env, enc, where=cfg.dataset)
    spec = f"learned:{cfg.checkpoint}" if cfg.checkpoint else str(cfg.conductor)
    seed = cfg.distill.seed
    conductor = conductor_factory(spec, team, seed)()
    labels = labels_from_conductor(conductor, ds.observations, ds.masks, ds.states, ds.episode_index, reset_seed=seed)
    res = distill(
        labels,
        ds.observations,
        ds.masks,
        ds.feature_names,
        ds.action_labels,
        cfg.distill,
        episode_index=ds.episode_index,
    )
    res.save(Path(cfg.out))
    return res


__all__ = [
    "DatasetBuildConfig",
    "DistillJob",
    "OPEConfig",
    "TrainConfig",
    "BuiltDataset",
    "build_dataset",
    "distill_job",
    "ope_job",
    "parse_weights",
    "team_encoder",
    "TrainedConductor",
    "train_conductor",
]
