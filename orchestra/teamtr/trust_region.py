"""The per-agent trust region of a TeamTR update (docs/algorithms.md §2.3–§2.4): the per-token KL between an agent's
pre-update policy π_cur and its current one, measured on the update's own batch, and the backtracking line search
that keeps it ≤ δ (plus the estimate's rounding floor in reduced precision: :func:`noise_floor`). Imports torch only;
the update that calls it is :func:`orchestra.teamtr.trainer.update_agents`."""

from __future__ import annotations

import torch
from torch import Tensor

from orchestra.teamtr.config import KLDirection, KLEstimator, TeamTRConfig, derive_seed
from orchestra.teamtr.losses import (
    adaptive_kl_coef_lagrangian,
    adaptive_kl_coef_ppo,
    adaptive_kl_coef_proportional,
    kl_exact,
    kl_k1,
    kl_k2,
    kl_k3,
    kl_swapped_k3,
    masked_mean,
)
from orchestra.teamtr.protocols import BatchT, TrainableTeam


def token_kl(
    team: TrainableTeam[BatchT],
    agent: int,
    batch: BatchT,
    old_logprobs: Tensor,
    old_logits: Tensor | None,
    estimator: KLEstimator,
    *,
    logp: Tensor | None = None,
    direction: KLDirection = "cur_theta",
    new_logits: Tensor | None = None,
) -> Tensor:
    """D̂_agent^tok: per-token KL on the agent's own tokens of ``batch`` (docs/algorithms.md §2.3), a scalar tensor.

    ``direction`` ``cur_theta``: KL(π_cur‖π_θ), the default; ``theta_cur``: KL(π_θ‖π_cur). The tokens were sampled by
    π_cur (q), r = π_θ/π_cur:

    ========  ===========================  ================================
    estimator KL(π_cur‖π_θ)                KL(π_θ‖π_cur)
    ========  ===========================  ================================
    exact     Σ_v π_cur (log π_cur − log π_θ)  Σ_v π_θ (log π_θ − log π_cur)
    k1        −log r (unbiased)            r log r (unbiased)
    k2        ½ (log r)² (biased)          ½ (log r)² (the same: symmetric to 2nd order)
    k3        (r − 1) − log r (unbiased)   r log r − (r − 1) (swapped k3, unbiased)
    ========  ===========================  ================================

    ``old_logprobs`` (B, T): log π_cur of the batch's tokens; ``old_logits`` (B, T, V): π_cur's logits (needed by
    ``exact`` only). ``logp`` / ``new_logits``: the current log-probs / logits when already computed (saves a forward).
    """
    mask = batch.mask[agent]
    if estimator == "exact":
        if old_logits is None:
            raise ValueError("the exact KL needs the pre-update logits")
        new_logits = team.logits(agent, batch) if new_logits is None else new_logits
        if direction == "cur_theta":
            return kl_exact(new_logits, old_logits, mask)  # kl_exact(p, q) = KL(q‖p)
        return kl_exact(old_logits, new_logits, mask)
    new = team.logprobs(agent, batch) if logp is None else logp
    old = old_logprobs
    if estimator == "k2":
        return masked_mean(kl_k2(new, old), mask)
    if direction == "cur_theta":
        return masked_mean(kl_k3(new, old) if estimator == "k3" else kl_k1(new, old), mask)
    if estimator == "k3":
        return masked_mean(kl_swapped_k3(new, old), mask)
    log_r = new - old
    return masked_mean(torch.exp(log_r) * log_r, mask)  # k1 of the other direction: E_q[r log r] = KL(p‖q)


def measures_floor(team: TrainableTeam[BatchT], cfg: TeamTRConfig) -> bool:
    """Whether an update measures the KL estimate's rounding floor (``cfg.kl_floor``; backtracking only)."""
    wanted = cfg.kl_floor == "measure" or (cfg.kl_floor == "auto" and team.reduced_precision)
    return cfg.trust_region == "backtrack" and wanted


def noise_floor(
    team: TrainableTeam[BatchT],
    agent: int,
    batch: BatchT,
    old_logprobs: Tensor,
    old_logits: Tensor | None,
    estimator: KLEstimator,
    cfg: TeamTRConfig,
) -> float:
    """The KL estimate's rounding floor on ``batch`` (docs/algorithms.md §2.4): D̂ at θ_cur + σ·z, z ~ N(0, 1) per
    trainable parameter (a fixed draw per agent), σ = ``cfg.kl_floor_step``. That zero step's true KL is negligible
    (~1e-9 nats per token on SmolLM2, measured in float32), but it re-rolls every rounding of a reduced-precision
    forward, so D̂ there is the noise alone. With noise ε independent of a step's true log-ratio Δ, every estimator is
    to second order E[Δ²]/2 + E[ε²]/2: the noise adds a floor, and D̂ − floor ≤ δ tests the true KL. The parameters
    are put back bit for bit."""
    before = team.state(agent)
    gen = torch.Generator().manual_seed(derive_seed(cfg.seed, 13, agent))
    zero_step = {
        k: v + cfg.kl_floor_step * torch.randn(v.shape, generator=gen, dtype=v.dtype).to(v.device)
        for k, v in before.items()
    }
    try:
        team.load_state(agent, zero_step)
        with torch.no_grad():
            logp = None if estimator == "exact" else team.logprobs(agent, batch).detach()
            kl = token_kl(
                team, agent, batch, old_logprobs, old_logits, estimator, logp=logp, direction=cfg.kl_direction
            )
    finally:
        team.load_state(agent, before)
    return float(kl)


def backtrack(
    team: TrainableTeam[BatchT],
    agent: int,
    batch: BatchT,
    old_logprobs: Tensor,
    old_logits: Tensor | None,
    before: dict[str, Tensor],
    kl_before: float,
    delta: float,
    cfg: TeamTRConfig,
    estimator: KLEstimator,
    *,
    floor: float = 0.0,
) -> tuple[float, int, str, Tensor | None]:
    """Enforce D̂ ≤ δ + floor after an optimizer step (docs/algorithms.md §2.4 option 1): keep the step, or
    line-search θ_prev + β^j (θ_step − θ_prev), j = 1..max_backtracks, or revert to θ_prev. ``floor``: the estimate's
    rounding noise (:func:`noise_floor`; 0 in float32).

    Returns (the KL of the parameters kept, line-search steps tried, ``full`` | ``shortened`` | ``reverted``, the
    batch's log-probs (B, T) at the parameters kept when they were computed on the way (k1 / k3), else None).
    """

    def measure() -> tuple[float, Tensor | None]:
        logp = None if estimator == "exact" else team.logprobs(agent, batch).detach()
        kl = token_kl(team, agent, batch, old_logprobs, old_logits, estimator, logp=logp, direction=cfg.kl_direction)
        return float(kl), logp

    with torch.no_grad():
        kl, logp = measure()
        if kl <= delta + floor:
            return kl, 0, "full", logp
        step = team.state(agent)
        for j in range(1, cfg.max_backtracks + 1):
            coef = cfg.backtrack_coef**j
            team.load_state(agent, {k: torch.lerp(before[k], step[k], coef) for k in before})
            kl, logp = measure()
            if kl <= delta + floor:
                return kl, j, "shortened", logp
        team.load_state(agent, before)
        return kl_before, cfg.max_backtracks, "reverted", None


def penalty_update(beta: float, kl: float, delta: float, batch_size: int, cfg: TeamTRConfig) -> float:
    """β_i after an update in penalty mode, by ``cfg.kl_penalty_rule`` (docs/algorithms.md §2.4 options 2–3)."""
    if cfg.kl_penalty_rule == "proportional":
        return adaptive_kl_coef_proportional(beta, kl, delta, n_steps=batch_size, horizon=cfg.kl_penalty_horizon)
    if cfg.kl_penalty_rule == "lagrangian":
        return adaptive_kl_coef_lagrangian(beta, kl, delta, lr=cfg.kl_penalty_lr)
    return adaptive_kl_coef_ppo(beta, kl, delta, tolerance=cfg.kl_penalty_tolerance, factor=cfg.kl_penalty_factor)


__all__ = ["backtrack", "measures_floor", "noise_floor", "penalty_update", "token_kl"]
