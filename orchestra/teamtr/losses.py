"""TeamTR losses and estimators: pure functions on tensors, the math in plain sight (docs/architecture.md §5–§6).

Formulas and sources: ``docs/algorithms.md`` (§x.y: sections of docs/algorithms.md, cited so below).

Conventions:

* ``B`` = sequences (rollout samples), ``T`` = token positions, ``V`` = vocabulary, ``N`` = samples.
* ``mask`` (B, T) selects the tokens that carry the loss: the worker's OWN sampled tokens only (§4.5);
  prompt, other workers' tokens, tool outputs and padding are 0. Masked positions may hold any finite value.
* ``logprobs`` are log-probabilities of the sampled token ids under the policy being trained (with grad);
  ``old_logprobs`` under the policy that sampled them (or the frozen pre-update policy π_i^cur); both (B, T).
* Losses return ``(loss, metrics)``: a scalar tensor to minimise and a flat dict of floats with namespaced keys
  (``losses/…``, ``kl/…``). Estimators and advantage functions return tensors.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Literal

import torch
from torch import Tensor

Aggregation = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
AGGREGATIONS: tuple[Aggregation, ...] = (
    "token-mean",
    "seq-mean-token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-sum-norm",
)
Ids = Tensor | Sequence[Hashable]

# ----------------------------------------------------------------------------------------------------------------
# masking and loss aggregation


def masked_mean(values: Tensor, mask: Tensor) -> Tensor:
    """Mean of ``values`` over the positions where ``mask`` is set; 0 (not NaN) when the mask is empty.

    Masked-out positions are selected away with ``torch.where`` (not multiplied by 0), so their values never reach
    the result or its gradient.
    """
    keep = mask.bool()
    total = torch.where(keep, values, torch.zeros_like(values)).sum()
    return total / keep.sum().clamp(min=1)


def aggregate_loss(
    loss_mat: Tensor,
    mask: Tensor,
    mode: Aggregation = "token-mean",
    *,
    max_length: int | None = None,
    num_tokens: float | None = None,
) -> Tensor:
    """Reduce per-token losses (B, T) to a scalar (§4.2, verl ``core_algos.py::agg_loss``).

    With ℓ_{b,t} the per-token loss, m_{b,t} the mask and L_b = Σ_t m_{b,t}:

    * ``token-mean`` (DAPO): Σ_{b,t} m ℓ / Σ_{b,t} m — every loss token weighs the same, so a sequence of length
      L_b weighs L_b / Σ L.
    * ``seq-mean-token-mean`` (original GRPO): mean_b (Σ_t m ℓ / L_b) — every sequence weighs the same, so each of
      its tokens weighs 1 / (B'·L_b).
    * ``seq-mean-token-sum``: mean_b Σ_t m ℓ.
    * ``seq-mean-token-sum-norm`` (Dr. GRPO, arXiv:2503.20783): Σ_{b,t} m ℓ / (B · L_max) — a constant normaliser
      (TRL ``dr_grpo``; verl divides by L_max only, i.e. B times larger).

    The two ``seq-mean`` modes average over the B' sequences that hold at least one loss token (a worker with no
    tokens in a sample neither contributes nor dilutes); ``-norm`` keeps the constant B = ``loss_mat.shape[0]``.

    Args:
        loss_mat: per-token losses, (B, T).
        mask: loss tokens, (B, T), bool or {0, 1}.
        mode: one of :data:`AGGREGATIONS`.
        max_length: L_max of ``seq-mean-token-sum-norm`` (default T = ``loss_mat.shape[-1]``).
        num_tokens: ``token-mean`` divides by this instead of Σ m (the global loss-token count when a batch is
            split into micro-batches, TRL ``num_items_in_batch``).
    """
    keep = mask.bool()
    masked = torch.where(keep, loss_mat, torch.zeros_like(loss_mat))  # (B, T)
    if mode == "token-mean":
        denom = float(num_tokens) if num_tokens is not None else keep.sum().clamp(min=1)
        return masked.sum() / denom
    seq_sum = masked.sum(dim=-1)  # (B,)
    if mode == "seq-mean-token-sum-norm":
        length = max_length if max_length is not None else loss_mat.shape[-1]
        return seq_sum.sum() / (loss_mat.shape[0] * length)
    seq_len = keep.sum(dim=-1)  # (B,)
    has_tokens = seq_len > 0  # (B,)
    if mode == "seq-mean-token-mean":
        per_seq = seq_sum / seq_len.clamp(min=1)  # (B,)
    elif mode == "seq-mean-token-sum":
        per_seq = seq_sum
    else:
        raise ValueError(f"unknown aggregation {mode!r}; expected one of {AGGREGATIONS}")
    return per_seq.sum() / has_tokens.sum().clamp(min=1)  # empty sequences hold 0 in per_seq


# ----------------------------------------------------------------------------------------------------------------
# PPO-clip surrogate (+ HAPPO factor)


def sequence_logratio(
    logprobs: Tensor, old_logprobs: Tensor, mask: Tensor, *, reduce: Literal["sum", "mean"] = "sum"
) -> Tensor:
    """Per-sequence log importance ratio of one agent's own tokens, (B,), detached.

    ``sum``: Σ_u m_u (log π_new − log π_old)(y_u|s_u), the log-likelihood ratio of the agent's messages in the
    trajectory (HARL ``action_aggregation: prod``); ``mean``: the per-token average (HARL ``mean``, GSPO-like).
    Feeds :func:`happo_factor` (§3).
    """
    keep = mask.bool()
    diff = torch.where(keep, (logprobs - old_logprobs).detach(), torch.zeros_like(logprobs))  # (B, T)
    total = diff.sum(dim=-1)  # (B,)
    if reduce == "sum":
        return total
    return total / keep.sum(dim=-1).clamp(min=1)


def happo_factor(prev_agent_logratios: Tensor, *, max_log_factor: float | None = None) -> Tensor:
    """HAPPO's product of the earlier-updated agents' ratios, per sequence (§3; Kuba et al. 2022, HARL).

    M(τ) / Â(τ) = Π_{j updated before i} π_j^new(τ)/π_j^old(τ) = exp(Σ_j log-ratio_j(τ)), computed in log space
    and detached (it is a weight, not a path for gradients).

    Args:
        prev_agent_logratios: (B, J) — column j is :func:`sequence_logratio` of the j-th earlier agent. J = 0
            (the first agent of the order) gives the empty product, all ones.
        max_log_factor: if set, clip the log factor to [−c, c], i.e. M to [e^−c, e^c] (§3 "consider clipping
            M"; HARL does not clip). [inferred]

    Returns:
        (B,) positive factors; pass as ``happo_factor=`` to :func:`ppo_clip_loss`.
    """
    log_factor = prev_agent_logratios.detach().sum(dim=-1)  # (B,)
    if max_log_factor is not None:
        log_factor = log_factor.clamp(-max_log_factor, max_log_factor)
    return torch.exp(log_factor)


def ppo_clip_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    epsilon_low: float = 0.2,
    epsilon_high: float = 0.2,
    aggregation: Aggregation = "token-mean",
    happo_factor: Tensor | None = None,
    dual_clip_c: float | None = None,
    max_length: int | None = None,
    num_tokens: float | None = None,
    max_log_ratio: float = 20.0,
) -> tuple[Tensor, dict[str, float]]:
    """Token-level PPO-clip surrogate with asymmetric clipping (PPO, arXiv:1707.06347; DAPO Clip-Higher,
    arXiv:2503.14476; §2.2 step (4), §4.1–§4.2).

        r_u = exp(log π_θ(y_u|s_u) − log π_old(y_u|s_u))
        ℓ_u = −min(r_u Â_u, clip(r_u, 1 − ε_low, 1 + ε_high) Â_u)
        L   = aggregate(ℓ, mask)                                  (see :func:`aggregate_loss`)

    With a HAPPO factor M (§3): Â_u ← M_b · Â_u (HARL multiplies ``factor · min(surr1, surr2)``, identical
    for M > 0). Dual clip (Ye et al. 2020; verl ``clip_ratio_c``, default off here): for Â < 0,
    ℓ_u ← min(ℓ_u, −c Â_u), bounding the loss of a token whose ratio exploded.

    ``old_logprobs``, ``advantages`` and ``happo_factor`` are treated as constants (detached).

    Args:
        logprobs: (B, T) log π_θ of the sampled tokens, with grad.
        old_logprobs: (B, T) log π_old of the same tokens.
        advantages: (B,) one per sequence (broadcast over its tokens) or (B, T) per token.
        mask: (B, T) loss tokens (the worker's own sampled tokens).
        epsilon_low: lower clip, the ratio is clipped below at 1 − ε_low.
        epsilon_high: upper clip, the ratio is clipped above at 1 + ε_high (DAPO: 0.28).
        aggregation: loss aggregation mode, see :func:`aggregate_loss`.
        happo_factor: (B,) or (B, T) positive weights from :func:`happo_factor`; None = plain PPO.
        dual_clip_c: c > 1 of the dual clip for negative advantages; None = off.
        max_length: L_max for ``seq-mean-token-sum-norm``.
        num_tokens: global loss-token count for ``token-mean`` over micro-batches.
        max_log_ratio: |log r| is clamped to this before exp, against overflow (verl: 20).

    Metrics (over loss tokens): ``losses/policy_loss``, ``losses/clip_fraction`` (tokens whose gradient the clip
    zeroes), ``losses/clip_fraction_low`` (r < 1 − ε_low, Â < 0), ``losses/clip_fraction_high`` (r > 1 + ε_high,
    Â > 0), ``losses/dual_clip_fraction``, ``losses/ratio_mean|min|max``, ``losses/advantage_mean``,
    ``losses/surrogate_gain`` (mean (r − 1)·Â, §2.3), ``losses/num_tokens``, ``kl/approx_k1`` and
    ``kl/approx_k3`` (estimates of the per-token KL(π_old‖π_θ), §2.3), and ``losses/happo_factor_mean|max``
    when a factor is given.
    """
    if logprobs.shape != old_logprobs.shape or logprobs.shape != mask.shape:
        raise ValueError(f"logprobs {logprobs.shape}, old_logprobs {old_logprobs.shape}, mask {mask.shape} differ")
    adv = advantages.detach()
    if adv.dim() == 1:
        adv = adv.unsqueeze(-1)  # (B, 1), broadcast over T
    adv = adv.expand_as(logprobs)  # (B, T)
    if happo_factor is not None:
        factor = happo_factor.detach()
        if factor.dim() == 1:
            factor = factor.unsqueeze(-1)  # (B, 1)
        adv = adv * factor  # (B, T)

    log_ratio = (logprobs - old_logprobs.detach()).clamp(-max_log_ratio, max_log_ratio)  # (B, T)
    ratio = torch.exp(log_ratio)  # (B, T)
    surr_unclipped = ratio * adv  # (B, T)
    surr_clipped = ratio.clamp(1.0 - epsilon_low, 1.0 + epsilon_high) * adv  # (B, T)
    loss_mat = -torch.minimum(surr_unclipped, surr_clipped)  # (B, T)
    if dual_clip_c is not None:
        loss_mat = torch.where(adv < 0, torch.minimum(loss_mat, -dual_clip_c * adv), loss_mat)
    loss = aggregate_loss(loss_mat, mask, aggregation, max_length=max_length, num_tokens=num_tokens)

    with torch.no_grad():
        keep = mask.bool()
        n_tok = int(keep.sum())
        r = ratio.detach()
        high = (r > 1.0 + epsilon_high) & (adv > 0)
        low = (r < 1.0 - epsilon_low) & (adv < 0)
        metrics: dict[str, float] = {
            "losses/policy_loss": float(loss.detach()),
            "losses/clip_fraction": float(masked_mean((high | low).float(), keep)),
            "losses/clip_fraction_low": float(masked_mean(low.float(), keep)),
            "losses/clip_fraction_high": float(masked_mean(high.float(), keep)),
            "losses/ratio_mean": float(masked_mean(r, keep)) if n_tok else 1.0,
            "losses/ratio_min": float(r[keep].min()) if n_tok else 1.0,
            "losses/ratio_max": float(r[keep].max()) if n_tok else 1.0,
            "losses/advantage_mean": float(masked_mean(adv, keep)),
            "losses/surrogate_gain": float(masked_mean((r - 1.0) * adv, keep)),
            "losses/num_tokens": float(n_tok),
            "kl/approx_k1": float(masked_mean(kl_k1(log_ratio.detach(), torch.zeros_like(r)), keep)),
            "kl/approx_k3": float(masked_mean(kl_k3(log_ratio.detach(), torch.zeros_like(r)), keep)),
        }
        if dual_clip_c is not None:
            metrics["losses/dual_clip_fraction"] = float(masked_mean(((adv < 0) & (r > dual_clip_c)).float(), keep))
        if happo_factor is not None:
            f = happo_factor.detach().float()
            metrics["losses/happo_factor_mean"] = float(f.mean())
            metrics["losses/happo_factor_max"] = float(f.max()) if f.numel() else 1.0
    return loss, metrics


# ----------------------------------------------------------------------------------------------------------------
# advantages: GRPO / Dr. GRPO / DAPO and Dr. MAS


def _group_index(*keys: Ids, device: torch.device | None = None) -> tuple[Tensor, int]:
    """Map rows to contiguous group ids by the tuple of their keys: (N,) long tensor and the number of groups."""
    columns = [k.tolist() if isinstance(k, Tensor) else list(k) for k in keys]
    sizes = {len(c) for c in columns}
    if len(sizes) != 1:
        raise ValueError(f"id sequences have different lengths {sorted(sizes)}")
    index: dict[tuple[Hashable, ...], int] = {}
    rows = [index.setdefault(tuple(row), len(index)) for row in zip(*columns, strict=True)]
    return torch.tensor(rows, dtype=torch.long, device=device), len(index)


def _normalise_groups(
    values: Tensor,
    group: Tensor,
    num_groups: int,
    *,
    scale: bool,
    scale_level: Literal["group", "batch"],
    eps: float,
    singleton: Literal["raw", "zero"],
    max_abs: float | None,
) -> Tensor:
    """(values − group mean) / (std + eps) with the GRPO conventions documented in :func:`grpo_advantages`."""
    x = values.detach().to(torch.float64)  # (N,) float64 so that equal rewards stay exactly equal after centring
    count = torch.zeros(num_groups, dtype=x.dtype, device=x.device).index_add_(0, group, torch.ones_like(x))  # (G,)
    mean = torch.zeros_like(count).index_add_(0, group, x) / count  # (G,)
    centred = x - mean[group]  # (N,)
    if scale:
        if scale_level == "group":
            sq = torch.zeros_like(count).index_add_(0, group, centred**2)  # (G,)
            std = (sq / (count - 1).clamp(min=1)).sqrt()[group]  # (N,) unbiased, as torch.std
        else:
            std = x.std() if x.numel() > 1 else torch.ones((), dtype=x.dtype, device=x.device)
            std = std.expand_as(x)
        adv = centred / (std + eps)
    else:
        adv = centred
    lo = torch.full_like(count, float("inf")).scatter_reduce(0, group, x, "amin")  # (G,)
    hi = torch.full_like(count, float("-inf")).scatter_reduce(0, group, x, "amax")  # (G,)
    constant = (lo == hi)[group] & (count[group] > 1)  # (N,) no signal in the group
    adv = torch.where(constant, torch.zeros_like(adv), adv)
    single = count[group] == 1  # (N,)
    adv = torch.where(single, x if singleton == "raw" else torch.zeros_like(x), adv)
    if max_abs is not None:
        adv = adv.clamp(-max_abs, max_abs)
    return adv.to(values.dtype if values.is_floating_point() else torch.get_default_dtype())


def grpo_advantages(
    rewards: Tensor,
    group_ids: Ids,
    *,
    scale: bool = True,
    scale_level: Literal["group", "batch"] = "group",
    eps: float = 1e-6,
    singleton: Literal["raw", "zero"] = "raw",
    max_abs: float | None = None,
) -> Tensor:
    """Group-normalised outcome advantages (GRPO, arXiv:2402.03300; §2.2 step (2), §4.1).

        Â_k = (R_k − mean_{g(k)} R) / (std_{g(k)} R + eps)        for every sample k of group g (one task, G samples)

    The std is the unbiased one (verl/TRL, ``torch.std``). A group whose rewards are all equal gets exactly 0
    (no learning signal; DAPO's dynamic sampling drops such groups, see :func:`informative_groups`).

    Args:
        rewards: (N,) one scalar return per sample.
        group_ids: (N,) the task (prompt) of each sample, a tensor or a sequence of hashables.
        scale: divide by the std; False = Dr. GRPO (mean-centred only, arXiv:2503.20783; verl
            ``norm_adv_by_std_in_grpo=False``, TRL ``scale_rewards="none"``).
        scale_level: std of the sample's ``group`` (default) or of the whole ``batch`` (TRL ``scale_rewards``).
        eps: added to the std (verl 1e-6, TRL 1e-4).
        singleton: advantage of a one-sample group: ``raw`` = its reward (verl: mean 0, std 1), ``zero`` = 0.
        max_abs: clip to [−A_max, A_max] ("bounded group-normalised advantages", §2.2; 3 in §2.6). [inferred]

    Returns:
        (N,) advantages, same dtype as ``rewards`` (the default float dtype for integer rewards), detached.
    """
    group, num_groups = _group_index(group_ids, device=rewards.device)
    return _normalise_groups(
        rewards,
        group,
        num_groups,
        scale=scale,
        scale_level=scale_level,
        eps=eps,
        singleton=singleton,
        max_abs=max_abs,
    )


def agentwise_normalise(
    values: Tensor,
    task_ids: Ids | None,
    agent_ids: Ids,
    *,
    group_by: Literal["task-agent", "agent"] = "task-agent",
    scale: bool = True,
    eps: float = 1e-6,
    singleton: Literal["raw", "zero"] = "raw",
    max_abs: float | None = None,
) -> Tensor:
    """Dr. MAS agent-wise normalisation (arXiv:2602.08847; §5.1): mean 0 / std 1 within each agent's group.

    Dr. MAS (``group_by="task-agent"``, code: ``group_index = f"{uid}_{agent_id}"``) pools all of agent a's
    samples (turns) of task q and normalises with their own statistics:

        Â_k = (R_k − μ_{q(k),a(k)}) / (σ_{q(k),a(k)} + eps)

    so an agent with its own reward scale / frequency gets centred advantages, unlike one global (per-task)
    baseline. ``group_by="agent"`` normalises per agent over the whole batch (HARL ``happo.py`` per-agent
    advantage normalisation, §3 step 2). Same conventions as :func:`grpo_advantages` (unbiased std, equal
    values → exactly 0, singleton rule, optional clip).

    Args:
        values: (N,) per-sample rewards (Dr. MAS) or advantages (HARL), one per agent turn.
        task_ids: (N,) task / prompt-group id of each sample (ignored, may be None, for ``group_by="agent"``).
        agent_ids: (N,) agent of each sample (names or ints).
        group_by: ``task-agent`` (Dr. MAS) or ``agent`` (per agent over the batch).
        scale, eps, singleton, max_abs: as in :func:`grpo_advantages`.
    """
    if group_by == "task-agent":
        if task_ids is None:
            raise ValueError("group_by='task-agent' needs task_ids")
        group, num_groups = _group_index(task_ids, agent_ids, device=values.device)
    else:
        group, num_groups = _group_index(agent_ids, device=values.device)
    return _normalise_groups(
        values,
        group,
        num_groups,
        scale=scale,
        scale_level="group",
        eps=eps,
        singleton=singleton,
        max_abs=max_abs,
    )


def informative_groups(rewards: Tensor, group_ids: Ids) -> Tensor:
    """(N,) bool: the sample's group has at least two distinct rewards (DAPO dynamic-sampling filter, §4.2:
    keep groups with 0 < #correct < G). Singletons count as uninformative."""
    group, num_groups = _group_index(group_ids, device=rewards.device)
    x = rewards.detach().to(torch.float64)
    lo = torch.full((num_groups,), float("inf"), dtype=x.dtype, device=x.device).scatter_reduce(0, group, x, "amin")
    hi = torch.full((num_groups,), float("-inf"), dtype=x.dtype, device=x.device).scatter_reduce(0, group, x, "amax")
    return (lo < hi)[group]


# ----------------------------------------------------------------------------------------------------------------
# KL estimators (Schulman, "Approximating KL Divergence", 2020, http://joschu.net/blog/kl-approx.html; §4.3)
#
# Convention for every sampled estimator: x ~ q (the SAMPLER), logp = log p(x), logq = log q(x), r = p(x)/q(x);
# the target is KL(q‖p) = E_q[log q/p]. Element-wise, no reduction (reduce with masked_mean).
#   * TeamTR trust region (§2.3): samples from π_old = π_i^cur, so kl_k3(logp=new, logq=old) estimates the
#     per-token D^tok(π_cur‖π_θ).
#   * KL to a reference model in RLHF/GRPO: samples from π_θ, so kl_k3(logp=ref, logq=logprobs) estimates the
#     reverse KL(π_θ‖π_ref) (as a differentiable loss its gradient is that of the forward KL, §4.3).


def kl_k1(logp: Tensor, logq: Tensor) -> Tensor:
    """k1 = −log r = log q(x) − log p(x): unbiased for KL(q‖p), high variance, negative for about half the x."""
    return logq - logp


def kl_k2(logp: Tensor, logq: Tensor) -> Tensor:
    """k2 = ½ (log r)²: ≥ 0, low variance, BIASED for KL(q‖p) (matches it to second order as q → p)."""
    return 0.5 * (logp - logq) ** 2


def kl_k3(logp: Tensor, logq: Tensor, *, max_log_ratio: float | None = None) -> Tensor:
    """k3 = (r − 1) − log r: unbiased for KL(q‖p), ≥ 0 element-wise (log r ≤ r − 1), low variance.

    ``max_log_ratio`` clamps |log r| before exp against overflow (verl ``low_var_kl``: 20); clamping biases it.
    """
    log_r = logp - logq
    if max_log_ratio is not None:
        log_r = log_r.clamp(-max_log_ratio, max_log_ratio)
    return (torch.expm1(log_r) - log_r).clamp(min=0.0)  # clamp: rounding only, the value is ≥ 0 exactly


def kl_swapped_k3(logp: Tensor, logq: Tensor) -> Tensor:
    """r log r − (r − 1): unbiased, ≥ 0 estimate of the OTHER direction KL(p‖q), still from samples x ~ q (§4.3;
    the TeamTR constraint's direction is an open question, §2.3, so both are available)."""
    log_r = logp - logq
    r = torch.exp(log_r)
    return (r * log_r - torch.expm1(log_r)).clamp(min=0.0)  # clamp: rounding only, the value is ≥ 0 exactly


def kl_exact_per_token(logits_p: Tensor, logits_q: Tensor) -> Tensor:
    """Exact KL(q‖p) = Σ_v q(v) (log q(v) − log p(v)) at each position, over the full vocabulary (§2.3).

    Same argument convention as the sampled estimators (q = the distribution the expectation is under).
    Zero-probability entries of q (−inf logits) contribute 0.

    Args:
        logits_p, logits_q: (..., V) unnormalised logits.

    Returns:
        (...) per-position KL, ≥ 0 up to rounding.
    """
    logp = torch.log_softmax(logits_p.float(), dim=-1)  # (..., V)
    logq = torch.log_softmax(logits_q.float(), dim=-1)  # (..., V)
    q = logq.exp()
    terms = torch.where(q > 0, q * (logq - logp), torch.zeros_like(q))  # (..., V)
    return terms.sum(dim=-1)


def kl_exact(logits_p: Tensor, logits_q: Tensor, mask: Tensor) -> Tensor:
    """Masked mean over positions of the exact per-token KL(q‖p) (zero-variance D^tok of §2.3).

    Args:
        logits_p, logits_q: (B, T, V) logits at the positions that predict each token.
        mask: (B, T) positions to average over (the worker's own tokens).

    Returns:
        scalar tensor (0 if the mask is empty).
    """
    return masked_mean(kl_exact_per_token(logits_p, logits_q), mask)


# ----------------------------------------------------------------------------------------------------------------
# KL penalty coefficient updates (§2.4, option 2 and 3). kl = measured per-token KL, target = δ.


def adaptive_kl_coef_ppo(
    beta: float, kl: float, target: float, *, tolerance: float = 1.5, factor: float = 2.0
) -> float:
    """PPO's adaptive rule (Schulman et al. 2017, arXiv:1707.06347 §4): β·factor if kl > tolerance·δ,
    β/factor if kl < δ/tolerance, else β."""
    if kl > tolerance * target:
        return beta * factor
    if kl < target / tolerance:
        return beta / factor
    return beta


def adaptive_kl_coef_proportional(
    beta: float, kl: float, target: float, *, n_steps: int, horizon: int = 10000, max_error: float = 0.2
) -> float:
    """Proportional controller (Ziegler et al. 2019, arXiv:1909.08593; verl ``AdaptiveKLController``):
    β ← β · (1 + clip(kl/δ − 1, −max_error, max_error) · n_steps / horizon)."""
    error = min(max(kl / target - 1.0, -max_error), max_error)
    return beta * (1.0 + error * n_steps / horizon)


def adaptive_kl_coef_lagrangian(beta: float, kl: float, target: float, *, lr: float) -> float:
    """Dual ascent on the constraint kl ≤ δ: β ← max(0, β + lr·(kl − δ)). (No source says TeamTR uses it.)"""
    return max(0.0, beta + lr * (kl - target))
