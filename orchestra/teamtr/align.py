"""Stage-0 alignment: replace one worker's model by a newcomer without a "swap shock" (docs/architecture.md §5; docs/algorithms.md §2.5).

Replacing agent j's policy π_inc (the incumbent) by a new model π_θ shifts every later agent's context distribution,
so the team's success can collapse although each model is fine on its own. Stage 0 first pulls the newcomer onto the
incumbent on the contexts that agent j actually meets in the CURRENT team (docs/algorithms.md §2.5):

    min_θ  D^tok(π_θ ‖ π_inc) = E_{(h, t) ∈ P} KL(π_θ(·|h, y_<t) ‖ π_inc(·|h, y_<t))          (exact over the vocabulary)

where the probe set P holds the contexts at agent j's turns harvested from the team's sampled rollouts (occupancy as
sampled: a frequent context appears often). Training stops once D^tok on HELD-OUT probes is ≤ δ_0 (or after
``max_steps``; the report says which). Reverse KL (newcomer first) is the direction of the TeamTR trust region on
the newcomer's own samples and is mode-seeking: the newcomer may end sharper than the incumbent, never spread mass
where the incumbent has none. [The paper's probe construction and stopping rule are not public, docs/algorithms.md §7: inferred.]

Layers, as in the trainer: the pure loss :func:`reverse_kl_loss`; the generic loop :func:`align` over two small
Protocols (:class:`ProbeBatch`, :class:`AlignPolicy`) — probes are harvested BEFORE the loop (rollout apart from
learning); :func:`swap_shock` measures team success before the swap, after a direct swap and after the aligned swap;
:func:`check_tokenizer_family` refuses a newcomer of another tokenizer family. The telephone chain implementation
lives in :mod:`orchestra.teamtr.align_chain` (exact J from policy matrices); an LLM team plugs in by providing its own
probes and policies.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol, Self, TypeVar

import numpy as np
import torch
from torch import Tensor

from orchestra.teamtr.config import seeded_generator
from orchestra.teamtr.losses import kl_exact_per_token, masked_mean
from orchestra.teamtr.protocols import Metrics
from trajectories.rundir import MetricsWriter

Stop = Literal["delta_0", "max_steps"]
Divergence = Literal["reverse", "forward", "sft"]
DIVERGENCES: tuple[Divergence, ...] = ("reverse", "forward", "sft")


class AlignError(ValueError):
    """A newcomer cannot be aligned to an incumbent (tokenizer family, agent index, no parameters…); the message
    names both models and what differs."""


# ----------------------------------------------------------------------------------------------------------------
# the loss


def reverse_kl_loss(new_logits: Tensor, inc_logits: Tensor, mask: Tensor) -> tuple[Tensor, Metrics]:
    """Masked token-mean of the exact reverse KL of the newcomer to the incumbent (docs/algorithms.md §2.5, §2.3):

        ℓ_u = KL(π_new(·|s_u) ‖ π_inc(·|s_u)) = Σ_v π_new(v|s_u) (log π_new(v|s_u) − log π_inc(v|s_u))
        L   = Σ_u m_u ℓ_u / Σ_u m_u

    over the full vocabulary at every probe position u (GKD-style on-policy distillation, Agarwal et al. 2024,
    arXiv:2306.13649, with the reverse divergence). ``losses.kl_exact_per_token(p, q)`` is KL(q‖p), so the newcomer
    goes in the q slot. ``inc_logits`` is a constant (detached); gradients reach ``new_logits`` only.

    Args:
        new_logits: (N, T, V) newcomer logits at the probe positions, with grad.
        inc_logits: (N, T, V) incumbent logits at the same positions.
        mask: (N, T) positions to average over (the worker's own positions); 0 loss if empty.

    Metrics: ``losses/reverse_kl`` (= L), ``kl/reverse_max`` (largest ℓ_u), ``kl/forward`` (masked mean of
    KL(π_inc‖π_new), for diagnosis), ``losses/num_tokens``.
    """
    if new_logits.shape != inc_logits.shape or new_logits.shape[:-1] != mask.shape:
        raise ValueError(
            f"newcomer logits {tuple(new_logits.shape)}, incumbent logits {tuple(inc_logits.shape)} and mask "
            f"{tuple(mask.shape)} do not fit (N, T, V) / (N, T): one vocabulary is needed (check_tokenizer_family)"
        )
    inc = inc_logits.detach()
    per_token = kl_exact_per_token(inc, new_logits)  # (N, T) KL(π_new ‖ π_inc)
    loss = masked_mean(per_token, mask)
    with torch.no_grad():
        keep = mask.bool()
        n_tok = int(keep.sum())
        metrics: Metrics = {
            "losses/reverse_kl": float(loss.detach()),
            "kl/reverse_max": float(per_token.detach()[keep].max()) if n_tok else 0.0,
            "kl/forward": float(masked_mean(kl_exact_per_token(new_logits.detach(), inc), keep)),
            "losses/num_tokens": float(n_tok),
        }
    return loss, metrics


def forward_kl_loss(new_logits: Tensor, inc_logits: Tensor, mask: Tensor) -> Tensor:
    """Masked token-mean of the exact FORWARD KL(π_inc ‖ π_new) (soft-label distillation: the incumbent's cross-
    entropy minus its constant entropy), the mass-covering baseline of Stage 0. Gradients reach ``new_logits``."""
    return masked_mean(kl_exact_per_token(new_logits, inc_logits.detach()), mask)


def sft_loss(new_logits: Tensor, labels: Tensor, mask: Tensor) -> Tensor:
    """Masked token-mean of −log π_new(label): supervised fine-tuning on tokens the incumbent sampled at the probe
    positions (hard labels, one per position), the usual way a newcomer is taught a team's conventions."""
    logp = torch.log_softmax(new_logits.float(), dim=-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)  # (N, T)
    return masked_mean(-logp, mask)


def alignment_loss(
    divergence: Divergence, new_logits: Tensor, inc_logits: Tensor, mask: Tensor, labels: Tensor | None = None
) -> Tensor:
    """The training loss of Stage 0 by ``divergence``: :func:`reverse_kl_loss` (default), :func:`forward_kl_loss` or
    :func:`sft_loss` (``labels`` (N, T): incumbent samples at the probe positions)."""
    if divergence == "forward":
        return forward_kl_loss(new_logits, inc_logits, mask)
    if divergence == "sft":
        if labels is None:
            raise ValueError("divergence 'sft' needs the incumbent's sampled labels")
        return sft_loss(new_logits, labels, mask)
    return reverse_kl_loss(new_logits, inc_logits, mask)[0]


def sample_labels(inc_logits: Tensor, generator: torch.Generator) -> Tensor:
    """(N, T) one token per probe position drawn from the incumbent's distribution (temperature 1)."""
    probs = torch.softmax(inc_logits.float(), dim=-1)
    flat = probs.reshape(-1, probs.shape[-1])
    return torch.multinomial(flat, 1, generator=generator).reshape(probs.shape[:-1])


# ----------------------------------------------------------------------------------------------------------------
# config and protocols


@dataclass(frozen=True)
class AlignConfig:
    """Every knob of a Stage-0 alignment (starting values: docs/algorithms.md §2.6 δ ∈ {0.005, 0.01, 0.02}; lr as the chain's
    warm start)."""

    delta_0: float = 0.01  # stop once the held-out per-token reverse KL D^tok(π_new‖π_inc) ≤ δ_0
    lr: float = 1e-2  # Adam learning rate of the newcomer's trainable parameters
    max_steps: int = 1000  # Adam steps at most (the report then says "max_steps")
    batch_size: int = 256  # probe contexts per Adam step (≥ the train probes: full batch)
    num_train_probes: int = 1024  # rollouts harvested for training probes (one context per worker turn)
    num_heldout_probes: int = 1024  # independent rollouts harvested for the held-out stopping test
    check_every: int = 10  # Adam steps between two KL checks (metrics rows; the stop test runs at checks)
    max_grad_norm: float | None = None  # gradient-norm clip of the newcomer's parameters; None = off
    eval_batch_size: int = 1024  # probe contexts per no-grad forward when measuring KL
    cache_incumbent: bool = True  # precompute incumbent logits once (False: recompute per use, for large T×V)
    seed: int = 0  # probe harvesting and minibatch shuffles
    divergence: Divergence = (
        "reverse"  # what training minimises: reverse KL (Stage 0), forward KL or SFT on incumbent samples (baselines)
    )

    def __post_init__(self) -> None:
        if self.divergence not in DIVERGENCES:
            raise ValueError(f"divergence must be one of {DIVERGENCES}, got {self.divergence!r}")
        if self.divergence == "sft" and not self.cache_incumbent:
            raise ValueError("divergence 'sft' draws its labels from the cached incumbent logits: cache_incumbent")
        if not self.delta_0 > 0:
            raise ValueError(f"delta_0 must be > 0, got {self.delta_0}")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if self.max_steps < 0 or self.check_every < 1:
            raise ValueError(f"need max_steps ≥ 0 and check_every ≥ 1, got {self.max_steps}, {self.check_every}")
        if min(self.batch_size, self.num_train_probes, self.num_heldout_probes, self.eval_batch_size) < 1:
            raise ValueError("batch_size, num_train_probes, num_heldout_probes and eval_batch_size must be ≥ 1")


class ProbeBatch(Protocol):
    """N probe contexts of one worker; ``mask`` (N, T) marks the positions whose next-token distributions are
    compared (for an LLM: the worker's own tokens of a harvested turn; the chain: T = 1, all ones)."""

    @property
    def mask(self) -> Tensor: ...  # (N, T) bool

    @property
    def size(self) -> int: ...  # N

    def select(self, rows: Tensor) -> Self: ...  # the probes ``rows``, same layout


ProbeT = TypeVar("ProbeT", bound=ProbeBatch)
ProbeT_contra = TypeVar("ProbeT_contra", bound=ProbeBatch, contravariant=True)


class AlignPolicy(Protocol[ProbeT_contra]):
    """A worker's policy on probes: the newcomer (trained) or the incumbent (read only)."""

    def logits(self, probes: ProbeT_contra) -> Tensor:
        """(N, T, V) next-token logits at the probe positions, with grad (V = the shared tokenizer's vocabulary)."""
        ...

    def parameters(self) -> list[torch.nn.Parameter]:
        """What alignment trains (a fresh adapter, or the whole model); never the incumbent's."""
        ...


# ----------------------------------------------------------------------------------------------------------------
# the loop


@dataclass(frozen=True)
class AlignReport:
    """Outcome of :func:`align`: why it stopped, steps, held-out KL before/after and one row per check."""

    stopped: Stop  # "delta_0": held-out KL ≤ δ_0 reached; "max_steps": budget spent first
    steps: int  # Adam steps taken
    kl_heldout_before: float  # held-out D^tok(π_new‖π_inc) before the first step
    kl_heldout_after: float  # … at the last check (≤ δ_0 iff stopped == "delta_0")
    kl_train_after: float  # train-probe D^tok at the last check
    delta_0: float  # the threshold used
    seconds: float  # wall time of the loop
    history: tuple[Metrics, ...] = ()  # per check: align/step, kl/train, kl/heldout, kl/heldout_forward, perf/…


def _chunks(n: int, size: int) -> list[Tensor]:
    return [torch.arange(s, min(s + size, n)) for s in range(0, n, size)]


def _logits_nograd(policy: AlignPolicy[ProbeT], probes: ProbeT, chunk: int) -> Tensor:
    with torch.no_grad():
        return torch.cat([policy.logits(probes.select(rows)).detach() for rows in _chunks(probes.size, chunk)])


def probe_kl(
    newcomer: AlignPolicy[ProbeT],
    incumbent: AlignPolicy[ProbeT],
    probes: ProbeT,
    *,
    inc_logits: Tensor | None = None,
    chunk: int = 1024,
) -> tuple[float, float]:
    """(reverse, forward) per-token KL between newcomer and incumbent on ``probes`` (token-mean, no grad).

    ``inc_logits`` (N, T, V): cached incumbent logits of these probes (recomputed chunk by chunk if None).
    """
    rev = fwd = tokens = 0.0
    with torch.no_grad():
        for rows in _chunks(probes.size, chunk):
            mb = probes.select(rows)
            inc = incumbent.logits(mb) if inc_logits is None else inc_logits[rows]
            _, m = reverse_kl_loss(newcomer.logits(mb), inc, mb.mask)
            rev += m["losses/reverse_kl"] * m["losses/num_tokens"]
            fwd += m["kl/forward"] * m["losses/num_tokens"]
            tokens += m["losses/num_tokens"]
    return rev / max(tokens, 1.0), fwd / max(tokens, 1.0)


def align(
    newcomer: AlignPolicy[ProbeT],
    incumbent: AlignPolicy[ProbeT],
    train_probes: ProbeT,
    heldout_probes: ProbeT,
    cfg: AlignConfig,
    *,
    on_check: Callable[[Metrics], None] | None = None,
) -> AlignReport:
    """Minimise :func:`reverse_kl_loss` (or the ``cfg.divergence`` baseline, :func:`alignment_loss`) of ``newcomer``
    to ``incumbent`` on ``train_probes`` with Adam until the held-out reverse D^tok ≤ ``cfg.delta_0`` — the same
    stopping test whatever is trained — (tested before the first step and every ``check_every`` steps) or
    ``cfg.max_steps`` (docs/algorithms.md §2.5). Only ``newcomer.parameters()`` move. Minibatches: a fresh permutation of the
    train probes per pass, from a generator seeded by ``cfg.seed`` (deterministic on CPU). ``on_check`` receives
    every metrics row (progress output).
    """
    t0 = time.perf_counter()
    params = list(newcomer.parameters())
    if not params:
        raise AlignError("the newcomer has no trainable parameters")
    if train_probes.size == 0 or heldout_probes.size == 0:
        raise AlignError("need at least one train and one held-out probe")
    for p in params:
        p.requires_grad_(True)
    opt = torch.optim.Adam(params, lr=cfg.lr)
    shuffle = seeded_generator(cfg.seed, 2)
    chunk = cfg.eval_batch_size
    inc_train = _logits_nograd(incumbent, train_probes, chunk) if cfg.cache_incumbent else None  # (N, T, V)
    inc_held = _logits_nograd(incumbent, heldout_probes, chunk) if cfg.cache_incumbent else None  # (N, T, V)
    labels = (
        sample_labels(inc_train, seeded_generator(cfg.seed, 3))
        if cfg.divergence == "sft" and inc_train is not None
        else None
    )  # (N, T) incumbent samples at the train probes
    history: list[Metrics] = []
    losses: list[float] = []

    def check(step: int) -> float:
        kl_train, _ = probe_kl(newcomer, incumbent, train_probes, inc_logits=inc_train, chunk=chunk)
        kl_held, kl_held_fwd = probe_kl(newcomer, incumbent, heldout_probes, inc_logits=inc_held, chunk=chunk)
        row: Metrics = {
            "align/step": float(step),
            "kl/train": kl_train,
            "kl/heldout": kl_held,
            "kl/heldout_forward": kl_held_fwd,
            # the trained loss (cfg.divergence), minibatch mean since the last check
            "losses/train": float(np.mean(losses)) if losses else math.nan,
            "align/delta_0": cfg.delta_0,
            "perf/wall_seconds": time.perf_counter() - t0,
        }
        losses.clear()
        history.append(row)
        if on_check is not None:
            on_check(row)
        return kl_held

    n_train, mb_size = train_probes.size, min(cfg.batch_size, train_probes.size)
    order, cursor = torch.arange(n_train), n_train
    step = 0
    kl_held = check(step)
    while kl_held > cfg.delta_0 and step < cfg.max_steps:
        for _ in range(min(cfg.check_every, cfg.max_steps - step)):
            if cursor + mb_size > n_train:  # a new pass over the train probes
                order = torch.randperm(n_train, generator=shuffle) if mb_size < n_train else order
                cursor = 0
            rows = order[cursor : cursor + mb_size]
            cursor += mb_size
            mb = train_probes.select(rows)
            inc = incumbent_logits_of(incumbent, mb) if inc_train is None else inc_train[rows]
            loss = alignment_loss(
                cfg.divergence, newcomer.logits(mb), inc, mb.mask, None if labels is None else labels[rows]
            )
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if cfg.max_grad_norm is not None:
                torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
            opt.step()
            losses.append(float(loss.detach()))
            step += 1
        kl_held = check(step)
    opt.zero_grad(set_to_none=True)  # leave no stale gradients for the caller
    return AlignReport(
        stopped="delta_0" if kl_held <= cfg.delta_0 else "max_steps",
        steps=step,
        kl_heldout_before=history[0]["kl/heldout"],
        kl_heldout_after=kl_held,
        kl_train_after=history[-1]["kl/train"],
        delta_0=cfg.delta_0,
        seconds=time.perf_counter() - t0,
        history=tuple(history),
    )


def incumbent_logits_of(incumbent: AlignPolicy[ProbeT], probes: ProbeT) -> Tensor:
    """(N, T, V) incumbent logits as a constant (no grad)."""
    with torch.no_grad():
        return incumbent.logits(probes).detach()


# ----------------------------------------------------------------------------------------------------------------
# swap shock


def recovered_fraction(j_before: float, j_direct: float, j_aligned: float) -> float:
    """(J_aligned − J_direct) / (J_before − J_direct): the share of the direct swap's drop that alignment recovers
    (1 = none left, > 1 = the aligned team beats the original). NaN when the direct swap does not drop J."""
    drop = j_before - j_direct
    return (j_aligned - j_direct) / drop if drop > 0 else math.nan


@dataclass(frozen=True)
class SwapShockReport:
    """Team success before the swap, after a direct swap and after an aligned swap, with the alignment itself."""

    j_before: float  # the team with the incumbent
    j_direct: float  # the newcomer plugged in unaligned
    j_aligned: float  # the newcomer after :func:`align`
    recovered_fraction: float  # :func:`recovered_fraction` (NaN if the direct swap did not drop J)
    align: AlignReport  # the alignment run (stop reason, steps, KL history)
    diagnostics_before: Metrics = field(default_factory=dict)  # extra newcomer metrics before alignment
    diagnostics_after: Metrics = field(default_factory=dict)  # … after
    meta: dict[str, Any] = field(default_factory=dict)  # what was swapped (team, agent, models) for the report

    @property
    def swap_shock(self) -> float:
        """J_before − J_direct: the drop of the direct swap."""
        return self.j_before - self.j_direct

    def to_json(self) -> dict[str, Any]:
        """Plain JSON types (NaN → null), as written to ``report.json``."""
        out = dataclasses.asdict(self)
        out["swap_shock"] = self.swap_shock
        out["align"]["history"] = list(self.align.history)
        return _no_nan(out)


def _no_nan(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {str(k): _no_nan(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_no_nan(v) for v in value]
    return value


def swap_shock(
    incumbent: AlignPolicy[ProbeT],
    newcomer: AlignPolicy[ProbeT],
    train_probes: ProbeT,
    heldout_probes: ProbeT,
    cfg: AlignConfig,
    *,
    success: Callable[[AlignPolicy[ProbeT]], float],
    diagnostics: Callable[[AlignPolicy[ProbeT]], Metrics] | None = None,
    on_check: Callable[[Metrics], None] | None = None,
    meta: dict[str, Any] | None = None,
    incumbent_state: Callable[[], Mapping[str, Tensor]] | None = None,
) -> SwapShockReport:
    """J before the swap (``success(incumbent)``), after a direct swap (``success(newcomer)`` as given), then
    :func:`align` and J after the aligned swap. ``success(policy)`` = the team's success with ``policy`` in the
    worker's slot and every other agent unchanged (chain: exact; an LLM team: held-out rollouts).
    ``diagnostics(newcomer)`` adds metrics before and after alignment. The newcomer is modified in place; the
    incumbent team must not be: ``incumbent_state()`` (its trainable tensors by name) is read before and after, and
    any change is a RuntimeError."""
    before = {k: v.detach().clone() for k, v in incumbent_state().items()} if incumbent_state is not None else {}
    j_before = success(incumbent)
    j_direct = success(newcomer)
    diag_before = diagnostics(newcomer) if diagnostics is not None else {}
    report = align(newcomer, incumbent, train_probes, heldout_probes, cfg, on_check=on_check)
    j_aligned = success(newcomer)
    diag_after = diagnostics(newcomer) if diagnostics is not None else {}
    if incumbent_state is not None:
        after = incumbent_state()
        moved = sorted(k for k, v in before.items() if not torch.equal(after[k], v))
        if moved:
            raise RuntimeError(f"alignment moved the incumbent team's parameters: {moved[:3]} ({len(moved)} tensors)")
    return SwapShockReport(
        j_before=j_before,
        j_direct=j_direct,
        j_aligned=j_aligned,
        recovered_fraction=recovered_fraction(j_before, j_direct, j_aligned),
        align=report,
        diagnostics_before=diag_before,
        diagnostics_after=diag_after,
        meta=dict(meta or {}),
    )


# ----------------------------------------------------------------------------------------------------------------
# tokenizer family


def _name(tok: Any, given: str | None, role: str) -> str:
    if given:
        return given
    path = getattr(tok, "name_or_path", None)
    return f"{role} {path!r}" if path else role


def _special(tok: Any) -> dict[str, tuple[str | None, int | None]]:
    out = {}
    for attr in ("bos_token", "eos_token", "pad_token", "unk_token"):
        token = getattr(tok, attr, None)
        out[attr] = (None if token is None else str(token), getattr(tok, f"{attr}_id", None))
    return out


def check_tokenizer_family(
    incumbent: Any,
    newcomer: Any,
    *,
    incumbent_name: str | None = None,
    newcomer_name: str | None = None,
    sample: int = 5,
) -> None:
    """Raise :class:`AlignError` unless both tokenizers map the same tokens to the same ids (the per-token KL is a
    sum over ONE vocabulary). A tokenizer is a transformers tokenizer (``get_vocab()``, special-token attributes) or
    an int vocabulary size (the telephone chain: V symbols, token id = symbol). Compares vocabulary size, the
    bos/eos/pad/unk tokens and their ids, and token → id maps (a sample of mismatches is named). Names default to
    the tokenizers' ``name_or_path``. Models of one family may pad their embedding past the tokenizer (e.g. Qwen2.5
    sizes): compare logits over the tokenizer's ids only.
    """
    inc_name, new_name = _name(incumbent, incumbent_name, "incumbent"), _name(newcomer, newcomer_name, "newcomer")
    head = f"cannot align newcomer {new_name} to incumbent {inc_name}: not one tokenizer family"
    if isinstance(incumbent, int) or isinstance(newcomer, int):
        sizes = [t if isinstance(t, int) else len(t.get_vocab()) for t in (incumbent, newcomer)]
        if sizes[0] != sizes[1]:
            raise AlignError(f"{head}: vocabulary sizes differ (V = {sizes[0]} vs V = {sizes[1]})")
        return
    vocab_inc, vocab_new = incumbent.get_vocab(), newcomer.get_vocab()
    problems: list[str] = []
    if len(vocab_inc) != len(vocab_new):
        problems.append(f"vocabulary sizes differ ({len(vocab_inc)} vs {len(vocab_new)})")
    spec_inc, spec_new = _special(incumbent), _special(newcomer)
    for attr in spec_inc:
        if spec_inc[attr] != spec_new[attr]:
            problems.append(f"{attr} differs ({spec_inc[attr]} vs {spec_new[attr]})")
    diff = sorted(
        (t for t in vocab_inc.keys() | vocab_new.keys() if vocab_inc.get(t) != vocab_new.get(t)),
        key=lambda t: (min(vocab_inc.get(t, 1 << 62), vocab_new.get(t, 1 << 62)), t),
    )
    if diff:
        shown = ", ".join(f"{t!r}: {vocab_inc.get(t)} vs {vocab_new.get(t)}" for t in diff[:sample])
        problems.append(f"{len(diff)} tokens map to different ids (token: incumbent id vs newcomer id; e.g. {shown})")
    if problems:
        raise AlignError(f"{head}: " + "; ".join(problems))


# ----------------------------------------------------------------------------------------------------------------
# report files


def _f(x: float, digits: int = 3) -> str:
    return "n/a" if not math.isfinite(x) else f"{x:.{digits}f}"


def report_markdown(report: SwapShockReport) -> str:
    """The swap-shock table (markdown) with the alignment's stop reason, steps and time."""
    a, m = report.align, report.meta
    what = ", ".join(f"{k} {_f(v) if isinstance(v, float) else v}" for k, v in m.items())
    rows = [
        "# Stage-0 alignment: swap shock",
        "",
        f"Swapped: {what}." if what else "",
        "",
        "| team | success J | held-out KL(new ‖ inc) per token |",
        "|---|---|---|",
        f"| before the swap (incumbent) | {_f(report.j_before)} | 0 |",
        f"| direct swap (newcomer, unaligned) | {_f(report.j_direct)} | {_f(a.kl_heldout_before, 4)} |",
        f"| aligned swap | {_f(report.j_aligned)} | {_f(a.kl_heldout_after, 4)} |",
        "",
        f"* swap shock (J before − J direct): {_f(report.swap_shock)}",
        f"* recovered fraction (J aligned − J direct) / (J before − J direct): {_f(report.recovered_fraction)}"
        + (" (the direct swap did not drop J)" if not math.isfinite(report.recovered_fraction) else ""),
        f"* alignment stopped by {a.stopped} after {a.steps} Adam steps (δ_0 = {a.delta_0:g}), {a.seconds:.1f} s;"
        f" final train-probe KL {_f(a.kl_train_after, 4)}",
    ]
    for key in sorted(report.diagnostics_before.keys() & report.diagnostics_after.keys()):
        before, after = report.diagnostics_before[key], report.diagnostics_after[key]
        rows.append(f"* {key}: {_f(before, 4)} before alignment → {_f(after, 4)} after")
    return "\n".join(rows) + "\n"


def plot_kl_curve(report: AlignReport, path: Path) -> None:
    """Held-out and train per-token reverse KL vs Adam step (log scale) with the δ_0 line → PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r["align/step"] for r in report.history]
    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.plot(steps, [max(r["kl/heldout"], 1e-8) for r in report.history], marker=".", label="held-out")
    ax.plot(steps, [max(r["kl/train"], 1e-8) for r in report.history], ls="--", label="train")
    ax.axhline(report.delta_0, color="k", lw=0.8, ls=":", label="δ_0")
    ax.set(xlabel="Adam step", ylabel="KL(π_new ‖ π_inc) per token", yscale="log", title="Stage-0 alignment")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(report: SwapShockReport, out_dir: str | Path, *, plot: bool = True) -> dict[str, Path]:
    """``report.json``, ``report.md``, ``metrics.jsonl`` / ``metrics.csv`` (one row per KL check) and, if ``plot``,
    ``kl_curve.png`` into ``out_dir``; returns the paths by name."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"report": out / "report.json", "markdown": out / "report.md", "metrics": out / "metrics.csv"}
    paths["report"].write_text(json.dumps(report.to_json(), indent=2) + "\n", encoding="utf-8")
    paths["markdown"].write_text(report_markdown(report), encoding="utf-8")
    MetricsWriter(out, "metrics", report.align.history)
    if plot:
        paths["plot"] = out / "kl_curve.png"
        plot_kl_curve(report.align, paths["plot"])
    return paths


__all__ = [
    "AlignConfig",
    "AlignError",
    "AlignPolicy",
    "AlignReport",
    "ProbeBatch",
    "SwapShockReport",
    "align",
    "check_tokenizer_family",
    "incumbent_logits_of",
    "plot_kl_curve",
    "probe_kl",
    "recovered_fraction",
    "report_markdown",
    "reverse_kl_loss",
    "swap_shock",
    "write_report",
]
