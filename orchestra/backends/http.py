"""OpenAI-compatible HTTP backend (vLLM, Ollama, llama.cpp server, hosted APIs).

Protocol: ``POST {base_url}/v1/chat/completions`` as in the OpenAI API reference
(https://platform.openai.com/docs/api-reference/chat/create), with ``logprobs: true`` so the reply
carries ``choices[0].logprobs.content[*].logprob`` — the behaviour log-probs phase 2 needs.

Token ids: the OpenAI schema returns token *strings*, not ids. When a server also gives ids (an
integer ``id``/``token_id`` per entry, as llama.cpp's C++ server does, or ``"token_id:N"`` strings,
as vLLM does with ``return_tokens_as_token_ids`` — set ``request_token_ids=True`` to ask for it),
they are returned; otherwise ``token_ids`` is the empty tuple and ``metadata["token_ids"]`` says why
(the token strings are in ``metadata["tokens"]``). Never re-tokenise the text to fake ids.

LoRA adapters (vLLM ``--enable-lora``): a request whose ``context["adapter"]`` names a worker's adapter is sent with
that adapter as its ``model`` (vLLM serves ``--lora-modules NAME=PATH`` under NAME; ``adapters`` maps a worker's
adapter name to another served name). :meth:`OpenAIHTTPBackend.publish_adapter` loads a new version of a worker's
adapter into a running vLLM server (its runtime endpoint ``POST /v1/load_lora_adapter``, enabled by
``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``), under a name derived from the adapter's bytes, and routes the worker's later
requests to it: phase 2 trains in torch and publishes after each update, the server samples.

Concurrency: at most ``max_concurrency`` requests are in flight from one backend object, across all the threads and
calls that use it (a semaphore, and an HTTP connection pool of that size); a batch larger than that queues.

Secrets: the API key is read from the environment variable ``api_key_env`` at each request and sent
as ``Authorization: Bearer``; it is never stored on the object, so ``repr``, pickles, logs and error
messages cannot contain it (error text is also scrubbed of it, in case a server echoes it back).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import httpx

from orchestra.backends.base import (
    BackendError,
    Completion,
    Failure,
    FinishReason,
    GeneratedIds,
    GenerationParams,
    GenerationRequest,
    Usage,
)

T = TypeVar("T")
_RETRY_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504})  # transient per the OpenAI/vLLM docs
_TOKEN_ID_RE = re.compile(r"^token_id:(\d+)$")
_FINISH: dict[str, FinishReason] = {"stop": "stop", "eos": "stop", "length": "length", "content_filter": "error"}


class OpenAIHTTPBackend:
    """Complete chats via an OpenAI-compatible server; requests are sent concurrently (servers batch).

    Retries (bounded, exponential backoff ``backoff_s * 2**attempt``, capped at ``max_backoff_s``, or the
    server's ``Retry-After`` when longer, within the same cap): connection errors (refused, reset, a body cut
    off mid-way), timeouts, HTTP 408/409/429/5xx, and 200 replies that are not JSON or break the
    chat-completions schema (a proxy or an overloaded server can send both). Other 4xx fail at once. The
    :class:`BackendError` raised after the last attempt carries the last attempt's ``cause``. Worst-case
    wall time of one request is about ``(max_retries + 1) * timeout_s`` plus the backoff sleeps.

    :meth:`generate_settled` returns each request's completion or its failure, so one bad request of a
    batch does not discard the others' replies (the rollout engine uses it; :meth:`generate` raises the
    first failure).
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key_env: str = "OPENAI_API_KEY",
        timeout_s: float = 30.0,
        max_retries: int = 3,
        backoff_s: float = 0.5,
        max_backoff_s: float = 8.0,
        max_concurrency: int = 8,
        request_token_ids: bool = False,
        adapters: Mapping[str, str] | None = None,
    ) -> None:
        if max_retries < 0 or timeout_s <= 0 or backoff_s < 0 or max_concurrency < 1:
            raise BackendError("need max_retries >= 0, timeout_s > 0, backoff_s >= 0, max_concurrency >= 1")
        base = base_url.rstrip("/")
        base = base[: -len("/v1")] if base.endswith("/v1") else base
        self.base_url = base
        self.url = f"{base}/v1/chat/completions"
        self.completions_url = f"{base}/v1/completions"
        self.model = model
        self.api_key_env = api_key_env  # the NAME of the variable; the value is never kept
        self.timeout_s = float(timeout_s)
        self.max_retries = int(max_retries)
        self.backoff_s = float(backoff_s)
        self.max_backoff_s = float(max_backoff_s)
        self.max_concurrency = int(max_concurrency)
        self.request_token_ids = request_token_ids
        # worker adapter name -> the model name the server serves it under (default: the adapter's own name)
        self.adapters: dict[str, str] = {str(k): str(v) for k, v in (adapters or {}).items()}
        self._published: dict[str, str] = {}  # adapter -> served name of its latest published version
        self._slots = threading.BoundedSemaphore(self.max_concurrency)
        self._lock = threading.Lock()
        limits = httpx.Limits(max_connections=self.max_concurrency, max_keepalive_connections=self.max_concurrency)
        self._client = httpx.Client(timeout=httpx.Timeout(self.timeout_s), limits=limits)

    @property
    def model_id(self) -> str:
        """``http:MODEL``, plus a digest of the published adapter versions once any is published: a reply cached
        under one version of an adapter never answers for the next."""
        if not self._published:
            return f"http:{self.model}"
        digest = hashlib.sha256(repr(sorted(self._published.items())).encode()).hexdigest()[:10]
        return f"http:{self.model}#published-{digest}"

    def served_model(self, adapter: str | None) -> str:
        """The ``model`` a request for ``adapter`` is sent with: the base model's name without one; else the adapter's
        latest published version, its mapped name (``adapters``), or its own name."""
        if adapter is None:
            return self.model
        return self._published.get(adapter) or self.adapters.get(adapter, adapter)

    def __repr__(self) -> str:
        return (
            f"OpenAIHTTPBackend(base_url={self.base_url!r}, model={self.model!r}, "
            f"api_key_env={self.api_key_env!r}, timeout_s={self.timeout_s}, max_retries={self.max_retries})"
        )

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> OpenAIHTTPBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------------------------------------- generate
    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        out = self.generate_settled(requests)
        for r in out:
            if isinstance(r, Failure):
                raise BackendError(r.message, cause=r.cause)
        return [r for r in out if isinstance(r, Completion)]

    def generate_settled(self, requests: Sequence[GenerationRequest]) -> list[Completion | Failure]:
        """Each request's completion, or its :class:`Failure` after the retries (order = input order)."""
        if len(requests) <= 1:
            return [self._settle(r) for r in requests]
        with ThreadPoolExecutor(max_workers=min(self.max_concurrency, len(requests))) as pool:
            return list(pool.map(self._settle, requests))

    def _settle(self, request: GenerationRequest) -> Completion | Failure:
        with self._slots:  # the bound holds across every thread using this backend
            try:
                return self._complete(request)
            except BackendError as e:
                return Failure(e.cause, str(e))

    def payload(self, request: GenerationRequest) -> dict[str, Any]:
        """The JSON body for one request (public so tests and users can see exactly what is sent)."""
        p = request.params
        body: dict[str, Any] = {
            "model": self.served_model(request.context.get("adapter")),
            "messages": [{"role": m.role, "content": m.content} for m in request.messages],
            "max_tokens": p.max_tokens,
            "temperature": p.temperature,
            "top_p": p.top_p,
            "seed": p.seed,
            "logprobs": True,
            # top_logprobs=0: the sampled token's log-prob only. llama-cpp-python's server returns
            # no log-probs at all unless top_logprobs is set (llama_chat_format.py passes
            # ``logprobs=top_logprobs if logprobs else None``); OpenAI and vLLM accept 0.
            "top_logprobs": 0,
            "n": 1,
        }
        if p.stop:
            body["stop"] = list(p.stop)
        if self.request_token_ids:
            body["return_tokens_as_token_ids"] = True  # vLLM extension
        return body

    def _complete(self, request: GenerationRequest) -> Completion:
        body = self.payload(request)
        out = self._post(self.url, body, lambda resp: self._served_as(self.parse(resp.json()), body["model"]))
        assert out is not None
        return out

    def _post(
        self,
        url: str,
        body: dict[str, Any],
        parse: Callable[[httpx.Response], T],
        done_anyway: Callable[[int, str], bool] | None = None,
    ) -> T | None:
        """POST ``body`` and parse the 200 reply, with the retry discipline of the class docstring. ``done_anyway``
        (status, text) of another reply: True ends the call with None (it may raise instead)."""
        last, cause = "", "backend_error"
        for attempt in range(self.max_retries + 1):
            retry_after = 0.0
            try:
                resp = self._client.post(url, json=body, headers=self._headers())
            except httpx.TimeoutException as e:
                last, cause = f"{type(e).__name__}: {e}", "timeout"
            except httpx.TransportError as e:  # refused, reset, DNS, a body cut off mid-way
                last, cause = f"{type(e).__name__}: {e}", "connection"
            else:
                if resp.status_code == 200:
                    try:
                        return parse(resp)
                    except ValueError as e:  # json.JSONDecodeError (and UnicodeDecodeError) are ValueErrors
                        last, cause = f"reply is not JSON ({e}): {self._scrub(resp.text[:200])!r}", "non_json"
                    except BackendError as e:
                        last, cause = str(e), "malformed_reply"
                elif done_anyway is not None and done_anyway(resp.status_code, self._scrub(resp.text[:300])):
                    return None
                else:
                    last, cause = (
                        f"HTTP {resp.status_code}: {self._scrub(resp.text[:200])!r}",
                        f"http_{resp.status_code}",
                    )
                    if resp.status_code not in _RETRY_STATUS:
                        raise BackendError(f"{url}: {last}", cause=cause)
                    retry_after = _retry_after_s(resp.headers)
            if attempt < self.max_retries:
                delay = min(self.max_backoff_s, max(retry_after, self.backoff_s * 2**attempt))
                time.sleep(delay)
        if self.max_retries == 0:
            raise BackendError(f"{url}: {last}", cause=cause)
        raise BackendError(f"{url}: failed after {self.max_retries + 1} attempts; last error: {last}", cause=cause)

    # ------------------------------------------------------------------------------ token-id prompts
    def generate_ids(
        self,
        prompts: Sequence[Sequence[int]],
        params: GenerationParams | Sequence[GenerationParams],
        adapter: str | None = None,
    ) -> list[GeneratedIds]:
        """Complete token-id prompts on the server (``POST /v1/completions`` with the ids as ``prompt``, vLLM's
        ``return_tokens_as_token_ids``), as :meth:`TransformersBackend.generate_ids` does in torch: phase 2 samples
        its trainable workers here with their adapters (``adapter`` = the request's model). Sent concurrently within
        the bound; a failure raises after the retries. The reply must carry token ids (vLLM does; a server that
        gives token strings only cannot serve phase 2: training needs the exact ids)."""
        plist = [params] * len(prompts) if isinstance(params, GenerationParams) else list(params)
        if len(plist) != len(prompts):
            raise BackendError(f"{len(prompts)} prompts but {len(plist)} params")
        model = self.served_model(adapter)

        def one(job: tuple[Sequence[int], GenerationParams]) -> GeneratedIds:
            prompt, p = job
            body: dict[str, Any] = {
                "model": model,
                "prompt": [int(t) for t in prompt],
                "max_tokens": p.max_tokens,
                "temperature": p.temperature,
                "top_p": p.top_p,
                "seed": p.seed,
                "logprobs": 1,  # the sampled token's log-prob is token_logprobs[k]
                "return_tokens_as_token_ids": True,
                "n": 1,
            }
            if p.stop:
                body["stop"] = list(p.stop)
            with self._slots:
                out = self._post(self.completions_url, body, lambda resp: self.parse_ids(resp.json()))
            assert out is not None
            return out

        jobs = list(zip(prompts, plist, strict=True))
        if len(jobs) <= 1:
            return [one(j) for j in jobs]
        with ThreadPoolExecutor(max_workers=min(self.max_concurrency, len(jobs))) as pool:
            return list(pool.map(one, jobs))

    def parse_ids(self, body: Any) -> GeneratedIds:
        """A ``/v1/completions`` reply → :class:`GeneratedIds`; a malformed one (or one without token ids) raises
        :class:`BackendError` naming the field."""
        choices = _get(body, "choices", list, "")
        if not choices:
            raise BackendError(f"{self.completions_url}: malformed reply: field 'choices' is empty")
        choice = _get(choices, 0, dict, "choices")
        text = _get(choice, "text", str, "choices[0]")
        raw_finish = _get(choice, "finish_reason", (str, type(None)), "choices[0]")
        lp = _get(choice, "logprobs", dict, "choices[0]")
        tokens = _get(lp, "tokens", list, "choices[0].logprobs")
        values = _get(lp, "token_logprobs", list, "choices[0].logprobs")
        ids = []
        for k, token in enumerate(tokens):
            match = _TOKEN_ID_RE.match(token) if isinstance(token, str) else None
            if match is None:
                raise BackendError(
                    f"{self.completions_url}: malformed reply: field 'choices[0].logprobs.tokens[{k}]' is "
                    f"{token!r}, not 'token_id:N' (the server ignored return_tokens_as_token_ids: phase 2 needs vLLM)"
                )
            ids.append(int(match.group(1)))
        if len(values) != len(ids) or not all(isinstance(v, int | float) for v in values):
            raise BackendError(
                f"{self.completions_url}: malformed reply: field 'choices[0].logprobs.token_logprobs' does not hold "
                f"one number per token ({len(values)} for {len(ids)})"
            )
        finish: FinishReason = _FINISH.get(raw_finish or "stop", "stop")
        return GeneratedIds(tuple(ids), tuple(float(v) for v in values), finish, text)

    def _served_as(self, c: Completion, served: str) -> Completion:
        if served == self.model:
            return c
        return dataclasses.replace(
            c, model_id=f"{self.model_id}+lora:{served}", metadata={**c.metadata, "served": served}
        )

    # ----------------------------------------------------------------------------------- adapters
    def publish_adapter(self, adapter: str, path: str | os.PathLike[str]) -> str:
        """Load the peft adapter folder ``path`` into the running vLLM server as the new version of ``adapter`` and
        send the adapter's later requests to it; the previous version is unloaded. Returns the served name,
        ``ADAPTER@<12 hex of the adapter's bytes>``: publishing the same bytes twice (a resumed run) is one load.
        ``path`` must be readable by the server (the same filesystem, or a path valid on its host)."""
        folder = os.fspath(path)
        served = f"{adapter}@{adapter_digest(folder)}"
        with self._lock:
            old = self._published.get(adapter)
            if old == served:
                return served
            self._admin("load_lora_adapter", {"lora_name": served, "lora_path": folder}, tolerate="already")
            self._published[adapter] = served
        if old is not None:  # the old version's requests are done: the engine publishes between updates
            with contextlib.suppress(BackendError):  # a version left loaded costs the server memory, not correctness
                self._admin("unload_lora_adapter", {"lora_name": old}, tolerate="not")
        return served

    def _admin(self, endpoint: str, body: dict[str, Any], tolerate: str) -> None:
        """POST ``/v1/{endpoint}`` with the request retry discipline; a 400 whose text holds ``tolerate`` (vLLM's
        "already loaded" / "not found") counts as done."""
        url = f"{self.base_url}/v1/{endpoint}"

        def done_anyway(status: int, text: str) -> bool:
            if status in (404, 405):
                raise BackendError(
                    f"{url}: HTTP {status}: this server has no runtime LoRA endpoint; start vLLM with --enable-lora and "
                    "the environment variable VLLM_ALLOW_RUNTIME_LORA_UPDATING=True",
                    cause=f"http_{status}",
                )
            return status == 400 and tolerate in text.lower()

        self._post(url, body, lambda resp: None, done_anyway)

    def _headers(self) -> dict[str, str]:
        key = os.environ.get(self.api_key_env, "")
        return {"Authorization": f"Bearer {key}"} if key else {}

    def _scrub(self, text: str) -> str:
        key = os.environ.get(self.api_key_env, "")
        return text.replace(key, "***") if key else text

    # ------------------------------------------------------------------------------------------ parse
    def parse(self, body: Any) -> Completion:
        """Turn a chat-completions reply into a :class:`Completion`; a malformed reply raises
        :class:`BackendError` naming the offending field (e.g. ``choices[0].message.content``)."""
        choices = _get(body, "choices", list, "")
        if not choices:
            raise BackendError(f"{self.url}: malformed reply: field 'choices' is empty")
        choice = _get(choices, 0, dict, "choices")
        message = _get(choice, "message", dict, "choices[0]")
        content = _get(message, "content", (str, type(None)), "choices[0].message")
        raw_finish = _get(choice, "finish_reason", (str, type(None)), "choices[0]")
        usage = _get(body, "usage", dict, "")
        prompt_tokens = _get(usage, "prompt_tokens", int, "usage")
        completion_tokens = _get(usage, "completion_tokens", int, "usage")
        metadata: dict[str, Any] = {}
        if isinstance(body.get("model"), str):
            metadata["server_model"] = body["model"]  # the model the server says answered (routing is checkable)
        finish: FinishReason = _FINISH.get(raw_finish or "stop", "stop")
        if raw_finish not in _FINISH:
            metadata["server_finish_reason"] = raw_finish
        token_ids: tuple[int, ...] = ()
        logprobs: tuple[float, ...] = ()
        lp = choice.get("logprobs")
        if lp is None:
            metadata["logprobs"] = "not returned by the server"
        else:
            entries = _get(lp, "content", (list, type(None)), "choices[0].logprobs") or []
            values, ids, tokens = [], [], []
            for k, entry in enumerate(entries):
                where = f"choices[0].logprobs.content[{k}]"
                if not isinstance(entry, dict):
                    raise BackendError(f"{self.url}: malformed reply: field {where!r} is not an object")
                value = _get(entry, "logprob", (int, float), where)
                values.append(float(value))
                token = entry.get("token")
                tokens.append(token if isinstance(token, str) else "")
                tid = entry.get("id", entry.get("token_id"))
                match = _TOKEN_ID_RE.match(token) if isinstance(token, str) else None
                if isinstance(tid, int) and not isinstance(tid, bool):
                    ids.append(tid)
                elif match:
                    ids.append(int(match.group(1)))
            logprobs = tuple(values)
            if ids and len(ids) == len(values):
                token_ids = tuple(ids)
            else:
                metadata["token_ids"] = "unavailable: the server returned token strings only"
                metadata["tokens"] = tuple(tokens)
        return Completion(
            text=content or "",
            token_ids=token_ids,
            logprobs=logprobs,
            finish_reason=finish,
            usage=Usage(prompt_tokens, completion_tokens),
            model_id=self.model_id,
            metadata=metadata,
        )


def adapter_digest(folder: str) -> str:
    """12 hex of the sha256 over a peft adapter folder's config and weights (what makes one version another)."""
    h = hashlib.sha256()
    names = sorted(n for n in os.listdir(folder) if n.startswith("adapter_")) if os.path.isdir(folder) else []
    if "adapter_config.json" not in names:
        raise BackendError(
            f"adapter folder {folder!r} is not a peft adapter (no adapter_config.json)", cause="bad_input"
        )
    for name in names:
        h.update(name.encode())
        with open(os.path.join(folder, name), "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()[:12]


def _get(obj: Any, key: str | int, kind: type | tuple[type, ...], where: str) -> Any:
    """``obj[key]`` checked against ``kind``; else a BackendError naming the dotted field path."""
    name = f"{where}[{key}]" if isinstance(key, int) else (f"{where}.{key}" if where else key)
    try:
        value = obj[key]
    except (KeyError, IndexError, TypeError):
        raise BackendError(f"malformed reply: field {name!r} is missing") from None
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise BackendError(f"malformed reply: field {name!r} has type {type(value).__name__}")
    return value


def _retry_after_s(headers: Mapping[str, str]) -> float:
    try:
        return max(0.0, float(headers.get("retry-after", "0")))
    except ValueError:
        return 0.0
