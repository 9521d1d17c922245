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
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from orchestra.backends.base import GenerationParams

if TYPE_CHECKING:  # torch is imported where the batched rule runs, so the llama.cpp path does not load it
    import torch


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


def uniforms(seed: Sequence[int], count: int) -> npt.NDArray[np.float64]:
    """The uniforms a sampled row consumes, one per token, in order: ``numpy.random.default_rng(seed).random(count)``.

    :func:`choose_token_np` draws its token by ``rng.choice(V, p=p)``, which is inverse-CDF sampling with ONE
    ``rng.random()`` per call (``cdf = cumsum(p); cdf /= cdf[-1]; token = searchsorted(cdf, u, side="right")``), so
    drawing a row's uniforms up front and sampling on the device (:func:`choose_tokens_torch`) consumes the same
    stream: a request's seed gives the same tokens either way (up to float64 summation order at a CDF boundary)."""
    return np.random.default_rng(list(seed)).random(count)


def choose_tokens_torch(
    logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor | None, u: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The rule above for a batch of rows, on the logits' device: ``(tokens [b], logprobs [b] float64)``.

    ``logits`` [b, V] float32; ``temperature`` [b] (0 = greedy); ``top_p`` [b] float64 or None (all 1); ``u`` [b]
    float64 uniforms (ignored by greedy rows). No host round trip: the caller reads the tokens when it needs them."""
    import torch

    greedy_tok = logits.argmax(-1)
    greedy_lp = torch.log_softmax(logits, -1).gather(-1, greedy_tok[:, None])[:, 0].double()
    sampled = temperature > 0
    z = logits / torch.where(sampled, temperature, torch.ones_like(temperature))[:, None]  # float32, as numpy did
    logp = torch.log_softmax(z.double(), -1)
    if top_p is not None:  # nucleus: keep the most likely tokens whose preceding mass is < top_p, renormalise
        sorted_logp, order = torch.sort(logp, dim=-1, descending=True, stable=True)
        probs = sorted_logp.exp()
        keep_sorted = (probs.cumsum(-1) - probs) < top_p[:, None]
        keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
        kept = logp.masked_fill(~keep, -torch.inf)
        logp = kept - torch.logsumexp(kept, -1, keepdim=True)
    probs = logp.exp()
    cdf = (probs / probs.sum(-1, keepdim=True)).cumsum(-1)
    cdf = cdf / cdf[:, -1:]
    tok = torch.searchsorted(cdf, u[:, None].to(cdf.dtype).contiguous(), right=True)[:, 0].clamp_(
        max=logits.shape[-1] - 1
    )
    lp = logp.gather(-1, tok[:, None])[:, 0]
    return torch.where(sampled, tok, greedy_tok), torch.where(sampled, lp, greedy_lp)


def stop_candidates(pieces: Sequence[str], stops: Sequence[str], *, exact_pieces: bool) -> npt.NDArray[np.bool_]:
    """Per vocabulary id: can appending this token make one of ``stops`` appear in the decoded text? ``pieces[v]`` is
    token v decoded alone.

    A stop string first appears when the token holding its last character is appended, so only tokens whose piece
    holds the last character of some stop string (or holds U+FFFD: part of a multi-byte character, completed by a
    later token) need the text decoded and searched; every other step skips the check. ``exact_pieces``: a piece
    shows every character its token adds in context (byte-level BPE: yes). A decoder that drops a token's leading
    space when it is decoded alone (SentencePiece's ``▁``) hides whitespace: then a stop string ending in whitespace
    makes every token a candidate (the check runs at every step, as if there were no table)."""
    lasts = {s[-1] for s in stops if s}
    if not lasts:
        return np.zeros(len(pieces), dtype=bool)
    if not exact_pieces and any(c.isspace() for c in lasts):
        return np.ones(len(pieces), dtype=bool)
    lasts.add("\ufffd")
    return np.fromiter((any(c in piece for c in lasts) for piece in pieces), dtype=bool, count=len(pieces))
