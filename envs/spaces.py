"""Gymnasium spaces for text: the workers' observations (a chat) and actions (a message).

PettingZoo's conformance tests sample actions and check that observations lie in the declared
space, so text needs real spaces; ``gymnasium.spaces.Text`` restricts the character set, which model
output (unicode, newlines) does not respect.
"""

from __future__ import annotations

import string
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from gymnasium import spaces

_SAMPLE_CHARS = np.array(list(string.ascii_letters + string.digits + " .,+-*=?\n"))


def _random_text(rng: np.random.Generator, max_len: int) -> str:
    n = int(rng.integers(0, max_len + 1))
    return "".join(rng.choice(_SAMPLE_CHARS, size=n)) if n else ""


class MessageSpace(spaces.Space[Any]):
    """A worker's action: a message, given as ``str`` or as a mapping with a ``"text"`` str
    (the rollout engine passes token counts and tool verdicts along in the mapping)."""

    def __init__(self, max_chars: int = 4000, seed: int | None = None) -> None:
        super().__init__(shape=None, dtype=None, seed=seed)
        self.max_chars = max_chars

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        return _random_text(self.np_random, 40)

    def contains(self, x: Any) -> bool:
        if isinstance(x, str):
            return len(x) <= self.max_chars * 4
        return isinstance(x, Mapping) and isinstance(x.get("text"), str)

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def __repr__(self) -> str:
        return f"MessageSpace(max_chars={self.max_chars})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MessageSpace) and other.max_chars == self.max_chars


class ChatSpace(spaces.Space[Any]):
    """A worker's observation: a list of ``{"role": ..., "content": ...}`` chat messages."""

    ROLES = ("system", "user", "assistant")

    def __init__(self, seed: int | None = None) -> None:
        super().__init__(shape=None, dtype=None, seed=seed)

    def sample(self, mask: Any = None, probability: Any = None) -> list[dict[str, str]]:
        return [
            {"role": "system", "content": _random_text(self.np_random, 20)},
            {"role": "user", "content": _random_text(self.np_random, 60)},
        ]

    def contains(self, x: Any) -> bool:
        if not isinstance(x, Sequence) or isinstance(x, str):
            return False
        return all(
            isinstance(m, Mapping) and m.get("role") in self.ROLES and isinstance(m.get("content"), str) for m in x
        )

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "ChatSpace()"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ChatSpace)
