"""The conductor contract (docs/architecture.md §3): ``act(obs, action_mask) -> int`` plus a ``name``.

Rule-based conductors may read the structured state the env exposes (``infos["conductor"]["state"]``)
instead of the vector; learned ones read the vector. Every conductor must return a legal action. A conductor that
writes its own instructions (a human expert, ``llm_instruct``) may return an ``envs.Instruct`` instead: the rollout
engine records its text next to the discrete action of the nearest declared instruction.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

import numpy as np

from envs.team_env import Instruct


@runtime_checkable
class ConductorPolicy(Protocol):
    name: str

    def reset(self, seed: int | None = None) -> None:
        """Start a new episode (``seed`` drives any randomness of the policy)."""
        ...

    def act(self, obs: np.ndarray, action_mask: np.ndarray, state: Mapping[str, Any] | None = None) -> int | Instruct:
        """The next action id (``action_mask[a] == 1`` for every legal ``a``), or an instruction in the conductor's
        own words."""
        ...


class PolicyError(ValueError):
    """A conductor was misconfigured (unknown worker/instruction in a schedule, bad option)."""


def action_id(choice: int | Instruct, who: str = "conductor") -> int:
    """The discrete id of a conductor's choice, where only a discrete action will do (distilling, a gym env)."""
    if isinstance(choice, Instruct):
        raise PolicyError(
            f"{who} wrote its own instruction ({choice.worker}: {choice.text!r}) where a discrete action id is needed; "
            "use a conductor that chooses among the declared actions here"
        )
    return int(choice)


def first_legal(action_mask: np.ndarray) -> int:
    legal = np.flatnonzero(action_mask)
    if legal.size == 0:
        raise PolicyError("no legal action: the env offered an all-zero action mask")
    return int(legal[0])
