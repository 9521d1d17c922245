"""Any learned conductor from its checkpoint folder: the algorithm its ``conductor.json`` names picks the loader
(:class:`~policies.learning.offline.OfflineConductor` for d3rlpy's, :class:`~policies.learning.online.PPOConductor` for MaskablePPO).
It stands above both: each of them, and the dataset, reads and checks checkpoints through :mod:`policies.learning.checkpoint`."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from envs.config import TeamEnvConfig
from envs.observation import ObservationEncoder
from policies.base import ConductorPolicy, PolicyError
from policies.learning.checkpoint import META_FILE, ConductorMeta
from policies.learning.offline import D3RLPY_ALGOS, OfflineConductor
from policies.learning.online import PPOConductor


def load_conductor(
    path: str | Path,
    config: TeamEnvConfig,
    encoder: ObservationEncoder,
    name: str | None = None,
    extra: Mapping[str, Any] | None = None,
) -> ConductorPolicy:
    """Load any learned conductor checkpoint (d3rlpy or MaskablePPO) for this team and encoder (the loader of its
    algorithm checks the layout: :func:`~policies.learning.checkpoint.open_checkpoint`)."""
    folder = Path(path)
    meta = ConductorMeta.load(folder)
    if meta.algo == "ppo":
        return PPOConductor.load(folder, config, encoder, name=name)
    if meta.algo not in D3RLPY_ALGOS:
        raise PolicyError(f"{folder / META_FILE}: algo {meta.algo!r} is not one of {(*D3RLPY_ALGOS, 'ppo')}")
    return OfflineConductor.load(folder, config, encoder, name=name)


__all__ = ["load_conductor"]
