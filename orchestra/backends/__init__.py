"""LLM and tool backends behind one contract (docs/architecture.md §3): ``generate(requests) -> completions``.

``make_backend`` is the one registry team files use::

    {"type": "llamacpp", "model": "smollm2"}
    {"type": "transformers", "model": "smollm2", "max_batch_size": 16, "adapters": {"solver": "runs/x/solver"}}
    {"type": "http", "base_url": "http://127.0.0.1:8000", "model": "qwen", "api_key_env": "MY_KEY"}
    {"type": "tool", "tools": {"calculator": "envs.tasks.arith:calculator"}}

Any spec may add ``"cache": "<path.sqlite>"`` to wrap the backend in a :class:`CachedBackend`.
The heavy backends (llama.cpp, torch, httpx) are imported only when built, so importing this package
stays cheap for the env and the policies.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from orchestra.backends.base import (
    Backend,
    BackendError,
    ChatMessage,
    Completion,
    Failure,
    FinishReason,
    GenerationParams,
    GenerationRequest,
    Usage,
    failure_of,
    generate_settled,
    messages_from_dicts,
)
from orchestra.backends.cache import CachedBackend, ResponseCache, request_key
from orchestra.backends.models import ModelSource, resolve_model, smollm2_gguf_path

if TYPE_CHECKING:
    from orchestra.backends.hf import TransformersBackend
    from orchestra.backends.http import OpenAIHTTPBackend
    from orchestra.backends.llamacpp import LlamaCppBackend
    from orchestra.backends.tools import ToolBackend

# type name -> "module:class"; the one registry of backend names.
BACKEND_TYPES: dict[str, str] = {
    "llamacpp": "orchestra.backends.llamacpp:LlamaCppBackend",
    "transformers": "orchestra.backends.hf:TransformersBackend",
    "http": "orchestra.backends.http:OpenAIHTTPBackend",
    "tool": "orchestra.backends.tools:ToolBackend",
}

__all__ = [
    "BACKEND_TYPES",
    "Backend",
    "BackendError",
    "CachedBackend",
    "ChatMessage",
    "Completion",
    "Failure",
    "FinishReason",
    "GenerationParams",
    "GenerationRequest",
    "LlamaCppBackend",
    "ModelSource",
    "OpenAIHTTPBackend",
    "ResponseCache",
    "ToolBackend",
    "TransformersBackend",
    "Usage",
    "backend_class",
    "failure_of",
    "generate_settled",
    "make_backend",
    "messages_from_dicts",
    "request_key",
    "resolve_model",
    "smollm2_gguf_path",
]


def _import(target: str) -> Any:
    module, _, attr = target.partition(":")
    if not module or not attr:
        raise BackendError(f"{target!r} is not an import path of the form 'package.module:name'")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise BackendError(f"cannot import {target!r}: {e}") from e


def backend_class(kind: str) -> type:
    if kind not in BACKEND_TYPES:
        raise BackendError(f"unknown backend type {kind!r}; expected one of {sorted(BACKEND_TYPES)}")
    cls: type = _import(BACKEND_TYPES[kind])
    return cls


def make_backend(spec: Mapping[str, Any]) -> Backend:
    """Build a backend from a team-file dict ``{"type": ..., **constructor kwargs}`` (+ ``"cache"``).

    Fields are checked against the constructor's signature, so a misspelt field fails here with the
    list of allowed ones instead of deep inside a run.
    """
    if not isinstance(spec, Mapping):
        raise BackendError(f"a backend spec must be a mapping with a 'type' field, got {type(spec).__name__}")
    fields = dict(spec)
    kind = fields.pop("type", None)
    if kind is None:
        raise BackendError(f"backend spec {dict(spec)!r} has no 'type'; expected one of {sorted(BACKEND_TYPES)}")
    cache_path = fields.pop("cache", None)
    cls = backend_class(kind)
    params = inspect.signature(cls).parameters
    allowed = [n for n in params if n != "self"]
    unknown = sorted(set(fields) - set(allowed))
    if unknown:
        raise BackendError(f"backend type {kind!r}: unknown field(s) {unknown}; allowed: {allowed + ['cache']}")
    missing = [n for n in allowed if params[n].default is inspect.Parameter.empty and n not in fields]
    if missing:
        raise BackendError(f"backend type {kind!r}: missing required field(s) {missing}")
    if kind == "tool":
        fields["tools"] = _resolve_tools(fields["tools"])
    try:
        backend: Backend = cls(**fields)
    except TypeError as e:  # a field of the wrong type
        raise BackendError(f"backend type {kind!r}: {e}") from e
    if cache_path is not None:
        backend = CachedBackend(backend, ResponseCache(cache_path))
    return backend


def _resolve_tools(tools: Any) -> dict[str, Callable[..., Any]]:
    """Tools given as callables or as ``"package.module:function"`` strings (what YAML can hold)."""
    if not isinstance(tools, Mapping):
        raise BackendError(
            f"backend type 'tool': field 'tools' must map names to functions, got {type(tools).__name__}"
        )
    return {name: (_import(fn) if isinstance(fn, str) else fn) for name, fn in tools.items()}


def __getattr__(name: str) -> Any:
    """Lazy access to the heavy backend classes (``from orchestra.backends import LlamaCppBackend``)."""
    lazy = {
        "LlamaCppBackend": "llamacpp",
        "TransformersBackend": "transformers",
        "OpenAIHTTPBackend": "http",
        "ToolBackend": "tool",
    }
    if name in lazy:
        return backend_class(lazy[name])
    raise AttributeError(f"module 'orchestra.backends' has no attribute {name!r}")
