"""The child process of the llama.cpp probe (:mod:`orchestra.backends.llamacpp_probe` runs
``python -m orchestra.backends.llamacpp_probe_child MODEL``): report the library's build, then decode two short prompts
on one batched context through the backend's own path (:class:`~orchestra.backends.llamacpp.LlamaCppBackend`).

A module of its own because it stands above the backend it exercises, while the backend stands above the probe (it
calls :func:`~orchestra.backends.llamacpp_probe.require` before its first load). The lines it prints
(``INFO_LINE``, ``OK_LINE``) are what the parent reads; ``SIMULATE_ENV`` makes it die on purpose.
"""

from __future__ import annotations

import ctypes
import os
import sys
import time

from orchestra.backends.base import ChatMessage, GenerationParams, GenerationRequest
from orchestra.backends.llamacpp import LlamaCppBackend
from orchestra.backends.llamacpp_probe import INFO_LINE, OK_LINE, SIMULATE_ENV


def probe(model: str) -> None:
    """The probe itself: report the library's build, then decode two short prompts on one batched context."""
    import llama_cpp

    print(INFO_LINE + llama_cpp.llama_print_system_info().decode("utf-8", errors="replace"), flush=True)
    simulate = os.environ.get(SIMULATE_ENV, "")
    if simulate == "segfault":
        ctypes.string_at(0)  # a real SIGSEGV: a read of address 0
    elif simulate == "abort":
        os.abort()
    elif simulate == "hang":
        time.sleep(10**6)
    elif simulate == "error":
        raise RuntimeError("simulated probe error")
    backend = LlamaCppBackend(model, n_ctx=256, batch_size=2, prefix_cache=2)
    params = GenerationParams(max_tokens=8, temperature=0.0)
    prompts = ("What is 2 + 3? Answer with a number.", "Name a colour.")
    requests = [GenerationRequest((ChatMessage("user", p),), params) for p in prompts]
    outs = backend.generate(requests)
    print(f"{OK_LINE}{sum(len(o.token_ids) for o in outs)} tokens", flush=True)


if __name__ == "__main__":
    probe(sys.argv[1])
