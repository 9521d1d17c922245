"""The one registry of task family names (for the CLI and team files).

``get_family("arithmetic")`` builds a family; ``get_family("jsonl", path="data.jsonl")`` loads a user's
file. ``verify_task`` re-verifies a stored task from its own fields (no generator state needed), which
is what evaluation and trajectory re-scoring use.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from envs.tasks.arithmetic import ArithmeticFamily
from envs.tasks.base import Split, Task, TaskFamily, ToolFn, Verdict
from envs.tasks.blocksworld import BlocksworldFamily
from envs.tasks.code_synthesis import CodeSynthesisFamily
from envs.tasks.logic_grid import LogicGridFamily
from envs.tasks.user_data import UserDataFamily, check_item, tools_of

# the families of the phase-1 protocol: tools only check what workers wrote, levels calibrated to SmolLM2
PROTOCOL_FAMILIES = ("arithmetic", "blocksworld", "logic_grid", "code_synthesis")
USER_DATA_SOURCES = ("user_data", "jsonl")  # "jsonl": tasks stored before user data took other formats

FAMILIES: dict[str, Callable[..., TaskFamily]] = {
    "arithmetic": ArithmeticFamily,
    "logic_grid": LogicGridFamily,
    "blocksworld": BlocksworldFamily,
    "code_synthesis": CodeSynthesisFamily,
    "jsonl": UserDataFamily,  # a user's data: .jsonl, .parquet or a datasets folder (the CLI's --family FILE)
}


def get_family(name: str, **kwargs: Any) -> TaskFamily:
    """Build the family registered as ``name`` with ``kwargs`` (``jsonl`` needs ``path=``)."""
    if name not in FAMILIES:
        raise KeyError(f"unknown task family {name!r}; known families: {', '.join(sorted(FAMILIES))}")
    try:
        return FAMILIES[name](**kwargs)
    except TypeError as e:
        raise TypeError(f"task family {name!r}: bad arguments {sorted(kwargs)}: {e}") from e


def generate_tasks(
    family: str | TaskFamily, split: Split, n: int, seed: int, difficulty: int | None = None, **kwargs: Any
) -> list[Task]:
    """``n`` distinct tasks of ``split`` from ``family`` (a name, built with ``kwargs``, or an instance)."""
    fam = get_family(family, **kwargs) if isinstance(family, str) else family
    return fam.generate(split, n, seed, difficulty)


def verify_task(task: Task, text: str) -> Verdict:
    """Verify ``text`` against a task using only the task (its ``family`` name and metadata)."""
    if task.metadata.get("source") in USER_DATA_SOURCES:
        return check_item(task, text)
    if task.family not in FAMILIES or task.family == "jsonl":
        raise KeyError(
            f"cannot verify task {task.id!r}: unknown family {task.family!r} (known: {', '.join(sorted(FAMILIES))})"
        )
    return FAMILIES[task.family]().verify(task, text)


def tools_for(task: Task) -> Mapping[str, ToolFn]:
    """The tools of a task's family, built from the task alone (JSONL tasks get the calculator)."""
    if task.metadata.get("source") in USER_DATA_SOURCES:
        return tools_of(task)
    return FAMILIES[task.family]().tools()
