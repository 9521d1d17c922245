"""The backend contract (docs/architecture.md §3): ``generate(requests) -> completions``, batched by design.

A completion carries the text, the sampled token ids, their log-probabilities under the sampling
distribution (the behaviour log-probs phase 2 needs), the finish reason and the token usage.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, cast, runtime_checkable

FinishReason = Literal["stop", "length", "error", "tool"]
Role = Literal["system", "user", "assistant"]


@dataclass(frozen=True)
class ChatMessage:
    role: Role
    content: str


@dataclass(frozen=True)
class GenerationParams:
    """Sampling parameters; every knob declared. ``temperature == 0`` means greedy."""

    max_tokens: int = 64  # new tokens at most
    temperature: float = 0.0  # 0 = greedy decoding
    top_p: float = 1.0  # nucleus sampling mass (ignored when greedy)
    stop: tuple[str, ...] = ()  # stop strings; the stop string itself is not part of the text
    seed: int = 0  # sampling seed (per request; makes temperature>0 runs repeat on CPU)

    def to_dict(self) -> dict[str, Any]:
        return {
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "stop": list(self.stop),
            "seed": self.seed,
        }


@dataclass(frozen=True)
class GenerationRequest:
    """One chat to complete. ``context`` carries non-text inputs (a tool needs the task)."""

    messages: tuple[ChatMessage, ...]
    params: GenerationParams = field(default_factory=GenerationParams)
    context: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0


@dataclass(frozen=True)
class GeneratedIds:
    """One completion of a token-id prompt (``generate_ids`` of the transformers and HTTP backends): the sampled ids
    and their behaviour log-probs. ``text`` is None without a tokenizer."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: FinishReason
    text: str | None = None


@dataclass(frozen=True)
class Completion:
    text: str
    token_ids: tuple[int, ...]  # sampled ids, exactly as generated (never re-tokenised text)
    logprobs: tuple[float, ...]  # log p(token_id | context) under the sampling distribution
    finish_reason: FinishReason
    usage: Usage
    model_id: str
    cached: bool = False  # served from the response cache
    metadata: Mapping[str, Any] = field(default_factory=dict)  # e.g. a tool's verdict


@runtime_checkable
class Backend(Protocol):
    """Something that completes chats. ``model_id`` names the model in trajectories and cache keys (read-only: an
    attribute or a property, e.g. one that changes when an HTTP backend publishes an adapter version)."""

    @property
    def model_id(self) -> str: ...

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        """Complete every request; output order = input order. Batches where it can."""
        ...


class BackendError(RuntimeError):
    """A backend could not serve a request (bad model path, server unreachable, bad reply).

    ``cause`` is a short machine key of what went wrong (``http_503``, ``timeout``, ``connection``,
    ``non_json``, ``malformed_reply``, ...; ``backend_error`` when nothing more specific is known): the
    rollout engine records it on the episode the fault ended and counts runs' errors by it."""

    def __init__(self, message: str, cause: str = "backend_error") -> None:
        super().__init__(message)
        self.cause = cause


@dataclass(frozen=True)
class Failure:
    """A request a backend could not serve after its own retries: the machine key and one line of why."""

    cause: str
    message: str


def failure_of(err: Exception) -> Failure:
    """The :class:`Failure` of an exception raised by a backend: a `BackendError` keeps its ``cause``; any
    other exception (a bug or a crash inside llama.cpp, transformers, a tool) is ``backend_exception``."""
    lines = str(err).strip().splitlines()
    text = f"{type(err).__name__}: {lines[0]}" if lines else type(err).__name__
    if isinstance(err, BackendError):
        return Failure(err.cause, lines[0] if lines else type(err).__name__)
    return Failure("backend_exception", text[:500])


def generate_settled(backend: Backend, requests: Sequence[GenerationRequest]) -> list[Completion | Failure]:
    """Each request's completion or its :class:`Failure`, whatever the backend raises (``Exception`` only:
    Ctrl-C still stops the run). A backend with its own ``generate_settled`` (the HTTP backend, the cache)
    settles per request; for any other a failed batch is retried one request at a time, so one bad request
    does not fail its neighbours."""
    own = getattr(backend, "generate_settled", None)
    if callable(own):
        try:
            return list(own(requests))
        except Exception as err:  # noqa: BLE001 - a backend fault must end an episode, not the run
            return [failure_of(err)] * len(requests)
    try:
        return list(backend.generate(requests))
    except Exception as err:  # noqa: BLE001
        if len(requests) <= 1:
            return [failure_of(err)]
    out: list[Completion | Failure] = []
    for r in requests:
        try:
            out.extend(backend.generate([r]))
        except Exception as err:  # noqa: BLE001
            out.append(failure_of(err))
    return out


def messages_from_dicts(items: Sequence[Mapping[str, str]]) -> tuple[ChatMessage, ...]:
    out = []
    for i, m in enumerate(items):
        role, content = m.get("role"), m.get("content")
        if role not in ("system", "user", "assistant") or not isinstance(content, str):
            raise ValueError(f"message {i}: expected role in system/user/assistant and a string content, got {m!r}")
        out.append(ChatMessage(role=cast(Role, role), content=content))
    return tuple(out)
