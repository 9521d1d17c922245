"""The task contract (docs/architecture.md §3): a task, its verifier, a family that generates tasks, tool functions.

A *family* generates tasks procedurally from a seed, with difficulty levels and a deterministic
train/test split. Every task carries an exact verifier. A family also ships the deterministic *tools*
its built-in team uses (calculator, constraint checker, plan validator, test runner): pure Python
functions of the task and the transcript, wrapped as workers by ``orchestra.backends.tools``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

Split = Literal["train", "test"]
SPLITS: tuple[Split, ...] = ("train", "test")


@dataclass(frozen=True)
class Verdict:
    """Result of checking an answer: ``score`` in [0, 1] and a human-readable ``reason``.

    ``extracted`` is the answer the verifier read out of the text (None when nothing could be
    extracted, i.e. a format failure)."""

    score: float
    reason: str
    extracted: str | None = None

    @property
    def correct(self) -> bool:
        return self.score >= 1.0


@dataclass(frozen=True)
class ToolResult:
    """What a tool worker says: the message ``text`` shown in the transcript and a ``verdict`` the
    env and rule-based conductors can read without parsing ("pass", "fail" or "n/a")."""

    text: str
    verdict: Literal["pass", "fail", "n/a"]


@dataclass(frozen=True)
class Task:
    """One task instance. ``metadata`` holds everything the verifier and the tools need (JSON-able)."""

    id: str
    family: str
    split: Split
    prompt: str
    answer: str
    difficulty: int = 1
    seed: int = 0
    metadata: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "family": self.family,
            "split": self.split,
            "prompt": self.prompt,
            "answer": self.answer,
            "difficulty": self.difficulty,
            "seed": self.seed,
            "metadata": dict(self.metadata),
        }


# A tool: (task, transcript) -> ToolResult. The transcript is a list of dicts with at least
# "worker" and "text" keys, oldest first; tools usually look at the latest candidate answer.
ToolFn = Callable[[Task, Sequence[Mapping[str, Any]]], ToolResult]


@runtime_checkable
class TaskFamily(Protocol):
    """A procedurally generated family of tasks with an exact verifier and its tools."""

    name: str
    difficulties: tuple[int, ...]

    def generate(self, split: Split, n: int, seed: int, difficulty: int | None = None) -> list[Task]:
        """``n`` distinct tasks of ``split`` (deterministic in ``seed``); ``difficulty=None`` mixes levels."""
        ...

    def verify(self, task: Task, text: str) -> Verdict:
        """Extract the answer from ``text`` and check it exactly."""
        ...

    def tools(self) -> Mapping[str, ToolFn]:
        """Named deterministic tools of this family's built-in team."""
        ...


def split_of(key: str, test_fraction: float = 0.2) -> Split:
    """Deterministic split of an item by the hash of its canonical content ``key``.

    The same content always lands in the same split, whatever the seed that generated it, so no
    test item can leak into training."""
    h = int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:8], "big")
    return "test" if (h % 10_000) < int(test_fraction * 10_000) else "train"
