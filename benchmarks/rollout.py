"""Generation throughput of the backends on the embedded SmolLM2, ratios measured in one run.

    python benchmarks/rollout.py [--seed 0] [--n-requests 16] [--max-tokens 64]

Prints (docs/architecture.md §7: ratios against a baseline measured in the same run, absolute figures labelled
with the machine):

- transformers: one batched ``generate`` of all requests (``max_batch_size`` = n) vs the same
  requests one at a time — tokens/s and the ratio;
- llama.cpp: tokens/s on the same requests, served one after another (the serial path; the batched path on recording
  work: ``benchmarks/record.py``);
- response cache: replay of the same greedy requests from SQLite vs their generation — the ratio.

Speed is never asserted in tests; this script is where it is measured. Importable: ``run(...)``
returns the figures as a flat dict of ``perf/...`` keys.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repo importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from orchestra.backends import (  # noqa: E402
    CachedBackend,
    ChatMessage,
    Completion,
    GenerationParams,
    GenerationRequest,
    ResponseCache,
)

_TEMPLATES = (
    "Tom has {a} apples. He buys {b} more. How many apples does he have now? Explain step by step.",
    "What is {a} + {b}? Show your working in detail.",
    "Write a short story about a robot who owns {a} books and reads {b} of them.",
    "A train travels {a} km in the morning and {b} km in the afternoon. How far does it go in total? Explain.",
    "List {a} reasons why the number {b} is interesting.",
)


def make_requests(n: int, max_tokens: int, seed: int) -> list[GenerationRequest]:
    """``n`` distinct greedy chat requests of varied prompt lengths (deterministic in ``seed``)."""
    rng = random.Random(seed)
    params = GenerationParams(max_tokens=max_tokens, temperature=0.0)
    out = []
    for i in range(n):
        text = _TEMPLATES[i % len(_TEMPLATES)].format(a=rng.randint(2, 40), b=rng.randint(2, 40))
        out.append(GenerationRequest(messages=(ChatMessage("user", text),), params=params))
    return out


def _timed(fn: Callable[[], list[Completion]]) -> tuple[list[Completion], float]:
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def _tokens(completions: Sequence[Completion]) -> int:
    return sum(c.usage.completion_tokens for c in completions)


def machine() -> str:
    return f"{platform.platform()} | {platform.processor() or platform.machine()} | cpu_count={os.cpu_count()} | python {platform.python_version()}"


def run(
    seed: int = 0, n_requests: int = 16, max_tokens: int = 64, transformers: bool = True, rounds: int = 2
) -> dict[str, Any]:
    """Measure and print every figure; return them as a flat ``perf/...`` dict."""
    import torch

    from orchestra.backends.llamacpp import LlamaCppBackend

    torch.manual_seed(seed)
    requests = make_requests(n_requests, max_tokens, seed)
    m: dict[str, Any] = {"perf/machine": machine(), "perf/n_requests": n_requests, "perf/max_tokens": max_tokens}
    print(f"machine: {m['perf/machine']}  torch threads={torch.get_num_threads()}")
    print(f"requests: {n_requests} greedy chats, max_tokens={max_tokens}, seed={seed}")

    if transformers:
        from orchestra.backends.hf import TransformersBackend

        t0 = time.perf_counter()
        hf = TransformersBackend("smollm2", max_batch_size=n_requests)
        m["perf/hf_load_s"] = time.perf_counter() - t0
        hf.generate(requests[:1])  # warm-up (first-call allocations)
        # Interleaved rounds: each round runs the whole batch once and 1/rounds of the requests one
        # at a time, so a drift in machine load (shared boxes) hits both sides alike.
        tok_b = tok_s = 0
        t_batched = t_single = 0.0
        single: dict[int, Completion] = {}
        for k in range(rounds):
            batched, dt = _timed(lambda: hf.generate(requests))
            tok_b, t_batched = tok_b + _tokens(batched), t_batched + dt
            part = list(range(k, n_requests, rounds))
            out, dt = _timed(lambda: [hf.generate([requests[i]])[0] for i in part])  # noqa: B023
            tok_s, t_single = tok_s + _tokens(out), t_single + dt
            single.update(zip(part, out, strict=True))
        m["perf/hf_batched_tok_s"] = tok_b / t_batched
        m["perf/hf_single_tok_s"] = tok_s / t_single
        m["perf/hf_batched_over_single"] = m["perf/hf_batched_tok_s"] / m["perf/hf_single_tok_s"]
        same = sum(c.token_ids == single[i].token_ids for i, c in enumerate(batched))
        m["perf/hf_batched_equals_single"] = same / n_requests
        print(f"transformers (fp32, loaded in {m['perf/hf_load_s']:.1f}s; {rounds} interleaved rounds):")
        print(
            f"  batched ({n_requests}/forward): {tok_b} tokens in {t_batched:.2f}s = {m['perf/hf_batched_tok_s']:.1f} tok/s"
        )
        print(f"  one request at a time:    {tok_s} tokens in {t_single:.2f}s = {m['perf/hf_single_tok_s']:.1f} tok/s")
        print(
            f"  ratio batched/single:     {m['perf/hf_batched_over_single']:.2f}x  (greedy outputs identical: {same}/{n_requests})"
        )

    llama = LlamaCppBackend("smollm2", batch_size=1, prefix_cache=0)  # the serial path (batched: benchmarks/record.py)
    llama.generate(requests[:1])  # warm-up
    with tempfile.TemporaryDirectory() as tmp:
        # The first (all-miss) pass through the cache is also the llama.cpp measurement: a miss adds
        # one SQLite insert (well under a millisecond) to about a second of generation.
        cache = ResponseCache(Path(tmp) / "responses.sqlite")
        cached = CachedBackend(llama, cache)
        first, t_gen = _timed(lambda: cached.generate(requests))
        replay, t_replay = _timed(lambda: cached.generate(requests))
        assert cached.hits == n_requests and all(r.cached for r in replay)
        assert [r.token_ids for r in replay] == [f.token_ids for f in first]
        cache.close()
    m["perf/llamacpp_tok_s"] = _tokens(first) / t_gen
    m["perf/cache_generate_s"] = t_gen
    m["perf/cache_replay_s"] = t_replay
    m["perf/cache_replay_speedup"] = t_gen / max(t_replay, 1e-9)
    print(
        f"llama.cpp (Q4_1, one request at a time): {_tokens(first)} tokens in {t_gen:.2f}s = {m['perf/llamacpp_tok_s']:.1f} tok/s"
    )
    print(
        f"response cache (llama.cpp): generation {t_gen:.3f}s, replay {t_replay * 1e3:.2f}ms "
        f"-> replay is {m['perf/cache_replay_speedup']:.0f}x faster ({cached.hits} hits / {cached.misses} misses)"
    )
    return m


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--seed", type=int, default=0, help="prompt generation and torch seed")
    ap.add_argument("--n-requests", type=int, default=16, help="requests (= transformers batch size)")
    ap.add_argument("--max-tokens", type=int, default=64, help="new tokens per request at most")
    ap.add_argument("--rounds", type=int, default=2, help="interleaved batched/single rounds (transformers)")
    ap.add_argument("--no-transformers", action="store_true", help="skip the transformers figures (~30 s load)")
    args = ap.parse_args(argv)
    run(args.seed, args.n_requests, args.max_tokens, transformers=not args.no_transformers, rounds=args.rounds)


if __name__ == "__main__":
    main()
