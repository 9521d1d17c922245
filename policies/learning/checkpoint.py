"""Learned-conductor checkpoints: one folder per conductor, ``conductor.json`` (what it was trained
for) beside the weights, and one loader that refuses a checkpoint of another layout.

``conductor.json`` records the team, the observation layout (feature names, embedder) and the action
labels the network was trained on. A checkpoint is only ever run on the layout it was trained for: a
team with other workers or instructions, or an encoder with other features, is a clear error naming
the first difference, never a shape error from inside torch.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from envs.config import TeamEnvConfig
from envs.observation import ObservationEncoder
from policies.base import PolicyError
from trajectories.rundir import atomic_path

FORMAT = "orchestra-conductor/1"
META_FILE = "conductor.json"


class LayoutError(PolicyError):
    """A dataset or checkpoint was built for another observation layout or action space."""


def layout_hash(feature_names: Sequence[str], action_labels: Sequence[str]) -> str:
    """A short fingerprint of (observation layout, action space)."""
    blob = json.dumps([list(feature_names), list(action_labels)]).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def team_layout(config: TeamEnvConfig, encoder: ObservationEncoder) -> tuple[list[str], list[str]]:
    """(feature names, action labels) of a team under an encoder."""
    return encoder.feature_names(), [config.action_label(a) for a in range(config.num_actions)]


@dataclass
class ConductorMeta:
    """What a learned conductor was trained on (written as ``conductor.json``)."""

    algo: str  # bc | fbc | bcq | cql | ppo
    team: str  # team name the conductor was trained for
    embedder: str  # sentence encoder of the observation (minilm | hash | none)
    feature_names: list[str]  # observation layout, in order
    action_labels: list[str]  # action id -> "worker:instruction" or "submit"
    config: dict[str, Any] = field(default_factory=dict)  # the resolved training config
    dataset: dict[str, Any] = field(default_factory=dict)  # summary of the training data
    format: str = FORMAT

    @property
    def layout_hash(self) -> str:
        return layout_hash(self.feature_names, self.action_labels)

    def save(self, folder: Path) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / META_FILE
        data = {**asdict(self), "layout_hash": self.layout_hash}
        with atomic_path(path, "checkpoint metadata") as tmp:
            tmp.write_text(json.dumps(data, indent=2, default=str), encoding="utf-8")
        return path

    @classmethod
    def load(cls, folder: Path) -> ConductorMeta:
        path = folder / META_FILE
        if not path.exists():
            raise PolicyError(f"{folder}: not a conductor checkpoint ({META_FILE} missing)")
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise PolicyError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from e
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise PolicyError(
                f"{path}: format {data.get('format') if isinstance(data, dict) else None!r}, expected {FORMAT!r}"
            )
        data.pop("layout_hash", None)
        try:
            return cls(**data)
        except TypeError as e:
            raise PolicyError(f"{path}: {e}") from e

    def check_embedder(self, encoder: ObservationEncoder, where: str) -> None:
        check_same_embedder(self.embedder, encoder, where)

    def check_layout(self, feature_names: Sequence[str], action_labels: Sequence[str], where: str) -> None:
        """Raise :class:`LayoutError` naming the first difference from the given layout."""
        check_same_layout(
            (self.feature_names, self.action_labels),
            (list(feature_names), list(action_labels)),
            f"{where} (trained for team {self.team!r}, embedder {self.embedder!r})",
        )


def check_same_embedder(trained: str, encoder: ObservationEncoder, where: str) -> None:
    if trained != encoder.embedder.name:
        raise LayoutError(
            f"{where}: trained on {trained!r} sentence embeddings, this team's encoder uses "
            f"{encoder.embedder.name!r} (set `embedder: {trained}` in the team file, or retrain)"
        )


def check_same_layout(
    trained: tuple[Sequence[str], Sequence[str]], current: tuple[Sequence[str], Sequence[str]], where: str
) -> None:
    (f0, a0), (f1, a1) = trained, current
    if list(a0) != list(a1):
        raise LayoutError(
            f"{where}: action space differs: trained on {len(a0)} actions {list(a0)}, "
            f"this team has {len(a1)} actions {list(a1)}"
        )
    if list(f0) != list(f1):
        if len(f0) != len(f1):
            detail = f"{len(f0)} observation features vs {len(f1)} here"
        else:
            i = next(i for i, (x, y) in enumerate(zip(f0, f1, strict=True)) if x != y)
            detail = f"observation feature {i} is {f0[i]!r} there and {f1[i]!r} here"
        raise LayoutError(f"{where}: observation layout differs: {detail}")


def open_checkpoint(
    folder: str | Path,
    config: TeamEnvConfig,
    encoder: ObservationEncoder,
    model_file: str,
    algos: Sequence[str],
) -> tuple[ConductorMeta, Path]:
    """(its ``conductor.json``, the weights file) of a checkpoint folder trained for ``algos`` on this team's layout
    and embedder; :class:`PolicyError` (:class:`LayoutError`) naming the folder and the first difference otherwise."""
    folder = Path(folder)
    meta = ConductorMeta.load(folder)
    if meta.algo not in algos:
        raise PolicyError(f"{folder / META_FILE}: a {meta.algo!r} checkpoint, expected one of {tuple(algos)}")
    meta.check_layout(*team_layout(config, encoder), where=str(folder))
    meta.check_embedder(encoder, where=str(folder))
    path = folder / model_file
    if not path.exists():
        raise PolicyError(f"{folder}: {model_file} missing (an unfinished training run?)")
    return meta, path
