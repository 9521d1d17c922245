"""The typed config of a TeamTR run (docs/architecture.md §6: every knob declared with a default and a one-line doc),
its presets and its small helpers. Imports torch and numpy only; the loop is :mod:`orchestra.teamtr.trainer`."""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal, get_args, get_origin, get_type_hints

import numpy as np
import torch

from orchestra.teamtr.losses import AGGREGATIONS, Aggregation

Scheme = Literal["teamtr", "naive", "joint", "joint_indep", "happo", "stale_indep"]
SCHEMES: tuple[Scheme, ...] = ("teamtr", "naive", "joint", "joint_indep", "happo", "stale_indep")
KLEstimator = Literal["exact", "k3", "k2", "k1"]
KLDirection = Literal["cur_theta", "theta_cur"]


@dataclass(frozen=True)
class TeamTRConfig:
    """Every knob of a TeamTR run (docs/algorithms.md §2.6 for the starting values)."""

    scheme: Scheme = "teamtr"  # where each update's data comes from (module docstring)
    order: Literal["fixed", "random"] = (
        "random"  # agent order per stage: fixed, or a fresh permutation (docs/algorithms.md §2.6)
    )
    fixed_order: tuple[int, ...] = ()  # the order when order="fixed"; () = 0..n−1
    num_stages: int = 10  # stages; a stage updates every agent once
    batch_size: int = 256  # episodes per sampled batch (teamtr samples one per agent, the others one per stage)
    num_epochs: int = 1  # PPO epochs over an update's batch
    num_minibatches: int = 1  # minibatches per epoch (minibatch size = batch_size // num_minibatches)
    lr: float = 1e-2  # learning rate of each agent's optimizer (one per agent, over its own parameters)
    optimizer: Literal["adam", "sgd"] = "adam"  # Adam, or plain SGD (a step proportional to the gradient)
    sgd_momentum: float = 0.0  # SGD only: heavy-ball momentum (0 = plain gradient steps)
    optimizer_state: Literal["fresh", "persistent"] = (
        "persistent"  # one optimizer per agent kept across its updates, or a fresh one per update (reset)
    )
    max_grad_norm: float | None = None  # per-agent gradient-norm clip; None = off
    epsilon_low: float = 0.2  # PPO clip below, ratio ≥ 1 − ε_low
    epsilon_high: float = 0.2  # PPO clip above, ratio ≤ 1 + ε_high (DAPO: 0.28)
    aggregation: Aggregation = "token-mean"  # loss aggregation (losses.aggregate_loss)
    advantage: Literal["grpo", "batch_mean", "drmas"] = (
        "grpo"  # per GRPO group, over the whole batch, or Dr. MAS per (group, agent) over the episodes it spoke in
    )
    adv_scale: bool = True  # divide by the std (False = Dr. GRPO, mean-centred only)
    adv_max: float | None = (
        3.0  # A_max: clip advantages to [−A_max, A_max] (bounded advantages, docs/algorithms.md §2.2)
    )
    dapo_filter: bool = False  # DAPO dynamic sampling: train only on groups whose rewards differ (§4.2)
    dapo_max_batches: int = 4  # dapo_filter: batches sampled at most to collect batch_size informative episodes
    dual_clip_c: float | None = None  # dual clip for Â < 0: loss ≤ −c·Â (Ye et al. 2020; verl clip_ratio_c 3.0)
    credit: Literal["none", "loo", "shapley"] = (
        "none"  # per-agent credit φ_i scaling agent i's advantage (§5.2): leave-one-out or Shapley values
    )
    credit_null: Literal["drop", "uniform", "reference"] = (
        "drop"  # what replaces an agent outside a coalition: drop its message, a uniform one, its train-start policy
    )
    credit_samples: int = 0  # Shapley: Monte-Carlo permutations (antithetic); 0 = exact over all coalitions
    credit_max_weight: float = 3.0  # the weight n·φ_i / Σ_j |φ_j| is clipped to [0, credit_max_weight]
    trust_region: Literal["backtrack", "penalty", "none"] = (
        "backtrack"  # enforcement (docs/algorithms.md §2.4 options 1, 2)
    )
    delta: float | tuple[float, ...] = 0.01  # per-token KL budget δ_i, one for all or one per agent
    kl_estimator: Literal["auto", "exact", "k3", "k2", "k1"] = (
        "auto"  # D̂_i^tok (docs/algorithms.md §2.3); auto = exact if logits
    )
    kl_direction: KLDirection = (
        "cur_theta"  # the trust region's KL: KL(π_cur‖π_θ) (default) or KL(π_θ‖π_cur), both from π_cur's samples
    )
    backtrack_coef: float = 0.8  # line search θ_prev + β^j (θ_step − θ_prev) (HATRPO backtrack_coeff 0.8)
    max_backtracks: int = 10  # line-search steps before the step is reverted (HATRPO ls_step 10)
    # backtrack mode accepts D̂ ≤ δ + floor, floor = the KL estimate's rounding noise: D̂ of a zero step measured once
    # per update (trust_region.noise_floor, docs/algorithms.md §2.4); auto = measure iff the team computes below
    # float32 (TrainableTeam.reduced_precision), measure = always, off = floor 0
    kl_floor: Literal["auto", "measure", "off"] = "auto"
    kl_floor_step: float = 1e-5  # σ of that zero step θ_cur + σ·N(0, 1) per parameter (true KL ~1e-9 on SmolLM2)
    kl_penalty_coef: float = 1.0  # penalty mode: initial β_i of loss += β_i · D̂_i
    kl_penalty_tolerance: float = 1.5  # penalty mode: PPO rule, β×factor if D > tol·δ, β/factor if D < δ/tol
    kl_penalty_factor: float = 2.0  # penalty mode: PPO rule multiplier
    kl_penalty_rule: Literal["ppo", "proportional", "lagrangian"] = (
        "ppo"  # penalty mode: how β_i adapts after each update (docs/algorithms.md §2.4)
    )
    kl_penalty_horizon: int = 10000  # proportional rule: β ← β(1 + clip(D/δ − 1, ±0.2)·B/horizon)
    kl_penalty_lr: float = 10.0  # Lagrangian rule: β ← max(0, β + lr·(D − δ))
    ref_kl_coef: float = 0.0  # coefficient of k3 KL(π_θ‖π_ref) to the adapters at train start; 0 = off
    happo_reduce: Literal["sum", "mean"] = "sum"  # HAPPO per-sequence log-ratio: product (sum) or per-token mean
    happo_max_log_factor: float | None = None  # HAPPO: clip the log factor to [−c, c]; None = off (HARL)
    # c of the certificate proxy Σ_i [L̂_i − c·Â_max·√(2·D̂_i)] (docs/algorithms.md §2.3)
    certificate_c: float = 1.0
    old_logprobs: Literal["recompute", "behaviour"] = (
        "recompute"  # π_cur's log-probs: one forward per update, or the sampler's (equal up to decode rounding)
    )
    stale_gap_batch: int = 0  # stale schemes: episodes of a fresh diagnostic batch per update (0 = off; not trained on)
    evaluate: bool = True  # log the team's exact success per stage when the team offers it
    seed: int = 0  # rollouts, orders and minibatch shuffles
    keep_checkpoints: int = 2  # run directory: stage checkpoints kept (the newest K; ≥ 1)

    def __post_init__(self) -> None:
        if self.scheme not in SCHEMES:
            raise ValueError(f"unknown scheme {self.scheme!r}; expected one of {SCHEMES}")
        if self.aggregation not in AGGREGATIONS:
            raise ValueError(f"unknown aggregation {self.aggregation!r}")
        for name, choices in _choice_fields().items():  # every other choice field (order, advantage, …)
            if getattr(self, name) not in choices:
                raise ValueError(f"{name}: expected one of {choices}, got {getattr(self, name)!r}")
        if self.num_stages < 0 or self.batch_size < 1 or self.num_epochs < 1 or self.num_minibatches < 1:
            raise ValueError("need num_stages ≥ 0, batch_size ≥ 1, num_epochs ≥ 1, num_minibatches ≥ 1")
        if self.keep_checkpoints < 1:
            raise ValueError(f"keep_checkpoints must be ≥ 1, got {self.keep_checkpoints}")
        if self.batch_size < self.num_minibatches:
            raise ValueError(f"batch_size {self.batch_size} < num_minibatches {self.num_minibatches}")
        if not self.kl_floor_step > 0.0:
            raise ValueError(f"kl_floor_step must be > 0, got {self.kl_floor_step}")
        if not 0.0 < self.backtrack_coef < 1.0 or self.max_backtracks < 0:
            raise ValueError("need 0 < backtrack_coef < 1 and max_backtracks ≥ 0")
        if self.stale_gap_batch < 0:
            raise ValueError(f"stale_gap_batch must be ≥ 0, got {self.stale_gap_batch}")
        if self.dapo_max_batches < 1 or self.credit_samples < 0 or self.credit_max_weight <= 0:
            raise ValueError("need dapo_max_batches ≥ 1, credit_samples ≥ 0 and credit_max_weight > 0")
        if self.dual_clip_c is not None and self.dual_clip_c <= 1.0:
            raise ValueError(f"dual_clip_c must be > 1 (verl: 3.0), got {self.dual_clip_c}")
        if self.kl_penalty_horizon < 1 or self.kl_penalty_lr <= 0:
            raise ValueError("need kl_penalty_horizon ≥ 1 and kl_penalty_lr > 0")
        if self.scheme == "joint" and (self.advantage == "drmas" or self.credit != "none"):
            raise ValueError(
                "scheme 'joint' trains on one sequence advantage: per-agent advantages (drmas, credit) "
                "need another scheme"
            )
        if self.lr <= 0 or not 0.0 <= self.sgd_momentum < 1.0:
            raise ValueError(
                f"need lr > 0 and 0 ≤ sgd_momentum < 1, got lr={self.lr}, sgd_momentum={self.sgd_momentum}"
            )
        deltas = self.delta if isinstance(self.delta, tuple) else (self.delta,)
        if any(d <= 0 for d in deltas):
            raise ValueError(f"delta must be > 0, got {self.delta}")

    def deltas(self, n_agents: int) -> tuple[float, ...]:
        """δ_i for every agent."""
        if isinstance(self.delta, tuple):
            if len(self.delta) != n_agents:
                raise ValueError(f"delta has {len(self.delta)} entries for {n_agents} agents")
            return self.delta
        return (float(self.delta),) * n_agents

    def agent_order(self, n_agents: int, generator: torch.Generator) -> list[int]:
        """This stage's agent order (a fresh permutation from ``generator`` when random)."""
        if self.order == "random":
            return [int(i) for i in torch.randperm(n_agents, generator=generator)]
        order = list(self.fixed_order) if self.fixed_order else list(range(n_agents))
        if sorted(order) != list(range(n_agents)):
            raise ValueError(f"fixed_order {order} is not a permutation of 0..{n_agents - 1}")
        return order


# knobs that may change when a run is resumed (extend it, checkpoint less often): every other field must match
RESUMABLE_FIELDS: frozenset[str] = frozenset({"num_stages", "keep_checkpoints"})


@functools.cache
def _choice_fields() -> dict[str, tuple[object, ...]]:
    """{field: its allowed values} for TeamTRConfig's Literal fields."""
    hints = get_type_hints(TeamTRConfig)
    return {name: get_args(tp) for name, tp in hints.items() if get_origin(tp) is Literal}


# The starting points of the two kinds of team, each written once (the field defaults above are the generic ones):
# the telephone-chain experiment's trainer, also Stage 0's pre-swap training of the chain (`orchestra align chain`),
# and the CPU-sized trainer of real LLM workers (`orchestra finetune`).
CHAIN_TRAINER = TeamTRConfig(order="fixed", num_stages=20, batch_size=128, num_epochs=2, lr=3e-2, delta=0.03)
LLM_CPU_TRAINER = TeamTRConfig(num_stages=2, batch_size=8, num_epochs=1, num_minibatches=1, lr=1e-4, delta=0.01)


def make_optimizer(params: Iterable[torch.nn.Parameter], cfg: TeamTRConfig) -> torch.optim.Optimizer:
    """One agent's optimizer as ``cfg`` declares it (Adam, or SGD with optional momentum)."""
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(list(params), lr=cfg.lr, momentum=cfg.sgd_momentum)
    return torch.optim.Adam(list(params), lr=cfg.lr)


def derive_seed(*keys: int, bits: int = 32) -> int:
    """A ``bits``-bit seed from a tuple of ints, by numpy's SeedSequence: independent streams per (root seed, n, run
    seed, purpose, …). The one place seeds are derived in phase 2."""
    state = int(np.random.SeedSequence([k & 0xFFFFFFFF for k in keys]).generate_state(1)[0])
    return state & ((1 << bits) - 1)


def seeded_generator(*keys: int) -> torch.Generator:
    """A CPU generator seeded from a tuple of ints (independent streams per (seed, purpose, stage, …))."""
    return torch.Generator().manual_seed(derive_seed(*keys))
