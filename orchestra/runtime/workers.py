"""Workers: a name, a versioned role prompt, a backend and generation parameters.

The env renders the chat a worker may see (its visibility is part of the env); the worker turns that
chat into a backend request and the completion into the env action. It parses nothing it cannot:
output the verifier cannot read is kept verbatim and counted (``agent/{name}/parse_fail_rate``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envs.tasks.base import Task
from orchestra.backends import make_backend
from orchestra.backends.base import Backend, Completion, GenerationParams, GenerationRequest, messages_from_dicts
from orchestra.backends.cache import CachedBackend, ResponseCache
from orchestra.backends.tools import ToolBackend
from orchestra.runtime.team_file import TeamSpec


def default_cache_path() -> Path:
    """``$ORCHESTRA_CACHE_DIR/responses.sqlite`` (default ``~/.cache/orchestra``)."""
    base = os.environ.get("ORCHESTRA_CACHE_DIR") or str(Path.home() / ".cache" / "orchestra")
    return Path(base) / "responses.sqlite"


@dataclass
class Worker:
    name: str
    kind: str  # "llm" | "tool"
    backend: Backend
    params: GenerationParams
    prompt_version: str
    tool: str | None = None
    adapter: str | None = None  # the worker's LoRA adapter on its backend (team file ``adapter:``)

    @property
    def model_id(self) -> str:
        if self.kind == "tool":
            return f"tool:{self.tool}"
        return f"{self.backend.model_id}+lora:{self.adapter}" if self.adapter else self.backend.model_id

    def request(
        self, chat: Sequence[Mapping[str, str]], task: Task, transcript: Sequence[Mapping[str, Any]], seed: int
    ) -> GenerationRequest:
        params = self.params
        if params.temperature > 0:  # per-turn seed: sampled runs repeat exactly
            params = GenerationParams(
                max_tokens=params.max_tokens,
                temperature=params.temperature,
                top_p=params.top_p,
                stop=params.stop,
                seed=seed,
            )
        context: dict[str, Any] = {"task": task, "transcript": list(transcript)}
        if self.tool is not None:
            context["tool"] = self.tool
        if self.adapter is not None:
            context["adapter"] = self.adapter
        return GenerationRequest(messages=messages_from_dicts(chat), params=params, context=context)

    @staticmethod
    def env_action(completion: Completion) -> dict[str, Any]:
        """The env's worker action: the text plus what the env's rewards and flags need."""
        return {
            "text": completion.text,
            "tokens": completion.usage.completion_tokens,
            "verdict": completion.metadata.get("verdict"),
        }


SERIAL_LLAMACPP = {"batch_size": 1, "prefix_cache": 0}  # llama.cpp's serial path (orchestra.backends.llamacpp)


def build_workers(
    team: TeamSpec,
    tools: Mapping[str, Any],
    *,
    cache_path: Path | None = None,
    use_cache: bool = True,
    serial: bool = False,
) -> dict[str, Worker]:
    """Instantiate each backend once (workers sharing a backend key share the loaded model). ``serial``: every
    llama.cpp backend decodes one request at a time from an empty KV cache, whatever the team file says."""
    cache = ResponseCache(cache_path or default_cache_path()) if use_cache else None
    backends: dict[str, Backend] = {}
    for key, spec in team.backends.items():
        fields = dict(spec)
        if serial and fields.get("type") == "llamacpp":
            fields.update(SERIAL_LLAMACPP)
        b = make_backend(fields)
        backends[key] = CachedBackend(b, cache) if cache is not None else b
    tool_backend = ToolBackend(dict(tools))
    workers: dict[str, Worker] = {}
    for ws in team.env.workers:
        rt = team.workers[ws.name]
        if rt.kind == "tool":
            if rt.tool not in tools:
                raise ValueError(
                    f"{team.path}: worker {ws.name!r}: tool {rt.tool!r} is not a tool of family "
                    f"{team.family!r} (tools: {sorted(tools)})"
                )
            workers[ws.name] = Worker(ws.name, "tool", tool_backend, rt.generation, ws.prompt_version, rt.tool)
        else:
            assert rt.backend is not None
            workers[ws.name] = Worker(
                ws.name, "llm", backends[rt.backend], rt.generation, ws.prompt_version, adapter=rt.adapter
            )
    return workers
