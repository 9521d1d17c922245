"""llama.cpp backend (llama-cpp-python): the default for frozen workers on CPU.

Why our own decode loop instead of ``Llama.create_chat_completion``: the high-level call returns
text (and, with ``logprobs``, per-token strings), not the ids the sampler drew, and its log-probs
are of the raw logits whatever the temperature and the top-k/min-p truncation its sampler chain
applies. Phase 2 needs the exact sampled ids and
their behaviour log-probs, so we evaluate the prompt with ``Llama.eval``, read the last row of logits
(``llama_get_logits_ith(ctx, -1)``, llama.h) and choose each token ourselves with the rule in
:mod:`orchestra.backends.sampling`.

The prompt is the model's own chat template from the GGUF metadata (``tokenizer.chat_template``),
rendered by llama-cpp-python's ``Jinja2ChatFormatter`` — the same template the transformers backend
applies, so both backends see the same prompt tokens.

Each request starts from an empty KV cache (``Llama.reset``). Reusing a shared prompt prefix would
save prompt evaluation, but a prefix evaluated in a different batch shape rounds differently, and a
greedy completion must not depend on which request ran before it (the response cache relies on it).
"""

from __future__ import annotations

import atexit
import ctypes
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from orchestra.backends.base import BackendError, ChatMessage, Completion, FinishReason, GenerationRequest, Usage
from orchestra.backends.models import resolve_model
from orchestra.backends.sampling import choose_token_np, first_stop

# ChatML, used only when a GGUF carries no chat template (SmolLM2's does).
FALLBACK_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


class _LoadedModel:
    """One loaded ``Llama`` plus what every request needs; shared by backends via ``_SHARED``.

    A llama.cpp context holds one KV cache, so the lock serialises requests across all backends that
    share this model (workers of one team usually do).
    """

    def __init__(self, path: Path, n_ctx: int, n_threads: int) -> None:
        import llama_cpp
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        self.path = path
        self.lock = threading.Lock()
        try:
            self.llm = llama_cpp.Llama(
                model_path=str(path),
                n_ctx=n_ctx,
                n_threads=n_threads,
                n_threads_batch=n_threads,
                verbose=False,
            )
        except (ValueError, RuntimeError) as e:
            raise BackendError(f"llama.cpp could not load {str(path)!r}: {e}") from e
        self.n_ctx = self.llm.n_ctx()
        self.n_vocab = self.llm.n_vocab()
        vocab = llama_cpp.llama_model_get_vocab(self.llm.model)
        # End-of-generation ids (EOS, EOT, <|im_end|>...) as llama.cpp itself decides them.
        self.eog = frozenset(t for t in range(self.n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, t))
        meta = self.llm.metadata
        eos, bos = self.llm.token_eos(), self.llm.token_bos()
        self.template = meta.get("tokenizer.chat_template", FALLBACK_TEMPLATE)
        self.formatter = Jinja2ChatFormatter(
            template=self.template,
            eos_token=self.llm._model.token_get_text(eos) if eos >= 0 else "",
            bos_token=self.llm._model.token_get_text(bos) if bos >= 0 else "",
            add_generation_prompt=True,
        )
        self._get_logits_ith = llama_cpp.llama_get_logits_ith

    def prompt_ids(self, messages: Sequence[ChatMessage]) -> list[int]:
        chat: list[Any] = [{"role": m.role, "content": m.content} for m in messages]
        rendered = self.formatter(messages=chat)
        # The template writes its own special tokens, so no BOS is added and specials are parsed,
        # exactly as llama-cpp-python's chat handler does (llama_chat_format.py).
        return list(self.llm.tokenize(rendered.prompt.encode("utf-8"), add_bos=False, special=True))

    def last_logits(self) -> np.ndarray:
        ptr = self._get_logits_ith(self.llm.ctx, -1)
        if not ptr:
            raise BackendError("llama.cpp returned no logits")
        row = np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)), shape=(self.n_vocab,))
        return row.copy()

    def detok(self, ids: Sequence[int]) -> str:
        return bytes(self.llm.detokenize(list(ids))).decode("utf-8", errors="replace")


def physical_cores() -> int:
    """Physical cores this process may run on: llama.cpp's own default (``cpu_get_num_math`` in
    common.cpp) — one thread per core, hyper-threads excluded. llama-cpp-python's default, half the
    logical CPUs, halves decode speed on a machine without SMT (measured here: 2 cores, 1 vs 2
    threads, ~50 vs ~75 tok/s on SmolLM2)."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    cores = set()
    for cpu in cpus:
        topo = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        try:
            cores.add(((topo / "physical_package_id").read_text().strip(), (topo / "core_id").read_text().strip()))
        except OSError:
            return max(1, len(cpus))
    return max(1, len(cores) or os.cpu_count() or 1)


_SHARED: dict[tuple[str, int, int], _LoadedModel] = {}
_SHARED_LOCK = threading.Lock()


@atexit.register
def _close_shared() -> None:
    """Free the shared models before interpreter teardown: ``Llama.__del__`` run during module
    cleanup finds llama_cpp's globals already gone and prints a TypeError traceback."""
    with _SHARED_LOCK:
        for loaded in _SHARED.values():
            loaded.llm.close()
        _SHARED.clear()


def load_shared(path: Path, n_ctx: int, n_threads: int) -> _LoadedModel:
    """Load a GGUF once per process per (path, n_ctx, n_threads); later calls reuse it."""
    key = (str(path), n_ctx, n_threads)
    with _SHARED_LOCK:
        if key not in _SHARED:
            _SHARED[key] = _LoadedModel(path, n_ctx, n_threads)
        return _SHARED[key]


class LlamaCppBackend:
    """Serve chat requests with llama.cpp, one after another (a llama.cpp context is one stream).

    Args:
        model: ``"smollm2"`` (the embedded GGUF) or a path to a ``.gguf`` file.
        n_ctx: context window in tokens (prompt + completion); a longer prompt raises BackendError.
        n_threads: CPU threads (None = the physical cores, as llama.cpp's own CLI defaults to).
        seed: mixed into each request's seed, so two backends with different seeds sample differently
            while one backend repeats itself for a given request seed.
    """

    def __init__(
        self, model: str | os.PathLike[str] = "smollm2", n_ctx: int = 2048, n_threads: int | None = None, seed: int = 0
    ) -> None:
        source = resolve_model(model)
        if source.kind != "gguf":
            raise BackendError(f"llama.cpp needs a .gguf file, got the Hugging Face folder {str(source.path)!r}")
        self.source = source
        self.seed = int(seed)
        self.model_id = f"llamacpp:{source.name}"
        self._m = load_shared(source.path, int(n_ctx), int(n_threads) if n_threads else physical_cores())

    def __repr__(self) -> str:
        return f"LlamaCppBackend(model={str(self.source.path)!r}, n_ctx={self._m.n_ctx})"

    @property
    def chat_template(self) -> str:
        return self._m.template

    def prompt_ids(self, messages: Sequence[ChatMessage]) -> list[int]:
        """The prompt token ids for a chat (chat template + generation prompt)."""
        return self._m.prompt_ids(messages)

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        return [self._generate_one(r) for r in requests]

    def _generate_one(self, request: GenerationRequest) -> Completion:
        m, params = self._m, request.params
        prompt = m.prompt_ids(request.messages)
        if len(prompt) >= m.n_ctx:
            raise BackendError(f"prompt of {len(prompt)} tokens does not fit n_ctx={m.n_ctx}")
        rng = np.random.default_rng([self.seed, params.seed])
        ids: list[int] = []
        logprobs: list[float] = []
        finish: FinishReason = "length"
        text = ""
        with m.lock:
            llm = m.llm
            llm.reset()  # a fresh KV cache per request: output never depends on the previous one
            llm.eval(prompt)
            for _ in range(params.max_tokens):
                token, logprob = choose_token_np(m.last_logits(), params, rng)
                ids.append(token)
                logprobs.append(logprob)
                if token in m.eog:  # the EOS id is kept (it was sampled); the text excludes it
                    text = m.detok(ids[:-1])
                    finish = "stop"
                    break
                text = m.detok(ids)
                cut = first_stop(text, params.stop)
                if cut is not None:  # text is cut before the stop; the ids that produced it are kept
                    text = text[:cut]
                    finish = "stop"
                    break
                if llm.n_tokens >= m.n_ctx:  # context full: as good as max_tokens
                    break
                llm.eval([token])
        return Completion(
            text=text,
            token_ids=tuple(ids),
            logprobs=tuple(logprobs),
            finish_reason=finish,
            usage=Usage(prompt_tokens=len(prompt), completion_tokens=len(ids)),
            model_id=self.model_id,
            metadata={},
        )

    def info(self) -> dict[str, Any]:
        return {"model_id": self.model_id, "path": str(self.source.path), "n_ctx": self._m.n_ctx}
