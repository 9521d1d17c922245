"""Helpers shared by the task families: seeded sampling of distinct tasks of one split, stable ids,
and reading the transcript the way every tool does.

Why a shared sampling loop: every family must return ``n`` *distinct* tasks, all of the requested
split, deterministically in the seed, with the split decided by the task's content
(:func:`envs.tasks.base.split_of`). Getting that right once avoids five subtly different loops.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

from envs.tasks.base import SPLITS, Split, Task, ToolResult, split_of

# Workers whose messages are never candidate answers, whatever their verdict field says.
NON_CANDIDATE_WORKERS = frozenset({"conductor", "system", "user", "task", "env"})
# Names of the tools shipped by the built-in families (a message from one is a tool message even when
# a recorder dropped its verdict).
TOOL_NAMES = frozenset({"calculator", "constraint_checker", "plan_validator", "test_runner"})


def stable_rng(*parts: object) -> random.Random:
    """A ``random.Random`` seeded from the text of ``parts`` via SHA-256 (stable across processes,
    unlike ``hash()``), so the same family/split/seed/difficulty always draws the same stream."""
    digest = hashlib.sha256("|".join(map(str, parts)).encode("utf-8")).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def content_id(family: str, key: str) -> str:
    """Task id from its canonical content: the same item always gets the same id."""
    return f"{family}-{hashlib.sha256(key.encode('utf-8')).hexdigest()[:12]}"


# An instance drawn by a family: (canonical key, difficulty, builder of the Task given id/split/seed).
Draw = tuple[str, int, Callable[[str, Split, int], Task]]


def sample_distinct(
    family: str,
    split: Split,
    n: int,
    seed: int,
    difficulty: int | None,
    difficulties: Sequence[int],
    draw: Callable[[random.Random, int], Draw],
    test_fraction: float = 0.2,
    max_draws: int | None = None,
    mix: Sequence[int] | None = None,
) -> list[Task]:
    """Draw instances until ``n`` distinct ones (by canonical key) of ``split`` are found.

    ``difficulty=None`` picks a level uniformly per item, among ``mix`` (default: every level). Raises ``ValueError`` with the pool
    size it saw when the family cannot produce ``n`` distinct items of that split and level."""
    if split not in SPLITS:
        raise ValueError(f"{family}: split must be one of {', '.join(SPLITS)}, got {split!r}")
    if difficulty is not None and difficulty not in difficulties:
        raise ValueError(f"{family}: difficulty must be one of {tuple(difficulties)} or None, got {difficulty!r}")
    if n < 0:
        raise ValueError(f"{family}: n must be >= 0, got {n}")
    rng = stable_rng(family, split, seed, difficulty)
    seen: set[str] = set()
    tasks: list[Task] = []
    limit = max_draws if max_draws is not None else 300 * n + 3000
    draws = 0
    while len(tasks) < n:
        if draws >= limit:
            raise ValueError(
                f"{family}: found only {len(tasks)} distinct {split} tasks (difficulty={difficulty}) in "
                f"{draws} draws, {n} requested: the pool of such items is too small"
            )
        draws += 1
        level = difficulty if difficulty is not None else rng.choice(list(mix or difficulties))
        key, level, build = draw(rng, level)
        if key in seen or split_of(key, test_fraction) != split:
            continue
        seen.add(key)
        tasks.append(build(content_id(family, key), split, seed))
    return tasks


def is_tool_message(msg: Mapping[str, Any]) -> bool:
    """Tool messages carry a verdict (``orchestra.runtime.workers`` puts it on every tool turn)."""
    return msg.get("verdict") is not None or msg.get("role") == "tool" or msg.get("worker") in TOOL_NAMES


# a fenced code block (```python, ```py, or bare ```), the closing fence optional at the end of the text
_FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL | re.IGNORECASE)


def code_blocks(text: str) -> list[str]:
    """The contents of ``text``'s fenced code blocks, in order (the code families' and the python tool's rule)."""
    return [str(b) for b in _FENCE.findall(text)]


def latest_candidate(
    transcript: Sequence[Mapping[str, Any]], accept: Callable[[str], bool] | None = None
) -> str | None:
    """Text of the latest message that can be a candidate answer: not from a tool (see
    :func:`is_tool_message`), not from the conductor/system, not empty and, when ``accept`` is given,
    accepted by it (so a critic's "looks fine" after the solver's code does not hide the code).
    None when there is none."""
    for msg in reversed(transcript):
        if is_tool_message(msg) or msg.get("worker") in NON_CANDIDATE_WORKERS:
            continue
        text = str(msg.get("text") or "")
        if text.strip() and (accept is None or accept(text)):
            return text
    return None


def candidates(transcript: Sequence[Mapping[str, Any]]) -> list[str]:
    """All candidate messages' texts, oldest first (tools use it to list what was already ruled out)."""
    return [
        str(m.get("text") or "")
        for m in transcript
        if not is_tool_message(m) and m.get("worker") not in NON_CANDIDATE_WORKERS and str(m.get("text") or "").strip()
    ]


def tool_result(verdict: Literal["pass", "fail", "n/a"], *lines: str) -> ToolResult:
    """A tool message: a first line ``PASS``/``FAIL``/``N/A`` (same as ``verdict``), then ``lines``."""
    marker = {"pass": "PASS", "fail": "FAIL", "n/a": "N/A"}[verdict]
    return ToolResult("\n".join([marker, *[ln for ln in lines if ln]]), verdict)
