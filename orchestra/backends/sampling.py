"""Token choice and stop handling shared by the local backends, written once so they agree.

The rule (both the llama.cpp and the transformers backends follow it, per row):

- greedy (``temperature == 0``): ``token = argmax(z)`` and its log-prob is ``log_softmax(z)[token]``
  under the *raw* logits ``z`` — the model's own distribution, which is what a later KL or
  importance ratio against this policy needs;
- sampling: ``p = softmax(z / T)``; with ``top_p < 1`` the smallest set of most likely tokens whose
  mass reaches ``top_p`` is kept and renormalised (Holtzman et al. 2020, "The Curious Case of Neural
  Text Degeneration", §3.1); ``token ~ p`` and its log-prob is ``log p[token]`` — the log-prob under
  the distribution actually sampled from, i.e. the behaviour policy (with ``top_p == 1`` this is
  exactly ``log_softmax(z / T)``).

The sampled ids are returned exactly as drawn; text is decoded from them, never the other way round.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from orchestra.backends.base import GenerationParams


def first_stop(text: str, stops: Sequence[str]) -> int | None:
    """Index in ``text`` where the earliest stop string begins, or None (empty stops are ignored)."""
    best: int | None = None
    for s in stops:
        if s:
            i = text.find(s)
            if i >= 0 and (best is None or i < best):
                best = i
    return best


def log_softmax_np(z: npt.NDArray[np.floating]) -> npt.NDArray[np.float64]:
    z64 = z.astype(np.float64)
    m = z64.max()
    return z64 - (m + np.log(np.exp(z64 - m).sum()))


def choose_token_np(
    logits: npt.NDArray[np.floating], params: GenerationParams, rng: np.random.Generator
) -> tuple[int, float]:
    """Pick the next token from one row of logits (shape ``[vocab]``); return ``(token, logprob)``."""
    if params.temperature <= 0.0:
        token = int(np.argmax(logits))
        return token, float(log_softmax_np(logits)[token])
    logp = log_softmax_np(logits / params.temperature)
    if params.top_p < 1.0:
        order = np.argsort(-logp, kind="stable")
        probs = np.exp(logp[order])
        # keep tokens whose preceding mass is < top_p: always at least the most likely one
        keep = order[(np.cumsum(probs) - probs) < params.top_p]
        kept = np.full_like(logp, -np.inf)
        kept[keep] = logp[keep]
        logp = kept - np.log(np.exp(logp[keep]).sum())
    probs = np.exp(logp)
    token = int(rng.choice(len(probs), p=probs / probs.sum()))
    return token, float(logp[token])
