"""The ``python`` tool: run the program a worker wrote (program of thought) in the sandbox and state what it printed.

A program-of-thought worker answers a word problem with code (``print(12 * 3 - 5)``) instead of prose; the tool
executes it in :func:`envs.tasks.sandbox.run_python` and its message carries the printed number as the answer
(``Answer: 31``). Like the calculator, it reads only what workers wrote, never the task: the program is the latest
candidate message that holds code (a fenced ```` ```python ```` block, else the whole message when it parses as
Python), so a tool-only conductor solves nothing. It does not check the answer: it says N/A when the program ran and
printed a number, FAIL when there is a program but it failed or printed none (the message says why), N/A with
nothing to run.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping, Sequence
from typing import Any

from envs.tasks.base import Task, ToolResult
from envs.tasks.common import code_blocks, latest_candidate, tool_result
from envs.tasks.extract import extract_number
from envs.tasks.sandbox import run_python

# limits of one run: an arithmetic program needs milliseconds; anything longer is a loop gone wrong
PROGRAM_LIMITS: Mapping[str, Any] = {"cpu_seconds": 1, "wall_seconds": 3, "memory_mb": 128}
MAX_PROGRAM_CHARS = 2000


def program_of(text: str) -> str | None:
    """The program in a message: its last fenced code block, else the whole text when it parses as Python and calls
    ``print``; None when it holds none (prose is not a program)."""
    blocks = [b for b in code_blocks(text) if b.strip()]
    code = blocks[-1] if blocks else text.strip()
    if not code or len(code) > MAX_PROGRAM_CHARS:
        return None
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return code if blocks else None  # a fenced block is meant as code: run it and report the error
    prints = any(
        isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "print" for n in ast.walk(tree)
    )
    return code if blocks or prints else None


def python_tool(task: Task, transcript: Sequence[Mapping[str, Any]]) -> ToolResult:
    """Run the latest candidate's program; its last printed number is the answer (see the module docstring)."""
    del task  # the tool never reads the task
    text = latest_candidate(transcript, accept=lambda t: program_of(t) is not None)
    code = program_of(text) if text is not None else None
    if code is None:
        return tool_result("n/a", "No program to run yet. Write one line of Python that prints the answer.")
    res = run_python(code, **PROGRAM_LIMITS)
    if not res.ok:
        why = res.killed_reason or (res.stderr.strip().splitlines() or ["exited with an error"])[-1]
        return tool_result("fail", f"The program failed: {why[:200]}")
    value = extract_number(res.stdout.strip().splitlines()[-1]) if res.stdout.strip() else None
    if value is None:
        return tool_result("fail", "The program printed no number.")
    return tool_result("n/a", f"The program printed {value}.", f"Answer: {value}")


__all__ = ["PROGRAM_LIMITS", "program_of", "python_tool"]
