"""The task contract (docs/architecture.md §3): a task, its verifier, a family that generates tasks, tool functions.

A *family* generates tasks procedurally from a seed, with difficulty levels and a deterministic
train / validation / test split. Every task carries an exact verifier. A family also ships the deterministic
*tools* its built-in team uses (calculator, constraint checker, plan validator, test runner): pure Python
functions of the task's public view (:meth:`Task.public`) and the transcript, wrapped as workers by
``orchestra.backends.tools``; they check what workers wrote and never solve a task alone (docs/protocol.md).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

Split = Literal["train", "validation", "test"]
SPLITS: tuple[Split, ...] = ("train", "validation", "test")
VALIDATION_FRACTION = 0.2  # share of items in the validation split (tuning: best schedule, hyperparameters)


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
    """One task instance. ``metadata`` holds everything the verifier and the tools need (JSON-able).

    ``hidden`` names the metadata keys derived from the solution (a reference plan, the puzzle's
    assignment, hidden tests). Tools and conductors get :meth:`public`: no answer, no hidden keys,
    no generation level, so nothing they compute can depend on the solution (docs/families.md)."""

    id: str
    family: str
    split: Split
    prompt: str
    answer: str
    difficulty: int = 1
    seed: int = 0
    metadata: Mapping[str, Any] = field(default_factory=dict)
    hidden: tuple[str, ...] = ()

    def public(self) -> Task:
        """What a tool may read: the prompt and the problem's own data, never the solution.

        The answer becomes ``""``, the hidden metadata keys are dropped and the difficulty is 0 (a
        generation level can be a function of the solution, e.g. the optimal plan length)."""
        meta = {k: v for k, v in self.metadata.items() if k not in self.hidden}
        return Task(self.id, self.family, self.split, self.prompt, "", 0, self.seed, meta, ())

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
            "hidden": list(self.hidden),
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


def split_of(key: str, test_fraction: float = 0.2, validation_fraction: float = VALIDATION_FRACTION) -> Split:
    """Deterministic split of an item by the hash of its canonical content ``key``.

    The same content always lands in the same split, whatever the seed that generated it, so no
    test item can leak into training or validation. Families make ``key`` canonical (names of people
    and items, block letters, the order of commutative operands do not count), so near-duplicates
    share a key and a split. Test: the first ``test_fraction`` of the hash range; validation: the next
    ``validation_fraction``; train: the rest."""
    h = int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:8], "big") % 10_000
    if h < int(test_fraction * 10_000):
        return "test"
    return "validation" if h < int((test_fraction + validation_fraction) * 10_000) else "train"
