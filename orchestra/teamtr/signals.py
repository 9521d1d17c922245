"""The learning signals of a TeamTR update (docs/algorithms.md §2.2–§2.3, §5): sequence and per-agent advantages
(GRPO, batch mean, Dr. MAS), credit weights from coalition values (leave-one-out, Shapley), the surrogate gain of a
change on a batch, the policy entropy and the log-probs under reference adapters. Functions of tensors and a team;
imports torch and numpy only. The
update that uses them: :func:`orchestra.teamtr.trainer.update_agents`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from orchestra.teamtr.config import TeamTRConfig, derive_seed
from orchestra.teamtr.credit import leave_one_out_credit, shapley_exact, shapley_monte_carlo
from orchestra.teamtr.losses import agentwise_normalise, grpo_advantages, masked_mean, ppo_clip_loss
from orchestra.teamtr.protocols import BatchT, CoalitionTeam, RolloutBatch, TrainableTeam


def compute_advantages(batch: RolloutBatch, cfg: TeamTRConfig) -> Tensor:
    """(B,) sequence advantages from the team return (docs/algorithms.md §2.2 step (2)).

    ``grpo`` (and ``drmas``, whose per-agent form is :func:`agent_advantages`): (R − mean_g R) / (std_g R + eps)
    within each group g of ``batch.group_ids``; ``batch_mean``: the same with the whole batch as one group (R − mean
    R, over std if ``adv_scale``). Clipped to [−A_max, A_max].
    """
    groups = batch.group_ids if cfg.advantage != "batch_mean" else torch.zeros_like(batch.rewards, dtype=torch.long)
    return grpo_advantages(batch.rewards, groups, scale=cfg.adv_scale, max_abs=cfg.adv_max)


def agent_advantages(
    batch: RolloutBatch,
    cfg: TeamTRConfig,
    agents: Sequence[int],
    sequence: Tensor,
    credit: dict[int, float] | None = None,
) -> dict[int, Tensor]:
    """Agent i's (B,) advantages: the sequence advantages, or with ``drmas`` the team return normalised per (group,
    agent) over the episodes where agent i has tokens (Dr. MAS agent-wise normalisation, docs/algorithms.md §5.1;
    0 where it has none); times agent i's credit weight when ``credit`` is given (§5.2)."""
    out: dict[int, Tensor] = {}
    if cfg.advantage == "drmas":
        spoke = [torch.nonzero(batch.mask[i].any(dim=-1)).flatten() for i in agents]  # rows with own tokens
        values = torch.cat([batch.rewards[r] for r in spoke])
        tasks = torch.cat([batch.group_ids[r] for r in spoke])
        who = torch.cat([torch.full((len(r),), i, dtype=torch.long) for i, r in zip(agents, spoke, strict=True)])
        adv = (
            agentwise_normalise(values, tasks, who, scale=cfg.adv_scale, max_abs=cfg.adv_max) if len(values) else values
        )
        start = 0
        for i, rows in zip(agents, spoke, strict=True):
            a = torch.zeros(batch.batch_size, dtype=sequence.dtype)
            a[rows] = adv[start : start + len(rows)].to(sequence.dtype)
            out[i], start = a, start + len(rows)
    else:
        out = {i: sequence for i in agents}
    if credit is not None:
        out = {i: a * credit[i] for i, a in out.items()}
    return out


def credit_weights(
    team: TrainableTeam[Any], cfg: TeamTRConfig, stage: int
) -> tuple[dict[int, float], dict[int, float]]:
    """Per-agent credit φ_i of the team as it is now (``cfg.credit``: leave-one-out, or Shapley values, exact or by
    antithetic Monte-Carlo permutations) and the advantage weights w_i = clip(n·φ_i / Σ_j |φ_j|, 0, w_max)
    (docs/algorithms.md §5.2; [inferred]: equal credit gives every agent weight 1, a dummy agent 0). The coalition
    values come from the team (:class:`CoalitionTeam`), with ``cfg.credit_null`` for the agents left out."""
    if not isinstance(team, CoalitionTeam):
        raise ValueError(
            f"credit={cfg.credit!r} needs a team that can value coalitions of its agents (coalition_value); "
            f"{type(team).__name__} has none"
        )
    n = len(team.agent_names)
    agents = list(range(n))
    values: dict[frozenset[int], float] = {}

    def value(present: frozenset[int]) -> float:  # each coalition once (common random numbers across marginals)
        if present not in values:
            values[present] = team.coalition_value(present, cfg.credit_null)
        return values[present]

    if cfg.credit == "loo":
        phi = leave_one_out_credit(value, agents)
    elif cfg.credit_samples == 0:
        phi = shapley_exact(value, agents)
    else:
        rng = np.random.default_rng(derive_seed(cfg.seed, 3, stage))
        phi = shapley_monte_carlo(
            value, agents, cfg.credit_samples, rng=rng, antithetic=cfg.credit_samples % 2 == 0
        ).values
    total = sum(abs(v) for v in phi.values())
    weights = {i: min(max(n * phi[i] / total, 0.0), cfg.credit_max_weight) if total > 0 else 1.0 for i in agents}
    return {i: float(phi[i]) for i in agents}, weights


def surrogate_gain(team: TrainableTeam[BatchT], agent: int, batch: BatchT, cfg: TeamTRConfig) -> float:
    """L̂_i of the agent's change since ``batch`` was sampled, on ``batch``: mean over its own tokens of (ρ − 1)·Â with
    ρ = π_i^θ / π_i^behaviour (docs/algorithms.md §2.3). On a batch the current team just sampled, behaviour = π_cur."""
    with torch.no_grad():
        adv = compute_advantages(batch, cfg)
        new = team.logprobs(agent, batch)
        _, m = ppo_clip_loss(new, batch.behaviour_logprobs[agent], adv, batch.mask[agent], aggregation=cfg.aggregation)
    return m["losses/surrogate_gain"]


def entropy(mask: Tensor, logp: Tensor, logits: Tensor | None) -> float:
    """Mean policy entropy at the agent's own positions (``mask``): exact over the vocabulary if ``logits`` (B, T, V)
    are given, else −mean log π of the sampled tokens (``logp``)."""
    if logits is not None:
        logsm = torch.log_softmax(logits.float(), dim=-1)  # (B, T, V)
        return float(masked_mean(-(logsm.exp() * logsm).sum(-1), mask))
    return float(masked_mean(-logp, mask))


def reference_logprobs(team: TrainableTeam[BatchT], agent: int, batch: BatchT, ref_state: dict[str, Tensor]) -> Tensor:
    """log π_agent^ref of the batch's tokens: swap the reference adapter in, evaluate, swap back."""
    current = team.state(agent)
    team.load_state(agent, ref_state)
    try:
        with torch.no_grad():
            return team.logprobs(agent, batch).detach()
    finally:
        team.load_state(agent, current)


__all__ = [
    "agent_advantages",
    "compute_advantages",
    "credit_weights",
    "entropy",
    "reference_logprobs",
    "surrogate_gain",
]
