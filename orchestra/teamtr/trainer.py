"""TeamTR trainer: per-agent trust-region fine-tuning of a team of LM agents (docs/architecture.md §5; formulas:
docs/algorithms.md).

One loop, five schemes that differ ONLY in where each update's data comes from (docs/algorithms.md §2.2, §3):

* ``teamtr``: before each agent's update, FRESH rollouts of the current team (earlier agents already updated);
* ``naive``: one rollout batch per stage, reused (stale) for every agent, in turn;
* ``joint``: one batch, all agents updated at once on the JOINT ratio Π_i r_i(τ) = exp(Σ_i Σ_u log r_{i,u});
* ``joint_indep``: one batch, all agents updated at once, each on its own ratio (docs/telephone-chain.md: ≡ naive);
* ``happo``: the naive stale batch, advantage × the product of the ratios of the agents updated earlier
  (docs/algorithms.md §3);
* ``stale_indep`` (a control): a separate batch per agent, as teamtr's, but every one sampled by the team as it was
  at the stage start (as naive's): teamtr's data volume without its freshness.

Each update is :func:`update_agents`: PPO-clip epochs on the agent's own tokens (the loss is :func:`team_loss`, one
hop from the loop) and a per-agent trust region on the per-token KL(π_i^cur ‖ π_i^θ) measured on the update's own
training batch (docs/algorithms.md §2.3, §2.4; :mod:`orchestra.teamtr.trust_region`): backtracking line search
(default), an adaptive penalty, or none.

The trainer is generic over :class:`TrainableTeam` (a Protocol): the telephone chain adapter lives in
:mod:`orchestra.teamtr.chain_team`; a SmolLM2 team only has to provide the same few methods
(:mod:`orchestra.teamtr.protocols`).
Knobs: :mod:`orchestra.teamtr.config`; run directory, metrics files and resumable checkpoints:
:mod:`orchestra.teamtr.checkpoint`. This module imports torch (and safetensors, through checkpoint) only.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from orchestra.teamtr.checkpoint import (
    CheckpointError,
    RunDirectory,
    capture,
    resolved_config,
    restore,
)
from orchestra.teamtr.config import (
    SCHEMES,
    KLEstimator,
    Scheme,
    TeamTRConfig,
    make_optimizer,
    seeded_generator,
)
from orchestra.teamtr.losses import (
    happo_factor,
    informative_groups,
    kl_exact,
    kl_k3,
    masked_mean,
    ppo_clip_loss,
    sequence_logratio,
)
from orchestra.teamtr.protocols import BatchT, ConfiguredTeam, Metrics, RolloutBatch, TrainableTeam
from orchestra.teamtr.signals import (
    agent_advantages,
    compute_advantages,
    credit_weights,
    entropy,
    reference_logprobs,
    surrogate_gain,
)
from orchestra.teamtr.trust_region import backtrack, measures_floor, noise_floor, penalty_update, token_kl
from trajectories.rundir import ConfigMismatchError

# ----------------------------------------------------------------------------------------------------------------
# the loss (its advantages, credit and diagnostics: orchestra.teamtr.signals)


@dataclass
class UpdateInputs:
    """Frozen full-batch tensors of one update, computed before its first step (π_i^cur = the pre-update policy)."""

    advantages: Tensor  # (B,) sequence advantages (the joint ratio's)
    agent_advantages: dict[int, Tensor]  # agent → (B,) its own advantages (drmas, credit; else the sequence ones)
    old_logprobs: dict[int, Tensor]  # agent → (B, T) log π_i^cur of the batch's tokens
    old_logits: dict[int, Tensor]  # agent → (B, T, V) π_i^cur logits (only when the KL needs them)
    ref_logprobs: dict[int, Tensor]  # agent → (B, T) log π_i^ref (only when ref_kl_coef > 0)
    happo_factor: Tensor | None  # (B,) HAPPO factor, None for the other schemes

    def rows(self, rows: Tensor) -> UpdateInputs:
        return UpdateInputs(
            advantages=self.advantages[rows],
            agent_advantages={i: t[rows] for i, t in self.agent_advantages.items()},
            old_logprobs={i: t[rows] for i, t in self.old_logprobs.items()},
            old_logits={i: t[rows] for i, t in self.old_logits.items()},
            ref_logprobs={i: t[rows] for i, t in self.ref_logprobs.items()},
            happo_factor=None if self.happo_factor is None else self.happo_factor[rows],
        )


def team_loss(
    team: TrainableTeam[BatchT],
    agents: Sequence[int],
    mb: BatchT,
    mb_in: UpdateInputs,
    cfg: TeamTRConfig,
    *,
    joint_ratio: bool,
    kl_coefs: dict[int, float],
    kl_estimator: KLEstimator,
) -> tuple[Tensor, Metrics]:
    """THE TeamTR loss of one minibatch for the agents being updated (docs/algorithms.md §2.2 step (4), §3, §2.4
    option 2).

    Per agent i (own tokens u, mask m_i; r_u = π_i^θ/π_i^cur):
        L_i = aggregate_u −min(r_u Â, clip(r_u, 1−ε_lo, 1+ε_hi) Â)        (Â × HAPPO factor M for ``happo``)
    ``joint_ratio`` (scheme ``joint``, a product-ratio joint PPO, not MAPPO: MAPPO clips each agent's own ratio,
    which is ``joint_indep``): one ratio per SEQUENCE, ρ(τ) = Π_i Π_u r_{i,u}
        L = mean_τ −min(ρ Â, clip(ρ) Â)
    otherwise L = Σ_i L_i (a sum: each agent's gradient is exactly that of its own L_i).
    Plus, per agent: β_i · D̂_i^tok(π_cur‖π_θ) in penalty mode, and ref_kl_coef · k3 KL(π_θ‖π_ref).
    """
    logps = {i: team.logprobs(i, mb) for i in agents}  # agent → (B, T), with grad
    metrics: Metrics = {}
    if joint_ratio:
        masks = [mb.mask[i].bool() for i in agents]
        seq_logp = sum(torch.where(m, logps[i], 0.0).sum(-1, keepdim=True) for i, m in zip(agents, masks, strict=True))
        seq_old = sum(
            torch.where(m, mb_in.old_logprobs[i], 0.0).sum(-1, keepdim=True) for i, m in zip(agents, masks, strict=True)
        )
        seq_mask = torch.stack(masks).any(dim=0).any(dim=-1, keepdim=True)  # (B, 1) episodes with own tokens
        assert isinstance(seq_logp, Tensor) and isinstance(seq_old, Tensor)
        loss, metrics = ppo_clip_loss(
            seq_logp,  # (B, 1) Σ_i Σ_u log π_i^θ: exp of the difference is the joint ratio
            seq_old,  # (B, 1)
            mb_in.advantages,
            seq_mask,
            epsilon_low=cfg.epsilon_low,
            epsilon_high=cfg.epsilon_high,
            aggregation=cfg.aggregation,
            dual_clip_c=cfg.dual_clip_c,
        )
    else:
        loss = torch.zeros(())
        for i in agents:
            loss_i, m_i = ppo_clip_loss(
                logps[i],  # (B, T)
                mb_in.old_logprobs[i],  # (B, T)
                mb_in.agent_advantages[i],  # (B,)
                mb.mask[i],  # (B, T)
                epsilon_low=cfg.epsilon_low,
                epsilon_high=cfg.epsilon_high,
                aggregation=cfg.aggregation,
                happo_factor=mb_in.happo_factor,
                dual_clip_c=cfg.dual_clip_c,
            )
            loss = loss + loss_i
            metrics.update({f"mb/{i}/{k}": v for k, v in m_i.items()})
    for i in agents:
        if cfg.trust_region == "penalty":
            kl_i = token_kl(
                team,
                i,
                mb,
                mb_in.old_logprobs[i],
                mb_in.old_logits.get(i),
                kl_estimator,
                logp=logps[i],
                direction=cfg.kl_direction,
            )  # D̂_i^tok, differentiable
            loss = loss + kl_coefs[i] * kl_i
        if cfg.ref_kl_coef > 0:
            # samples from π_θ (≈ π_cur): k3(logp=ref, logq=θ) estimates KL(π_θ‖π_ref) (docs/algorithms.md §4.3)
            ref_kl = masked_mean(kl_k3(mb_in.ref_logprobs[i], logps[i]), mb.mask[i])
            loss = loss + cfg.ref_kl_coef * ref_kl
    return loss, metrics


# ----------------------------------------------------------------------------------------------------------------
# one update (one agent, or all agents at once for the joint schemes)


@dataclass
class AgentState:
    """Per-agent state that outlives an update."""

    optimizer: torch.optim.Optimizer | None = None  # the agent's kept optimizer (optimizer_state="persistent")
    kl_coef: float = 1.0  # penalty mode β_i


def _make_trainable(team: TrainableTeam[Any], agents: Sequence[int]) -> None:
    # Selecting one adapter may freeze the others (peft set_adapter): re-enable every updated agent's parameters
    # before backward, or a joint loss would silently drop their gradients.
    for i in agents:
        for p in team.parameters(i):
            p.requires_grad_(True)


def update_agents(
    team: TrainableTeam[BatchT],
    agents: Sequence[int],
    batch: BatchT,
    cfg: TeamTRConfig,
    *,
    states: dict[int, AgentState],
    shuffle: torch.Generator,
    happo_weights: Tensor | None = None,
    ref_states: dict[int, dict[str, Tensor]] | None = None,
    credit: dict[int, float] | None = None,
) -> tuple[Metrics, dict[int, Tensor]]:
    """Update ``agents`` (one for the sequential schemes) on ``batch``: PPO-clip epochs of :func:`team_loss`,
    per-agent trust region after every optimizer step (docs/algorithms.md §2.2 steps (2)–(5), §2.4).

    Only the listed agents' parameters move. Returns the update's flat metrics (per agent under
    ``agent/{name}/…``, plus their mean / sum without the prefix) and, per agent, the detached per-sequence
    log-ratio log π_i^new/π_i^cur of its own tokens (B,) — the HAPPO factor of later agents (docs/algorithms.md §3).
    """
    names = team.agent_names
    deltas = cfg.deltas(len(names))
    estimator: KLEstimator = ("exact" if team.has_logits else "k3") if cfg.kl_estimator == "auto" else cfg.kl_estimator
    if estimator == "exact" and not team.has_logits:
        raise ValueError("kl_estimator='exact' needs a team with logits")
    joint_ratio = cfg.scheme == "joint"

    # (2)-(3) advantages and the frozen π_i^cur quantities on the whole batch
    with torch.no_grad():
        sequence_adv = compute_advantages(batch, cfg)
        inputs = UpdateInputs(
            advantages=sequence_adv,
            agent_advantages=agent_advantages(batch, cfg, agents, sequence_adv, credit),
            # π_cur = the policy that sampled the batch for the agents being updated (none moved since): its log-probs
            # are recomputed by one forward, or taken from the sampler (saves that forward; decode rounding remains)
            old_logprobs={
                i: batch.behaviour_logprobs[i] if cfg.old_logprobs == "behaviour" else team.logprobs(i, batch).detach()
                for i in agents
            },
            old_logits={i: team.logits(i, batch).detach() for i in agents} if team.has_logits else {},
            ref_logprobs=(
                {i: reference_logprobs(team, i, batch, ref_states[i]) for i in agents}
                if cfg.ref_kl_coef > 0 and ref_states is not None
                else {}
            ),
            happo_factor=happo_weights,
        )
    # the batch must have been sampled by π_cur for its own tokens (teamtr/naive: exactly; gap = rounding)
    gaps = {
        i: float(
            masked_mean((batch.behaviour_logprobs[i] - inputs.old_logprobs[i]).abs(), batch.mask[i])
            if bool(batch.mask[i].any())
            else torch.zeros(())
        )
        if cfg.old_logprobs == "recompute"
        else math.nan  # not measured: the sampler's log-probs are used as π_cur's
        for i in agents
    }
    # reduced precision: the KL estimate's rounding floor at π_cur, added to δ in the backtracking test (§2.4)
    floors = {
        i: noise_floor(team, i, batch, inputs.old_logprobs[i], inputs.old_logits.get(i), estimator, cfg)
        if measures_floor(team, cfg)
        else 0.0
        for i in agents
    }

    optimizers: dict[int, torch.optim.Optimizer] = {}
    for i in agents:
        if cfg.optimizer_state == "persistent":
            if states[i].optimizer is None:
                states[i].optimizer = make_optimizer(team.parameters(i), cfg)
            opt = states[i].optimizer
            assert opt is not None
            optimizers[i] = opt
        else:
            optimizers[i] = make_optimizer(team.parameters(i), cfg)
    kl_coefs = {i: states[i].kl_coef for i in agents}

    # (4) PPO epochs; the trust region ends an agent's update once its budget binds
    active = list(agents)
    kl_kept = dict.fromkeys(agents, 0.0)
    backtracks = dict.fromkeys(agents, 0)
    steps = dict.fromkeys(agents, 0)
    status = dict.fromkeys(agents, "none")
    final_logp: dict[int, Tensor | None] = dict.fromkeys(agents)  # log-probs at the kept parameters, if measured
    losses: list[float] = []
    step_clip: dict[int, list[float]] = {i: [] for i in agents}  # clip fraction of each step's loss, as it was taken
    b_size = batch.batch_size
    mb_size = b_size // cfg.num_minibatches
    for _epoch in range(cfg.num_epochs):
        b_inds = torch.randperm(b_size, generator=shuffle) if cfg.num_minibatches > 1 else torch.arange(b_size)
        for start in range(0, mb_size * cfg.num_minibatches, mb_size):
            if not active:
                break
            mb_rows = b_inds[start : start + mb_size]
            mb = batch.select(mb_rows)
            loss, loss_metrics = team_loss(
                team,
                agents if joint_ratio else active,
                mb,
                inputs.rows(mb_rows),
                cfg,
                joint_ratio=joint_ratio,
                kl_coefs=kl_coefs,
                kl_estimator=estimator,
            )
            _make_trainable(team, agents)
            for i in agents:
                optimizers[i].zero_grad(set_to_none=True)
            loss.backward()
            losses.append(float(loss.detach()))
            for i in active:  # the joint loss has one clip for the team
                step_clip[i].append(
                    loss_metrics.get(f"mb/{i}/losses/clip_fraction", loss_metrics.get("losses/clip_fraction", 0.0))
                )
            befores = {i: team.state(i) for i in active} if cfg.trust_region == "backtrack" else {}
            for i in active:
                if cfg.max_grad_norm is not None:
                    torch.nn.utils.clip_grad_norm_(team.parameters(i), cfg.max_grad_norm)
                optimizers[i].step()
                steps[i] += 1
            for i in agents:
                optimizers[i].zero_grad(set_to_none=True)
            if cfg.trust_region != "backtrack":
                continue
            for i in list(active):
                kl, tries, outcome, final_logp[i] = backtrack(
                    team,
                    i,
                    batch,
                    inputs.old_logprobs[i],
                    inputs.old_logits.get(i),
                    befores[i],
                    kl_kept[i],
                    deltas[i],
                    cfg,
                    estimator,
                    floor=floors[i],
                )
                kl_kept[i], status[i] = kl, outcome
                backtracks[i] += tries
                if outcome != "full":  # early stop: the budget binds
                    active.remove(i)
                    if outcome == "reverted":
                        steps[i] -= 1

    # (5) diagnostics at the final parameters, on the whole training batch (docs/algorithms.md §2.3)
    metrics: Metrics = {}
    logratios: dict[int, Tensor] = {}
    with torch.no_grad():
        for i in agents:
            cached = final_logp[i]  # the last trust-region check already evaluated the final parameters
            new = team.logprobs(i, batch).detach() if cached is None else cached  # (B, T)
            final_logits = team.logits(i, batch).detach() if team.has_logits else None  # one forward for all below
            kl_trust = float(
                token_kl(
                    team,
                    i,
                    batch,
                    inputs.old_logprobs[i],
                    inputs.old_logits.get(i),
                    estimator,
                    logp=new,
                    direction=cfg.kl_direction,
                    new_logits=final_logits,
                )
            )  # the enforced estimate at the kept parameters
            if cfg.trust_region == "penalty":
                states[i].kl_coef = penalty_update(kl_coefs[i], kl_trust, deltas[i], batch.batch_size, cfg)
            logratios[i] = sequence_logratio(new, inputs.old_logprobs[i], batch.mask[i], reduce=cfg.happo_reduce)
            _, surr = ppo_clip_loss(
                new,
                inputs.old_logprobs[i],
                inputs.agent_advantages[i],
                batch.mask[i],
                epsilon_low=cfg.epsilon_low,
                epsilon_high=cfg.epsilon_high,
                aggregation=cfg.aggregation,
            )
            kls = {"kl_k1": surr["kl/approx_k1"], "kl_k3": surr["kl/approx_k3"]}
            if i in inputs.old_logits and final_logits is not None:
                kls["kl_exact"] = float(kl_exact(final_logits, inputs.old_logits[i], batch.mask[i]))
            kls["kl_trust"] = kl_trust
            kls["kl_floor"] = floors[i]  # the enforced test: kl_trust ≤ delta + kl_floor
            per_agent: Metrics = {
                "surrogate_gain": surr["losses/surrogate_gain"],
                "clip_fraction": surr["losses/clip_fraction"],
                "entropy": entropy(batch.mask[i], new, final_logits),
                **kls,
                "delta": deltas[i],
                "backtracks": float(backtracks[i]),
                # accepted: the update moved the agent (some step kept). A later epoch's reverted step leaves the
                # earlier epochs' steps in place, so "the last step was reverted" is its own flag.
                "accepted": float(steps[i] > 0),
                "last_step_reverted": float(status[i] == "reverted"),
                "early_stopped": float(status[i] in ("shortened", "reverted")),
                "optimizer_steps": float(steps[i]),
                # the trust region acted: a step was shortened or reverted (backtrack) or the KL penalty was on
                "trust_region_acted": float(
                    backtracks[i] > 0
                    if cfg.trust_region == "backtrack"
                    else kl_coefs[i] > 0 and cfg.trust_region == "penalty"
                ),
                # the clip fraction of the losses the steps were taken on (the first step's is 0: ratio 1 there)
                "step_clip_fraction": float(np.mean(step_clip[i])) if step_clip[i] else 0.0,
                "behaviour_gap": gaps[i],
                "kl_coef": states[i].kl_coef,
                "num_tokens": surr["losses/num_tokens"],
            }
            metrics.update({f"agent/{names[i]}/{k}": v for k, v in per_agent.items()})

    def _mean(key: str) -> float:
        return float(np.mean([metrics[f"agent/{names[i]}/{key}"] for i in agents]))

    metrics.update(
        {
            "losses/policy_loss": float(np.mean(losses)) if losses else 0.0,
            "losses/surrogate_gain": _mean("surrogate_gain"),
            "losses/clip_fraction": _mean("clip_fraction"),
            "losses/step_clip_fraction": _mean("step_clip_fraction"),
            "losses/entropy": _mean("entropy"),
            "losses/adv_abs_max": float(inputs.advantages.abs().max()) if b_size else 0.0,
            "kl/k1": _mean("kl_k1"),
            "kl/k3": _mean("kl_k3"),
            "kl/trust": _mean("kl_trust"),
            "kl/floor": _mean("kl_floor"),
            "trust/backtracks": float(sum(backtracks.values())),
            "trust/accepted": float(all(steps[i] > 0 for i in agents)),
            "trust/optimizer_steps": float(sum(steps.values())),
            "trust/acted": _mean("trust_region_acted"),  # share of this update's agents whose trust region acted
        }
    )
    if inputs.old_logits:
        metrics["kl/exact"] = _mean("kl_exact")
    if happo_weights is not None:
        metrics["losses/happo_factor_mean"] = float(happo_weights.mean())
        metrics["losses/happo_factor_max"] = float(happo_weights.max())
    return metrics, logratios


# ----------------------------------------------------------------------------------------------------------------
# the loop


UpdateHook = Callable[[int, tuple[int, ...], Any], None]  # (stage, agents, batch) → None


@dataclass(frozen=True)
class TeamSnapshot:
    """Copies of the trainer's per-agent state at one moment: every agent's parameters, optimizer state and β_i."""

    params: tuple[dict[str, Tensor], ...]  # per agent: TrainableTeam.state
    optimizers: tuple[
        dict[str, Any] | None, ...
    ]  # per agent: a deep copy of its optimizer's state_dict (None: none yet)
    kl_coefs: tuple[float, ...]  # per agent: penalty-mode β_i

    def restore(self, team: TrainableTeam[Any], cfg: TeamTRConfig) -> dict[int, AgentState]:
        """Load the parameters back into ``team``; returns new :class:`AgentState` s (optimizers rebuilt by
        :func:`make_optimizer` from ``cfg`` over the team's parameters, each with a fresh copy of its saved state),
        ready for :func:`update_agents`. Every call gives identical, independent copies: the arms of an experiment
        branched from one snapshot share nothing."""
        states: dict[int, AgentState] = {}
        for i, params in enumerate(self.params):
            team.load_state(i, params)
            opt = None
            saved = self.optimizers[i]
            if saved is not None:
                opt = make_optimizer(team.parameters(i), cfg)
                opt.load_state_dict(copy.deepcopy(saved))
            states[i] = AgentState(optimizer=opt, kl_coef=self.kl_coefs[i])
        return states


@dataclass(frozen=True)
class UpdatePoint:
    """The trainer right after one update (:attr:`TrainHooks.at_update`): what an experiment needs to branch from
    the middle of a stage (the run directory's checkpoints are per stage). ``team`` and ``states`` are the live
    objects, valid during the hook call only: :meth:`capture` copies them."""

    stage: int
    position: int  # the update's place in the stage's order (0 = the stage's first update)
    agents: tuple[int, ...]  # the agents it moved
    batch: Any  # the batch it trained on
    batch_rng_state: Tensor  # the rollout generator's state just before that batch was sampled (see below)
    metrics: Metrics  # the update's record, as logged
    team: TrainableTeam[Any]
    states: dict[int, AgentState]

    def capture(self) -> TeamSnapshot:
        """Copies of every agent's parameters, optimizer state and β_i now (after this update)."""
        n = len(self.team.agent_names)
        return TeamSnapshot(
            params=tuple(self.team.state(i) for i in range(n)),
            optimizers=tuple(
                None if (opt := self.states[i].optimizer) is None else copy.deepcopy(opt.state_dict()) for i in range(n)
            ),
            kl_coefs=tuple(self.states[i].kl_coef for i in range(n)),
        )

    def rollout_generator(self) -> torch.Generator:
        """A generator in the state that sampled :attr:`batch`: ``team.sample(B, point.rollout_generator())`` draws a
        batch with the same random numbers (common random numbers: for the chain the same keys and the same
        uniforms per agent) from the team as it is then, e.g. a fresh batch paired with the stale one."""
        return torch.Generator().set_state(self.batch_rng_state.clone())


@dataclass
class TrainHooks:
    """Optional callbacks around every update (diagnostics, tests, experiments); they must not change the team."""

    before_update: UpdateHook | None = None  # called after the batch is chosen, before any parameter moves
    after_update: UpdateHook | None = None  # called after the update's last parameter change
    on_update: Callable[[Metrics], None] | None = None  # each update's metrics record, as soon as it is logged
    on_stage: Callable[[Metrics], None] | None = None  # each stage's metrics record, as soon as it is logged
    # called right after each update is logged with the trainer's state there (branch an experiment mid-stage:
    # UpdatePoint); returning True ends the run there, the stage unfinished (no stage record, no checkpoint)
    at_update: Callable[[UpdatePoint], bool | None] | None = None


@dataclass
class TrainLog:
    """Metrics of a run: one flat dict per update and one per stage (namespaced keys, floats only)."""

    updates: list[Metrics] = field(default_factory=list)
    stages: list[Metrics] = field(default_factory=list)


@dataclass(frozen=True)
class Branch:
    """A run stopped right after one update (:func:`train_until`): the state to branch from and how it was reached."""

    point: UpdatePoint  # that update (its ``team`` and ``states`` are live: use ``snapshot`` once the team moves)
    snapshot: TeamSnapshot  # copies of every agent's state right after it
    log: TrainLog  # the run's metrics up to it


def train_until(team: TrainableTeam[BatchT], cfg: TeamTRConfig, *, stage: int, position: int) -> Branch:
    """Run ``cfg`` on ``team`` up to and including update ``position`` of stage ``stage`` and stop there (a mid-stage
    branch point: the run directory's checkpoints are per stage). The team is left in that state.

    Raises:
        ValueError: the run ends (``cfg.num_stages``) before that update.
    """
    found: list[Branch] = []

    def at_update(point: UpdatePoint) -> bool:
        if (point.stage, point.position) != (stage, position):
            return False
        found.append(Branch(point, point.capture(), TrainLog()))
        return True

    log = train(team, cfg, hooks=TrainHooks(at_update=at_update))
    if not found:
        raise ValueError(f"the run ended before update {position} of stage {stage}")
    return Branch(found[0].point, found[0].snapshot, log)


def train(
    team: TrainableTeam[BatchT],
    cfg: TeamTRConfig,
    *,
    hooks: TrainHooks | None = None,
    out_dir: str | Path | None = None,
    resume: bool | str | Path = False,
    tensorboard: bool = False,
) -> TrainLog:
    """Run ``cfg.num_stages`` stages of ``cfg.scheme`` on ``team`` (docs/algorithms.md §2.2; baselines §2.2 end and §3).

    Per stage: an agent order; for each update (one agent, or all at once for the joint schemes) the training
    batch is FRESH (teamtr) or the stage's one batch (the others); HAPPO weights the advantage by the product of
    the earlier agents' ratios on that batch. Rollouts use one generator stream (seeded by ``cfg.seed``), orders
    another, and minibatch shuffles a stream per (stage, batch), so naive is order-invariant bit for bit.

    ``out_dir``: a run directory (:mod:`orchestra.teamtr.checkpoint`): config, metrics per stage (``tensorboard``:
    event files too), a checkpoint per stage. ``resume`` (needs ``out_dir``): True continues from its latest checkpoint
    (or starts if there is none), a path from that one; with the team built as before (same config and seed) the run
    continues bit-identically up to ``cfg.num_stages``, and the returned log holds the whole run.

    Raises:
        ConfigMismatchError: resuming under a config that differs (fields named) beyond ``RESUMABLE_FIELDS``.
        CheckpointError: a checkpoint or metrics file is missing or damaged (file named).
    """
    hooks = hooks or TrainHooks()
    n = len(team.agent_names)
    generators = {"rollout": seeded_generator(cfg.seed, 0), "order": seeded_generator(cfg.seed, 1)}
    if cfg.stale_gap_batch > 0:  # its own stream: measuring leaves the training draws unchanged
        generators["diagnostic"] = seeded_generator(cfg.seed, 4)
    rollout_gen, order_gen = generators["rollout"], generators["order"]
    states = {i: AgentState(kl_coef=cfg.kl_penalty_coef) for i in range(n)}
    log = TrainLog()
    if out_dir is None and resume is not False:
        raise ValueError("resume needs out_dir")
    team_config = team.config if isinstance(team, ConfiguredTeam) else None
    config = resolved_config(cfg, team_config, type(team).__name__)
    run = RunDirectory(out_dir, config, resume, tensorboard=tensorboard) if out_dir is not None else None
    ckpt = run.checkpoint if run is not None else None
    if ckpt is None:
        first_stage = update_index = episodes = tokens = 0
        wall_seconds = 0.0
        success = team.exact_success() if cfg.evaluate else None
        ref_states = {i: team.state(i) for i in range(n)} if cfg.ref_kl_coef > 0 else None
    else:
        assert run is not None
        optimizers, ref_states = restore(team, ckpt, generators, lambda ps: make_optimizer(ps, cfg))
        for i in range(n):
            states[i].optimizer, states[i].kl_coef = optimizers[i], ckpt.kl_coefs[i]
        first_stage, c = ckpt.stage, ckpt.counters
        update_index, episodes, tokens = int(c["update_index"]), int(c["episodes"]), int(c["tokens"])
        wall_seconds, success = float(c["wall_seconds"]), c["success"]
        log.updates, log.stages = list(run.writers["updates"].rows), list(run.writers["stages"].rows)
    t_start = time.perf_counter() - wall_seconds  # perf/wall_seconds continues across a resume
    informative = 1.0  # share of the last sampled batch in informative groups (DAPO filter)

    def sample() -> tuple[BatchT, float, Tensor]:
        """A batch of the current team, its sampling time and the rollout generator's state before it; with the DAPO
        filter, its informative groups only: batches are drawn (all of them counted as sampled) until one has at
        least one, up to ``dapo_max_batches``; the last one is kept whole if none has (its advantages are then
        all 0)."""
        nonlocal episodes, tokens, informative
        t0 = time.perf_counter()
        rng_state = rollout_gen.get_state()
        for _ in range(cfg.dapo_max_batches if cfg.dapo_filter else 1):
            with torch.no_grad():
                b = team.sample(cfg.batch_size, rollout_gen)
            episodes += b.batch_size
            tokens += b.num_tokens
            if not cfg.dapo_filter:
                break
            keep = informative_groups(b.rewards, b.group_ids)
            informative = float(keep.float().mean())
            if bool(keep.any()):
                b = b.select(torch.nonzero(keep).flatten())
                break
        return b, time.perf_counter() - t0, rng_state

    for stage in range(first_stage, cfg.num_stages):
        t_stage = time.perf_counter()
        stage_first_update = len(log.updates)
        order = cfg.agent_order(n, order_gen)
        updates = [tuple(order)] if cfg.scheme in ("joint", "joint_indep") else [(i,) for i in order]
        stale, stale_seconds, stale_rng = (
            sample() if cfg.scheme not in ("teamtr", "stale_indep") else (None, 0.0, rollout_gen.get_state())
        )
        stage_start = {i: team.state(i) for i in range(n)} if cfg.scheme == "stale_indep" else None
        prev_logratios: list[Tensor] = []  # HAPPO: (B,) per earlier-updated agent of this stage
        phi, credit = credit_weights(team, cfg, stage) if cfg.credit != "none" else ({}, None)
        certificate_gain = certificate_penalty = 0.0
        for position, agents in enumerate(updates):
            # the ONLY difference between the schemes: where the data comes from
            if stage_start is not None:  # stale_indep: a new batch of the stage-start team
                now = {i: team.state(i) for i in range(n)}
                for i, st in stage_start.items():
                    team.load_state(i, st)
                batch, sample_seconds, batch_rng = sample()
                for i, st in now.items():
                    team.load_state(i, st)
                batch_index = position
            elif stale is None:
                batch, sample_seconds, batch_rng = sample()  # teamtr: the current, partially updated team
                batch_index = position
            else:
                batch, sample_seconds, batch_rng = stale, (stale_seconds if position == 0 else 0.0), stale_rng
                batch_index = 0
            weights = None
            if cfg.scheme == "happo":
                prev = (
                    torch.stack(prev_logratios, dim=-1) if prev_logratios else torch.zeros(batch.batch_size, 0)
                )  # (B, J)
                weights = happo_factor(prev, max_log_factor=cfg.happo_max_log_factor)
            fresh = None
            if cfg.stale_gap_batch > 0 and cfg.scheme != "teamtr":
                with torch.no_grad():  # the team as it is now: what a fresh batch would have been
                    fresh = team.sample(cfg.stale_gap_batch, generators["diagnostic"])
            if hooks.before_update is not None:
                hooks.before_update(stage, agents, batch)
            t0 = time.perf_counter()
            metrics, logratios = update_agents(
                team,
                agents,
                batch,
                cfg,
                states=states,
                shuffle=seeded_generator(cfg.seed, 2, stage, batch_index),
                happo_weights=weights,
                ref_states=ref_states,
                credit=credit,
            )
            update_seconds = time.perf_counter() - t0
            if hooks.after_update is not None:
                hooks.after_update(stage, agents, batch)
            prev_logratios.extend(logratios[i] for i in agents)
            if cfg.stale_gap_batch > 0:
                # stale gap (docs/algorithms.md §2.3): the same parameter change judged on the batch it was trained
                # on and on a fresh batch of the team it acts in; 0 by construction when the batch is fresh
                for i in agents:
                    name = team.agent_names[i]
                    fresh_gain = surrogate_gain(team, i, fresh, cfg) if fresh is not None else None
                    trained = metrics[f"agent/{name}/surrogate_gain"]
                    metrics[f"agent/{name}/surrogate_gain_fresh"] = trained if fresh_gain is None else fresh_gain
                    metrics[f"agent/{name}/stale_gap"] = 0.0 if fresh_gain is None else abs(trained - fresh_gain)
                metrics["stale/gap"] = float(
                    np.mean([metrics[f"agent/{team.agent_names[i]}/stale_gap"] for i in agents])
                )
            a_max = metrics["losses/adv_abs_max"]
            for i in agents:
                name = team.agent_names[i]
                certificate_gain += metrics[f"agent/{name}/surrogate_gain"]
                certificate_penalty += (
                    cfg.certificate_c * a_max * math.sqrt(2 * max(metrics[f"agent/{name}/kl_trust"], 0.0))
                )
            log.updates.append(
                {
                    "rollout/stage": float(stage),
                    "rollout/update": float(update_index),
                    "rollout/position": float(position),
                    "rollout/agent": float(agents[0]) if len(agents) == 1 else -1.0,
                    "rollout/episodes": float(episodes),
                    "rollout/tokens": float(tokens),
                    "rollout/reward_mean": float(batch.rewards.float().mean()),
                    "rollout/batch_episodes": float(batch.batch_size),
                    **({"rollout/informative_fraction": informative} if cfg.dapo_filter else {}),
                    **{f"credit/{team.agent_names[j]}/phi": phi[j] for j in range(n) if credit is not None},
                    **{f"credit/{team.agent_names[j]}/weight": credit[j] for j in range(n) if credit is not None},
                    **metrics,
                    "perf/sample_seconds": sample_seconds,
                    "perf/update_seconds": update_seconds,
                    "perf/wall_seconds": time.perf_counter() - t_start,
                }
            )
            update_index += 1
            if hooks.on_update is not None:
                hooks.on_update(log.updates[-1])
            if hooks.at_update is not None:
                point = UpdatePoint(stage, position, agents, batch, batch_rng, log.updates[-1], team, states)
                if hooks.at_update(point):
                    return log
        record: Metrics = {
            "rollout/stage": float(stage),
            "rollout/episodes": float(episodes),
            "rollout/tokens": float(tokens),
            "certificate/proxy": certificate_gain - certificate_penalty,
            "certificate/surrogate_sum": certificate_gain,
            "certificate/kl_penalty_sum": certificate_penalty,
        }
        t_eval = time.perf_counter()
        if success is not None:
            new_success = team.exact_success()
            if new_success is not None:
                record.update(
                    {
                        "perf/team_success_start": success,
                        "perf/team_success": new_success,
                        "perf/team_success_delta": new_success - success,
                    }
                )
                success = new_success
        record["perf/stage_seconds"] = time.perf_counter() - t_stage
        record["perf/eval_seconds"] = time.perf_counter() - t_eval  # the held-out evaluation (0 without one)
        record["perf/train_seconds"] = t_eval - t_stage  # the stage without it: sampling, credit and updates
        record["perf/wall_seconds"] = time.perf_counter() - t_start
        log.stages.append(record)
        if hooks.on_stage is not None:
            hooks.on_stage(record)
        if run is not None:
            counters = {
                "update_index": update_index,
                "episodes": episodes,
                "tokens": tokens,
                "wall_seconds": time.perf_counter() - t_start,
                "success": success,
            }
            optimizers = [states[i].optimizer for i in range(n)]
            kl_coefs = [states[i].kl_coef for i in range(n)]
            state = capture(team, config, stage + 1, counters, optimizers, kl_coefs, ref_states, generators)
            run.end_stage(log.updates[stage_first_update:], record, state, cfg.keep_checkpoints)
    return log


__all__ = [  # the trainer's API, with the names re-exported from .config, .protocols, .checkpoint and trajectories.rundir
    "SCHEMES",
    "AgentState",
    "Branch",
    "BatchT",
    "CheckpointError",
    "ConfigMismatchError",
    "ConfiguredTeam",
    "KLEstimator",
    "Metrics",
    "RolloutBatch",
    "Scheme",
    "TeamTRConfig",
    "TeamSnapshot",
    "TrainHooks",
    "TrainLog",
    "TrainableTeam",
    "UpdateHook",
    "UpdateInputs",
    "UpdatePoint",
    "agent_advantages",
    "compute_advantages",
    "credit_weights",
    "penalty_update",
    "team_loss",
    "train",
    "train_until",
    "update_agents",
]
