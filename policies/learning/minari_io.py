"""A :class:`~policies.learning.dataset.ConductorDataset` as a Minari dataset (Farama's standard for offline-RL data).

Minari stores one entry per episode with ``len + 1`` observations (the reset one through the last), ``len``
actions, rewards, terminations and truncations. Our rows map onto it one to one:

* observation ``{"observation": (D,) float32, "action_mask": (A,) int8}`` — the conductor's observation space in
  :class:`~envs.team_env.TeamEnv`, so the mask the conductor saw travels with the state. Entry ``len`` is the
  dataset's final observation (``final_observations``) with an all-zero mask: the episode is over, no action is
  legal;
* action: the ``Discrete(A)`` action id; reward: the scalarised reward of the row (the dataset's ``weights``);
* termination / truncation on the last step only, from ``terminals`` / ``timeouts`` (an episode cut by its turn
  budget is truncated, not terminated, as d3rlpy reads it);
* episode ``options``: nothing; the episode's provenance (episode id, conductor, family, split, task, success) and
  the dataset's layout (feature names, action labels, reward weights, team, embedder) are in the dataset's
  ``description`` as JSON, so :func:`from_minari` can rebuild the arrays and check them against a team.

The dataset is written under ``root`` (Minari's ``MINARI_DATASETS_PATH``), e.g. ``ROOT/orchestra/arithmetic-v0``.
"""

from __future__ import annotations

import json
import os
import re
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from policies.learning.dataset import ConductorDataset, DatasetError

MINARI_FORMAT = "orchestra-minari/1"
_ID = re.compile(r"^([A-Za-z0-9_.]+/)?([A-Za-z0-9_.]+/)?[A-Za-z0-9_.]+(-v\d+)?$")


@contextmanager
def _datasets_root(root: str | Path) -> Iterator[None]:
    """Minari finds its datasets through ``MINARI_DATASETS_PATH``; point it at ``root`` for one call."""
    old = os.environ.get("MINARI_DATASETS_PATH")
    os.environ["MINARI_DATASETS_PATH"] = str(Path(root).resolve())
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("MINARI_DATASETS_PATH", None)
        else:
            os.environ["MINARI_DATASETS_PATH"] = old


def _spaces(ds: ConductorDataset) -> tuple[Any, Any]:
    from gymnasium import spaces

    obs = spaces.Dict(
        {
            "observation": spaces.Box(-np.inf, np.inf, shape=(ds.observations.shape[1],), dtype=np.float32),
            "action_mask": spaces.Box(0, 1, shape=(ds.num_actions,), dtype=np.int8),
        }
    )
    return obs, spaces.Discrete(ds.num_actions)


def to_minari(
    ds: ConductorDataset,
    dataset_id: str,
    root: str | Path,
    *,
    author: str = "orchestra",
    author_email: str = "n/a",
    code_permalink: str = "n/a",
) -> Path:
    """Write ``ds`` as Minari dataset ``dataset_id`` under ``root``; returns its folder. An existing dataset of that id
    is an error (Minari does not overwrite), named with the folder to remove."""
    import minari
    from minari.data_collector import EpisodeBuffer

    if not _ID.match(dataset_id):
        raise DatasetError(
            f"Minari dataset id {dataset_id!r}: expected (namespace/)(env/)name(-vN), e.g. orchestra/arithmetic-v0"
        )
    if len(ds) == 0:
        raise DatasetError("the dataset has no rows: nothing to export")
    folder = Path(root).resolve() / dataset_id
    if folder.exists():
        raise DatasetError(f"Minari dataset {dataset_id!r} already exists at {folder}: remove it or pick another id")
    obs_space, act_space = _spaces(ds)
    buffers: list[Any] = []
    for e in range(len(ds.episodes)):
        rows = np.flatnonzero(ds.episode_index == e)
        if rows.size == 0:
            continue
        obs = np.concatenate([ds.observations[rows], ds.final_observations[e][None]]).astype(np.float32)
        masks = np.concatenate([ds.masks[rows], np.zeros((1, ds.num_actions), dtype=np.int8)]).astype(np.int8)
        buffers.append(
            EpisodeBuffer(
                id=len(buffers),
                observations={"observation": obs, "action_mask": masks},
                actions=ds.actions[rows].astype(np.int64),
                rewards=ds.rewards[rows].astype(np.float64).tolist(),
                terminations=ds.terminals[rows].astype(bool).tolist(),
                truncations=ds.timeouts[rows].astype(bool).tolist(),
            )
        )
    header = {
        "format": MINARI_FORMAT,
        "team": ds.team,
        "embedder": ds.embedder,
        "feature_names": ds.feature_names,
        "action_labels": ds.action_labels,
        "weights": ds.weights,
        "episodes": [asdict(i) for i in ds.episodes],
    }
    with _datasets_root(root), warnings.catch_warnings():
        # a TeamEnv is a PettingZoo AEC env, not a registered gymnasium one: there is no env spec to record
        warnings.filterwarnings("ignore", message=r".*(eval_env|env_spec)`? is( set to)? None")
        minari.create_dataset_from_buffers(
            dataset_id=dataset_id,
            buffer=buffers,
            algorithm_name="orchestra: " + ", ".join(sorted({i.conductor for i in ds.episodes})),
            author=author,
            author_email=author_email,
            code_permalink=code_permalink,
            action_space=act_space,
            observation_space=obs_space,
            description=json.dumps(header),
            data_format="hdf5",
        )
    return folder


def load_minari(dataset_id: str, root: str | Path) -> Any:
    """``minari.load_dataset(dataset_id)`` under ``root``."""
    import minari

    with _datasets_root(root):
        return minari.load_dataset(dataset_id)


def minari_header(dataset: Any) -> dict[str, Any]:
    """The orchestra layout stored in a dataset written by :func:`to_minari` (DatasetError if it is not one)."""
    try:
        header = json.loads(str(dataset.storage.metadata.get("description") or ""))
    except json.JSONDecodeError:
        header = None
    if not isinstance(header, dict) or header.get("format") != MINARI_FORMAT:
        name = dataset.storage.metadata.get("dataset_id")
        raise DatasetError(f"Minari dataset {name!r} was not written by orchestra (no layout header)")
    return header


__all__ = ["MINARI_FORMAT", "load_minari", "minari_header", "to_minari"]
