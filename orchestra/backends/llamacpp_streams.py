"""Batched multi-sequence decoding on one llama.cpp context, with prompt-prefix reuse (the engine of
:class:`~orchestra.backends.llamacpp.LlamaCppBackend`).

The pattern is llama.cpp's own ``examples/batched`` and ``examples/parallel``: one context with ``n_seq_max``
sequences, a ``llama_batch`` holding tokens of several sequences (each token tagged with its sequence id and
position), one ``llama_decode`` for all prompts of a wave, then one ``llama_decode`` per step carrying the next token
of every live sequence; a sequence leaves (its KV removed with ``llama_memory_seq_rm``) as soon as it stops, and a
waiting request takes its slot.

Choices, and why (measured on SmolLM2-135M Q4_1, 2 cores; ``benchmarks/record.py`` repeats the figures):

* **One KV stream per sequence** (``kv_unified = false``). Each sequence attends over its own cells only, laid out
  exactly as in a one-sequence context, so a sequence's logits mostly match the serial path's (greedy agreement on
  the recorded arithmetic prompts: 32 of 32 turns; 60 of 64 with batches of 16). A unified cache made every token
  attend over every live sequence's cells: no faster, and 6 to 12 of 32 greedy completions changed.
* **Flash attention off**, as in the serial path (``llama_cpp.Llama``'s default): the kernels differ, and with it on
  batched and serial logits differed by up to ~0.9.
* **Whole prompts per ``llama_decode`` call** (packed up to ``n_batch`` tokens, never split), so a prompt is processed
  in one micro-batch as it is serially; a prompt longer than ``n_batch`` is cut at the same multiples of ``n_batch``.
* **Prefix reuse**: after its prefill, a prompt's KV is kept in one of ``n_prefix`` extra streams (least recently used
  evicted). A new prompt starts from the cached prompt sharing its longest prefix: that stream is copied to the
  sequence's own (``llama_memory_seq_cp`` across streams copies the buffer), the tail past the shared prefix removed,
  and only the rest prefilled. Prompts of one wave share with each other too: a prompt whose best match is another
  prompt of the same wave waits for a second ``llama_decode`` and starts from that prompt's KV. Team prompts start with
  the worker's role prompt and instruction, so most of a turn's prompt is shared with earlier turns.

Sampling stays in Python (:mod:`orchestra.backends.sampling`), per request and with the request's own generator, so a
sequence's samples depend on its logits and seed only, never on what else is in the batch.
"""

from __future__ import annotations

import codecs
import ctypes
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from orchestra.backends.base import BackendError, FinishReason, GenerationParams
from orchestra.backends.sampling import choose_token_np, first_stop

# a wave-mate's prefix is worth a second llama_decode call only if it saves at least this many prompt tokens
MIN_SHARED = 16


@dataclass
class Job:
    """One request being served: its prompt ids, sampling rule and generator, and what it produced so far."""

    prompt: list[int]
    params: GenerationParams
    rng: np.random.Generator
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish: FinishReason | None = None
    text: str = ""  # set when the job finishes (from all its ids, exactly as the serial path decodes them)
    reused: int = 0  # prompt tokens taken from a cached or shared prefix instead of prefilled
    # incremental detokenisation for the stop-string check
    _live_text: str = ""
    _decoder: Any = None
    _cut: int | None = None


@dataclass
class _Prefix:
    seq: int  # the stream holding it
    tokens: tuple[int, ...]
    used: int  # logical clock of the last use (least recently used = evicted)


@dataclass
class Stats:
    """Counters of one stream set (summed over every wave it served)."""

    prompt_tokens: int = 0  # tokens of the prompts served
    prefilled: int = 0  # prompt tokens actually evaluated
    reused: int = 0  # prompt tokens copied from a cached or shared prefix
    decoded: int = 0  # completion tokens evaluated
    decode_calls: int = 0  # llama_decode calls
    prefill_seconds: float = 0.0  # wall time of the prompts' llama_decode calls (prefix copies included)
    decode_seconds: float = 0.0  # wall time of the per-step llama_decode calls


def _lcp(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class Streams:
    """A llama.cpp context with ``n_live`` sequence slots plus ``n_prefix`` prefix-cache slots, one KV stream each.

    Args:
        model: the ``llama_model`` pointer (owned by the caller; it must outlive this object).
        n_vocab, eog, piece: the vocabulary size, the end-of-generation ids and ``token → bytes`` of the model.
        n_ctx: context window per sequence (prompt + completion).
        n_threads: CPU threads for prompt and token evaluation.
        n_live: sequences decoded at once (1 = the serial path).
        n_prefix: prompts whose KV is kept for reuse (0 = none: every prompt is prefilled from scratch).
        n_batch: tokens per ``llama_decode`` call (prompts are packed up to this many).
    """

    def __init__(
        self,
        model: Any,
        *,
        n_vocab: int,
        eog: frozenset[int],
        piece: Any,
        n_ctx: int,
        n_threads: int,
        n_live: int,
        n_prefix: int,
        n_batch: int = 512,
    ) -> None:
        import llama_cpp

        if n_live < 1 or n_prefix < 0:
            raise BackendError(f"llama.cpp: need batch_size ≥ 1 and prefix_cache ≥ 0, got {n_live}, {n_prefix}")
        self._ll = llama_cpp
        self.n_vocab, self.eog, self.piece = n_vocab, eog, piece
        self.n_ctx, self.n_live, self.n_prefix, self.n_batch = n_ctx, n_live, n_prefix, n_batch
        n_seq = n_live + n_prefix
        if n_seq > llama_cpp.llama_max_parallel_sequences():
            raise BackendError(
                f"llama.cpp: batch_size + prefix_cache = {n_seq} exceeds its {llama_cpp.llama_max_parallel_sequences()}"
                " parallel sequences"
            )
        cp = llama_cpp.llama_context_default_params()
        cp.n_ctx = n_ctx * n_seq  # split evenly: each stream gets n_ctx cells
        cp.n_batch = cp.n_ubatch = n_batch
        cp.n_seq_max = n_seq
        cp.kv_unified = False
        cp.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
        cp.n_threads = cp.n_threads_batch = n_threads
        self.ctx = llama_cpp.llama_init_from_model(model, cp)
        if not self.ctx:
            raise BackendError(f"llama.cpp could not create a context of {n_seq} sequences × {n_ctx} tokens")
        self.mem = llama_cpp.llama_get_memory(self.ctx)
        self.batch = llama_cpp.llama_batch_init(n_batch, 0, 1)
        self.prefixes: list[_Prefix] = []
        self.free_prefix = list(range(n_live, n_seq))[::-1]
        self.clock = 0
        self.stats = Stats()

    def close(self) -> None:
        if self.batch is not None:
            self._ll.llama_batch_free(self.batch)
            self.batch = None
        if self.ctx:
            self._ll.llama_free(self.ctx)
            self.ctx = None

    # -- llama.cpp calls ----------------------------------------------------------------------------------------
    def _decode(self, items: Sequence[tuple[int, int, int, bool]]) -> None:
        """One ``llama_decode`` of (token, position, sequence, wants logits) items."""
        b = self.batch
        b.n_tokens = len(items)
        for j, (token, pos, seq, out) in enumerate(items):
            b.token[j], b.pos[j], b.n_seq_id[j], b.logits[j] = token, pos, 1, out
            b.seq_id[j][0] = seq
        rc = self._ll.llama_decode(self.ctx, b)
        self.stats.decode_calls += 1
        if rc != 0:
            raise BackendError(f"llama_decode failed with code {rc} on a batch of {len(items)} tokens")

    def _logits(self, i: int) -> np.ndarray:
        ptr = self._ll.llama_get_logits_ith(self.ctx, i)
        if not ptr:
            raise BackendError("llama.cpp returned no logits")
        row = np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)), shape=(self.n_vocab,))
        return row.copy()

    def _copy(self, src: int, dst: int, keep: int) -> None:
        """Sequence ``dst`` := the first ``keep`` positions of sequence ``src`` (another stream: the buffer is copied)."""
        self._ll.llama_memory_seq_rm(self.mem, dst, -1, -1)
        self._ll.llama_memory_seq_cp(self.mem, src, dst, -1, -1)
        self._ll.llama_memory_seq_rm(self.mem, dst, keep, -1)

    # -- the prefix cache -----------------------------------------------------------------------------------------
    def _best_prefix(self, prompt: Sequence[int]) -> tuple[_Prefix | None, int]:
        best, best_len = None, 0
        for p in self.prefixes:
            n = _lcp(p.tokens, prompt)
            if n > best_len:
                best, best_len = p, n
        return best, min(best_len, len(prompt) - 1)  # the last prompt token is always evaluated: its logits

    def _remember(self, slot: int, prompt: Sequence[int]) -> None:
        """Keep the prompt now in ``slot`` (exactly its prompt's positions) in a prefix stream."""
        if not self.n_prefix:
            return
        self.clock += 1
        tokens = tuple(prompt)
        for p in self.prefixes:
            if p.tokens == tokens:
                p.used = self.clock
                return
        # a cached prompt that the new one extends is replaced by it; else the least recently used goes
        extended = [p for p in self.prefixes if tokens[: len(p.tokens)] == p.tokens]
        if extended:
            entry = extended[0]
        elif self.free_prefix:
            entry = _Prefix(self.free_prefix.pop(), (), 0)
            self.prefixes.append(entry)
        else:
            entry = min(self.prefixes, key=lambda p: p.used)
        self._copy(slot, entry.seq, len(tokens))
        entry.tokens, entry.used = tokens, self.clock

    # -- serving ------------------------------------------------------------------------------------------------
    def _prefill(self, wave: list[tuple[int, Job]]) -> dict[int, np.ndarray]:
        """Evaluate the prompts of ``wave`` ((slot, job) pairs); the logits row after each prompt, by slot."""
        starts: dict[int, int] = {}  # slot → first position to evaluate
        followers: list[tuple[int, Job, int, int]] = []  # (slot, job, leader slot, shared length)
        first: list[tuple[int, Job]] = []
        for i, (slot, job) in enumerate(wave):
            prefix, k = self._best_prefix(job.prompt)
            mate, k_mate = None, 0
            for other_slot, other in wave[:i]:
                n = min(_lcp(other.prompt, job.prompt), len(job.prompt) - 1)
                if n > k_mate and all(o != other_slot for o, _, _, _ in followers):
                    mate, k_mate = other_slot, n
            if mate is not None and k_mate >= k + MIN_SHARED:
                followers.append((slot, job, mate, k_mate))
                continue
            if prefix is not None and k > 0:
                self._copy(prefix.seq, slot, k)
                self.clock += 1
                prefix.used = self.clock
            else:
                self._ll.llama_memory_seq_rm(self.mem, slot, -1, -1)
            starts[slot] = k
            first.append((slot, job))
        rows = self._evaluate([(slot, job, starts[slot]) for slot, job in first])
        if followers:
            for slot, _job, mate, k in followers:
                self._copy(mate, slot, k)
                starts[slot] = k
            rows.update(self._evaluate([(slot, job, starts[slot]) for slot, job, _, _ in followers]))
        for slot, job in wave:
            job.reused = starts[slot]
            self.stats.prompt_tokens += len(job.prompt)
            self.stats.reused += starts[slot]
            self.stats.prefilled += len(job.prompt) - starts[slot]
            self._remember(slot, job.prompt)
        return rows

    def _evaluate(self, parts: list[tuple[int, Job, int]]) -> dict[int, np.ndarray]:
        """Prefill ``job.prompt[start:]`` of every (slot, job, start): whole prompts packed into calls of at most
        ``n_batch`` tokens; a longer one alone, cut at multiples of ``n_batch``."""
        rows: dict[int, np.ndarray] = {}
        calls: list[list[tuple[int, int, int, bool]]] = []
        pending: list[tuple[int, int, int, bool]] = []
        for slot, job, start in parts:
            items = [(t, start + i, slot, start + i == len(job.prompt) - 1) for i, t in enumerate(job.prompt[start:])]
            if len(pending) + len(items) > self.n_batch and pending:
                calls.append(pending)
                pending = []
            if len(items) > self.n_batch:
                calls += [items[c : c + self.n_batch] for c in range(0, len(items), self.n_batch)]
            else:
                pending += items
        if pending:
            calls.append(pending)
        t0 = time.perf_counter()
        for items in calls:
            self._decode(items)
            for j, (_t, _pos, slot, out) in enumerate(items):
                if out:
                    rows[slot] = self._logits(j)
        self.stats.prefill_seconds += time.perf_counter() - t0
        return rows

    def _step(self, job: Job, logits: np.ndarray) -> int | None:
        """Sample the job's next token; return it if the job goes on, None if it just finished."""
        token, logprob = choose_token_np(logits, job.params, job.rng)
        job.ids.append(token)
        job.logprobs.append(logprob)
        if token in self.eog:  # the EOS id is kept (it was sampled); the text excludes it
            job.finish = "stop"
            return None
        if job._decoder is None:
            job._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        before = len(job._live_text)
        job._live_text += job._decoder.decode(self.piece(token))
        stops = job.params.stop
        if stops:
            longest = max((len(s) for s in stops), default=0)
            lo = max(0, before - longest + 1)
            cut = first_stop(job._live_text[lo:], stops)
            if cut is not None:  # the ids that produced the stop are kept; the text is cut before it
                job._cut, job.finish = lo + cut, "stop"
                return None
        if len(job.ids) >= job.params.max_tokens or len(job.prompt) + len(job.ids) - 1 >= self.n_ctx:
            job.finish = "length"  # max_tokens, or the context is full
            return None
        return token

    def serve(self, jobs: Sequence[Job], detok: Any) -> None:
        """Run every job to its end: ``n_live`` at a time, a waiting job taking the slot of one that stopped.
        ``detok(ids) -> str`` renders a finished job's text (as the serial path always did)."""
        for job in jobs:
            if len(job.prompt) >= self.n_ctx:
                raise BackendError(
                    f"prompt of {len(job.prompt)} tokens does not fit n_ctx={self.n_ctx}", cause="context_overflow"
                )
        waiting = list(jobs)[::-1]
        live: dict[int, Job] = {}
        rows: dict[int, np.ndarray] = {}
        while waiting or live:
            free = [s for s in range(self.n_live) if s not in live]
            wave = [(s, waiting.pop()) for s in free[: len(waiting)]]
            for slot, job in wave:
                if job.params.max_tokens <= 0:  # nothing to generate
                    job.finish = "length"
                else:
                    live[slot] = job
            wave = [(s, j) for s, j in wave if s in live]
            if wave:
                rows.update(self._prefill(wave))
            step: list[tuple[int, int, int, bool]] = []
            for slot in sorted(live):
                job = live[slot]
                token = self._step(job, rows.pop(slot))
                if token is None:
                    del live[slot]
                    self._ll.llama_memory_seq_rm(self.mem, slot, -1, -1)
                else:
                    step.append((token, len(job.prompt) + len(job.ids) - 1, slot, True))
            if step:
                t0 = time.perf_counter()
                self._decode(step)
                self.stats.decode_seconds += time.perf_counter() - t0
                self.stats.decoded += len(step)
                for j, (_t, _pos, slot, _out) in enumerate(step):
                    rows[slot] = self._logits(j)
        for job in jobs:
            ids = job.ids[:-1] if job.ids and job.ids[-1] in self.eog else job.ids
            text = detok(ids)
            job.text = text[: job._cut] if job._cut is not None else text


__all__ = ["Job", "MIN_SHARED", "Stats", "Streams"]
