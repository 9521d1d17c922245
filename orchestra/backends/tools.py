"""Deterministic tool workers (calculator, plan validator, test runner) behind the Backend contract.

A tool is a pure Python function ``(task, transcript) -> ToolResult`` shipped by a task family
(``envs.tasks.base.ToolFn``). Wrapping tools as a backend lets the env and the rollout engine treat
a tool exactly like an LLM worker: one ``generate`` call, one completion per request.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from envs.tasks.base import Task, ToolResult
from orchestra.backends.base import BackendError, Completion, GenerationRequest, Usage

ToolCallable = Callable[[Task, Sequence[Mapping[str, Any]]], ToolResult]


class ToolBackend:
    """Serve requests by calling named tools.

    Each request's ``context`` must hold ``"tool"`` (the tool's name), ``"task"`` (a :class:`Task`)
    and ``"transcript"`` (list of dicts, oldest first). The messages are ignored: a tool reads the
    structured transcript, not the chat. The completion has ``finish_reason="tool"``, no token ids or
    log-probs (nothing was sampled), zero usage, ``model_id="tool:<name>"`` and the verdict in
    ``metadata["verdict"]``. Tools are called with :meth:`Task.public`, never the task itself.
    """

    def __init__(self, tools: Mapping[str, ToolCallable]) -> None:
        for name, fn in tools.items():
            if not callable(fn):
                raise BackendError(f"tool {name!r} is not callable (got {type(fn).__name__})")
        self.tools: dict[str, ToolCallable] = dict(tools)
        # One backend serves several tools; the per-completion model_id names the tool actually run.
        self.model_id = "tool:" + ",".join(sorted(self.tools))

    def __repr__(self) -> str:
        return f"ToolBackend(tools={sorted(self.tools)})"

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        return [self._run(i, r) for i, r in enumerate(requests)]

    def _run(self, i: int, request: GenerationRequest) -> Completion:
        ctx = request.context
        name = ctx.get("tool")
        if name not in self.tools:
            raise BackendError(f"request {i}: unknown tool {name!r}; known tools: {sorted(self.tools)}")
        task = ctx.get("task")
        if not isinstance(task, Task):
            raise BackendError(f"request {i}: context['task'] must be a Task, got {type(task).__name__}")
        transcript = ctx.get("transcript", [])
        if not isinstance(transcript, Sequence) or isinstance(transcript, str):
            raise BackendError(f"request {i}: context['transcript'] must be a list of dicts")
        # the tool sees the task's public view only: no answer, no solution-derived metadata
        result = self.tools[name](task.public(), list(transcript))
        if not isinstance(result, ToolResult):
            raise BackendError(f"tool {name!r} returned {type(result).__name__}, expected ToolResult")
        return Completion(
            text=result.text,
            token_ids=(),
            logprobs=(),
            finish_reason="tool",
            usage=Usage(0, 0),
            model_id=f"tool:{name}",
            metadata={"verdict": result.verdict},
        )
