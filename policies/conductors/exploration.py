"""ε-random exploration around any conductor, for recording data offline RL can learn from.

Offline RL can only rate actions it has seen; rule-based schedules cover a narrow slice of the
action space. With probability ``epsilon`` a decision is replaced by a uniformly drawn *legal*
action; the draw is seeded per episode so recordings repeat exactly.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from envs.team_env import Instruct
from policies.base import ConductorPolicy, PolicyError


def exploring_name(name: str, epsilon: float) -> str:
    """The recorded conductor name of ``name`` under ε-exploration (``heuristic+eps0.2``)."""
    return name if epsilon <= 0 else f"{name}+eps{epsilon:g}"


class EpsilonGreedyConductor:
    def __init__(self, base: ConductorPolicy, epsilon: float, seed: int = 0) -> None:
        if not 0.0 <= epsilon <= 1.0:
            raise PolicyError(f"epsilon must be in [0, 1], got {epsilon}")
        self.base, self.epsilon, self._seed = base, float(epsilon), seed
        self.name = exploring_name(base.name, epsilon)
        self._rng = np.random.default_rng(seed)

    def reset(self, seed: int | None = None) -> None:
        self.base.reset(seed)
        self._rng = np.random.default_rng([self._seed, 0 if seed is None else seed, 0xE95])

    def act(self, obs: np.ndarray, action_mask: np.ndarray, state: Mapping[str, Any] | None = None) -> int | Instruct:
        a = self.base.act(obs, action_mask, state)  # always ask: stateful bases keep counting
        if self._rng.random() < self.epsilon:
            legal = np.flatnonzero(action_mask)
            if legal.size:
                return int(self._rng.choice(legal))
        return a
