"""llama.cpp backend (llama-cpp-python): the default for frozen workers on CPU.

Why our own decode loop instead of ``Llama.create_chat_completion``: the high-level call returns
text (and, with ``logprobs``, per-token strings), not the ids the sampler drew, and its log-probs
are of the raw logits whatever the temperature and the top-k/min-p truncation its sampler chain
applies. Phase 2 needs the exact sampled ids and their behaviour log-probs, so we evaluate the prompt with
``llama_decode``, read rows of logits (``llama_get_logits_ith``, llama.h) and choose each token ourselves with
the rule in :mod:`orchestra.backends.sampling`.

The prompt is the model's own chat template from the GGUF metadata (``tokenizer.chat_template``),
rendered by llama-cpp-python's ``Jinja2ChatFormatter`` — the same template the transformers backend
applies, so both backends see the same prompt tokens.

A batch of requests is decoded together on one context (:mod:`orchestra.backends.llamacpp_streams`): up to
``batch_size`` sequences at once, each in its own KV stream, with the KV of recent prompts kept for reuse
(``prefix_cache``). ``batch_size=1, prefix_cache=0`` is the serial path: one request after another from an empty
KV cache, exactly as this backend worked before batching (and as ``llama_cpp.Llama.eval`` evaluates a prompt).
Batched and serial outputs agree to the bit on most turns (``benchmarks/record.py`` reports the greedy agreement:
94–100% of episodes on the arithmetic team); not on all, since a prefix continued in another micro-batch shape rounds
differently, so the response cache keeps them apart (``cache_namespace``).
"""

from __future__ import annotations

import atexit
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from orchestra.backends.base import BackendError, ChatMessage, Completion, GenerationRequest, Usage
from orchestra.backends.llamacpp_probe import require as require_probe
from orchestra.backends.llamacpp_streams import Job, Stats, Streams
from orchestra.backends.models import resolve_model

# ChatML, used only when a GGUF carries no chat template (SmolLM2's does).
FALLBACK_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


class _LoadedModel:
    """One loaded model (a ``Llama`` for its tokenizer and template) and its decoding contexts; shared by backends
    via ``_SHARED``. The lock serialises requests across all backends that share this model (workers of one team
    usually do)."""

    def __init__(self, path: Path, n_threads: int) -> None:
        import llama_cpp
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        self.path = path
        self.lock = threading.Lock()
        try:
            # the model, its tokenizer and template; decoding runs on contexts of our own (streams()), so this
            # object's own context is kept small
            self.llm = llama_cpp.Llama(
                model_path=str(path), n_ctx=64, n_threads=n_threads, n_threads_batch=n_threads, verbose=False
            )
        except (ValueError, RuntimeError) as e:
            raise BackendError(f"llama.cpp could not load {str(path)!r}: {e}") from e
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
        self._pieces: dict[int, bytes] = {}
        self._streams: dict[tuple[int, int, int, int], Streams] = {}

    def streams(self, n_ctx: int, n_threads: int, n_live: int, n_prefix: int) -> Streams:
        """The decoding context of this configuration, created once and shared by the backends that use it."""
        key = (n_ctx, n_threads, n_live, n_prefix)
        if key not in self._streams:
            self._streams[key] = Streams(
                self.llm.model,
                n_vocab=self.n_vocab,
                eog=self.eog,
                piece=self.piece,
                n_ctx=n_ctx,
                n_threads=n_threads,
                n_live=n_live,
                n_prefix=n_prefix,
            )
        return self._streams[key]

    def close(self) -> None:
        for streams in self._streams.values():
            streams.close()
        self._streams.clear()
        self.llm.close()

    def prompt_ids(self, messages: Sequence[ChatMessage]) -> list[int]:
        chat: list[Any] = [{"role": m.role, "content": m.content} for m in messages]
        rendered = self.formatter(messages=chat)
        # The template writes its own special tokens, so no BOS is added and specials are parsed,
        # exactly as llama-cpp-python's chat handler does (llama_chat_format.py).
        return list(self.llm.tokenize(rendered.prompt.encode("utf-8"), add_bos=False, special=True))

    def piece(self, token: int) -> bytes:
        """The bytes of one token (as ``detokenize`` renders it: specials not rendered)."""
        out = self._pieces.get(token)
        if out is None:
            out = self._pieces[token] = bytes(self.llm._model.detokenize([token]))
        return out

    def detok(self, ids: Sequence[int]) -> str:
        return bytes(self.llm.detokenize(list(ids))).decode("utf-8", errors="replace")


def physical_cores() -> int:
    """Physical cores this process may run on: llama.cpp's own default (``cpu_get_num_math`` in
    common.cpp) — one thread per core, hyper-threads excluded. llama-cpp-python's default, half the
    logical CPUs, halves decode speed on a machine without SMT (measured here: 2 cores, 1 vs 2
    threads, ~50 vs ~75 tok/s on SmolLM2).

    ``OMP_NUM_THREADS``, when set, caps it (torch honours it too): a Ray rollout actor that reserved one CPU runs on
    one thread (orchestra/runtime/distributed.py)."""
    cap = os.environ.get("OMP_NUM_THREADS", "").strip()
    limit = int(cap) if cap.isdigit() and int(cap) > 0 else None
    cores = _physical_cores()
    return min(cores, limit) if limit else cores


def _physical_cores() -> int:
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    cores = set()
    for cpu in cpus:
        topo = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        try:
            cores.add(((topo / "physical_package_id").read_text().strip(), (topo / "core_id").read_text().strip()))
        except OSError:
            return max(1, len(cpus))
    return max(1, len(cores) or os.cpu_count() or 1)


_SHARED: dict[tuple[str, int], _LoadedModel] = {}
_SHARED_LOCK = threading.Lock()


@atexit.register
def _close_shared() -> None:
    """Free the shared models before interpreter teardown: ``Llama.__del__`` run during module
    cleanup finds llama_cpp's globals already gone and prints a TypeError traceback."""
    with _SHARED_LOCK:
        for loaded in _SHARED.values():
            loaded.close()
        _SHARED.clear()


def load_shared(path: Path, n_threads: int) -> _LoadedModel:
    """Load a GGUF once per process per (path, n_threads); later calls reuse it. The first load of a model with this
    library on this CPU is preceded by a decode in a child process (:mod:`orchestra.backends.llamacpp_probe`), so a
    build that crashes here raises one clear BackendError instead of killing the process."""
    key = (str(path), n_threads)
    with _SHARED_LOCK:
        if key not in _SHARED:
            require_probe(path)
            _SHARED[key] = _LoadedModel(path, n_threads)
        return _SHARED[key]


class LlamaCppBackend:
    """Serve chat requests with llama.cpp, ``batch_size`` sequences at a time.

    Args:
        model: ``"smollm2"`` (the embedded GGUF) or a path to a ``.gguf`` file.
        n_ctx: context window in tokens per sequence (prompt + completion); a longer prompt raises BackendError.
        n_threads: CPU threads (None = the physical cores, as llama.cpp's own CLI defaults to).
        seed: mixed into each request's seed, so two backends with different seeds sample differently
            while one backend repeats itself for a given request seed.
        batch_size: sequences decoded at once (the rollout engine hands a backend every pending turn of its envs);
            1 = the serial path.
        prefix_cache: recent prompts whose KV is kept to start later prompts from their longest shared prefix
            (0 = every prompt prefilled from scratch, as in the serial path).
    """

    def __init__(
        self,
        model: str | os.PathLike[str] = "smollm2",
        n_ctx: int = 2048,
        n_threads: int | None = None,
        seed: int = 0,
        batch_size: int = 8,
        prefix_cache: int = 8,
    ) -> None:
        source = resolve_model(model)
        if source.kind != "gguf":
            raise BackendError(f"llama.cpp needs a .gguf file, got the Hugging Face folder {str(source.path)!r}")
        if int(batch_size) < 1 or int(prefix_cache) < 0:
            raise BackendError(f"llama.cpp: need batch_size ≥ 1 and prefix_cache ≥ 0, got {batch_size}, {prefix_cache}")
        self.source = source
        self.seed = int(seed)
        self.model_id = f"llamacpp:{source.name}"
        self.n_ctx, self.batch_size, self.prefix_cache = int(n_ctx), int(batch_size), int(prefix_cache)
        self.n_threads = int(n_threads) if n_threads else physical_cores()
        self._m = load_shared(source.path, self.n_threads)
        self._streams = self._m.streams(self.n_ctx, self.n_threads, self.batch_size, self.prefix_cache)

    def __repr__(self) -> str:
        return (
            f"LlamaCppBackend(model={str(self.source.path)!r}, n_ctx={self.n_ctx}, batch_size={self.batch_size}, "
            f"prefix_cache={self.prefix_cache})"
        )

    @property
    def serial(self) -> bool:
        """One request at a time from an empty KV cache (the path that produced the published tables)."""
        return self.batch_size == 1 and self.prefix_cache == 0

    # a sampled completion is a function of the request (its seed included) and self.seed: cacheable
    seeded_sampling = True

    @property
    def cache_namespace(self) -> str:
        """Response-cache namespace: batched completions are stored apart from serial ones (they may round
        differently), so a cache never answers one decoding plan with the other's output."""
        return "" if self.serial else "llamacpp-batched"

    @property
    def chat_template(self) -> str:
        return self._m.template

    @property
    def stats(self) -> Stats:
        """Prompt tokens served, prefilled and reused, completion tokens and ``llama_decode`` calls so far (shared
        by the backends on the same context)."""
        return self._streams.stats

    def prompt_ids(self, messages: Sequence[ChatMessage]) -> list[int]:
        """The prompt token ids for a chat (chat template + generation prompt)."""
        return self._m.prompt_ids(messages)

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        m = self._m
        jobs = [
            Job(m.prompt_ids(r.messages), r.params, np.random.default_rng([self.seed, r.params.seed])) for r in requests
        ]
        with m.lock:
            self._streams.serve(jobs, m.detok)
        return [
            Completion(
                text=job.text,
                token_ids=tuple(job.ids),
                logprobs=tuple(job.logprobs),
                finish_reason=job.finish or "length",
                usage=Usage(prompt_tokens=len(job.prompt), completion_tokens=len(job.ids)),
                model_id=self.model_id,
                metadata={},
            )
            for job in jobs
        ]

    def info(self) -> dict[str, Any]:
        return {
            "model_id": self.model_id,
            "path": str(self.source.path),
            "n_ctx": self.n_ctx,
            "batch_size": self.batch_size,
            "prefix_cache": self.prefix_cache,
        }
