"""Stage-0 alignment on the telephone chain (:mod:`orchestra.teamtr.align` is the generic part).

Probes are agent i's contexts ``[BOS, m_{i−1}]`` from fresh rollouts of the current team; the newcomer is a one-agent
:class:`~orchestra.teamtr.chain.ChainTeam` with its own base initialised from another seed (random, or warm started
to the noisy pass-through); team success before / after a direct swap / after the aligned swap is EXACT
(``exact_success_with`` on the policy matrices), as is the occupancy-weighted reverse KL.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from torch import Tensor

from orchestra.teamtr.align import (
    AlignConfig,
    AlignError,
    AlignPolicy,
    SwapShockReport,
    check_tokenizer_family,
    swap_shock,
)
from orchestra.teamtr.chain import (
    ChainConfig,
    ChainModelConfig,
    ChainTeam,
    Matrix,
    exact_success_with,
    message_logits,
    occupancies,
    own_step_kl,
    policy_matrices,
    policy_matrix,
    sample_rollouts,
    shifted_pass_through,
    warm_start,
)
from orchestra.teamtr.config import derive_seed, seeded_generator
from orchestra.teamtr.protocols import Metrics


@dataclass(frozen=True)
class ChainProbes:
    """Probe contexts of one chain agent: the inputs ``[BOS, m_{i−1}]`` it saw in sampled episodes (T = 1)."""

    input_ids: Tensor  # (N, T_ctx) long

    @property
    def mask(self) -> Tensor:
        return torch.ones(self.input_ids.shape[0], 1, dtype=torch.bool, device=self.input_ids.device)  # (N, 1)

    @property
    def size(self) -> int:
        return int(self.input_ids.shape[0])

    def select(self, rows: Tensor) -> ChainProbes:
        return ChainProbes(self.input_ids[rows.to(self.input_ids.device)])


def harvest_chain_probes(team: ChainTeam, agent: int, num: int, generator: torch.Generator) -> ChainProbes:
    """Contexts at ``agent``'s turn in ``num`` fresh episodes of the current team (its predecessor's sampled
    messages; occupancy as sampled)."""
    return ChainProbes(sample_rollouts(team, num, generator).input_ids[agent])


def _full_forward_logits(team: ChainTeam, agent: int, input_ids: Tensor) -> Tensor:
    """Logits over the V symbols from a full forward of the agent's model (B, T_ctx) → (B, V): no cached frozen
    hidden states, so gradients reach the base (``train_params="all"``) and a moved base is always seen."""
    model = team.select(agent)
    return model(input_ids=input_ids.to(team.device), use_cache=False).logits[:, -1, : team.vocab_size]


class ChainAgentPolicy:
    """Agent ``agent`` of a :class:`ChainTeam` as an :class:`AlignPolicy`: logits over the V symbols (N, 1, V).

    ``train_params="adapter"``: :meth:`parameters` = the agent's LoRA and logits come from ``chain.message_logits``
    (which may reuse the frozen base's hidden states); ``"all"``: every weight of the agent's model (a newcomer has
    its own) and logits from a full forward, since the base moves.
    """

    def __init__(self, team: ChainTeam, agent: int, train_params: Literal["adapter", "all"] = "adapter") -> None:
        team.model_of(agent)  # IndexError if out of range
        self.team, self.agent, self.train_params = team, agent, train_params

    def _logits(self, input_ids: Tensor) -> Tensor:
        if self.train_params == "all":
            return _full_forward_logits(self.team, self.agent, input_ids)
        return message_logits(self.team, self.agent, input_ids)  # (B, V)

    def logits(self, probes: ChainProbes) -> Tensor:
        return self._logits(probes.input_ids).unsqueeze(1)  # (N, 1, V)

    def parameters(self) -> list[torch.nn.Parameter]:
        if self.train_params == "adapter":
            return list(self.team.adapter_parameters(self.agent).values())
        return list(self.team.model_of(self.agent).parameters())  # base too (its own model: a newcomer)

    def policy_matrix(self) -> Matrix:
        """Exact P[x, y] = π(y | x) from one forward over the V contexts [BOS, x] → (V, V) float64."""
        if self.train_params == "adapter":
            return policy_matrix(self.team, self.agent)
        with torch.no_grad():
            logits = self._logits(self.team.contexts(torch.arange(self.team.vocab_size)))  # (V, V)
        return torch.softmax(logits.double(), dim=-1).cpu().numpy()


@dataclass(frozen=True)
class ChainSwapConfig:
    """What is swapped on the chain, and the newcomer built for it."""

    agent: int = 1  # the swapped worker (0-based)
    # random-init base + fresh LoRA; warm-started to the team's pass-through; or "mismatched": warm-started to a
    # competent agent of another convention (relays x as x + 1 mod V), which a direct swap breaks
    newcomer: Literal["random", "warm", "mismatched"] = "random"
    newcomer_seed: int | None = None  # the newcomer's init seed; None = derived from the team's seed and agent
    train_params: Literal["adapter", "all"] = "adapter"  # alignment trains the newcomer's LoRA only, or its whole model
    newcomer_model: ChainModelConfig | None = None  # the newcomer's base size; None = the incumbent's

    def __post_init__(self) -> None:
        if self.newcomer not in ("random", "warm", "mismatched") or self.train_params not in ("adapter", "all"):
            raise ValueError(f"newcomer must be random|warm|mismatched and train_params adapter|all, got {self}")


def newcomer_config(team_cfg: ChainConfig, swap: ChainSwapConfig) -> ChainConfig:
    """A one-agent chain config for the newcomer: the incumbent's vocabulary and LoRA layout, its own base (size
    ``newcomer_model`` or the incumbent's) initialised from another seed."""
    if not 0 <= swap.agent < team_cfg.n_agents:
        raise AlignError(f"agent {swap.agent} out of range for a chain of {team_cfg.n_agents} agents (0..)")
    seed = swap.newcomer_seed
    if seed is None:
        seed = derive_seed(team_cfg.seed, swap.agent, 7, bits=31)
    if seed == team_cfg.seed:
        raise AlignError(f"newcomer seed {seed} equals the team's: the newcomer would not be differently initialised")
    model = swap.newcomer_model or team_cfg.base_config(swap.agent)
    return dataclasses.replace(team_cfg, n_agents=1, shared_base=True, agent_models=(), model=model, seed=seed)


def build_chain_newcomer(team_cfg: ChainConfig, swap: ChainSwapConfig) -> ChainTeam:
    """The newcomer as a one-agent :class:`ChainTeam` (adapter ``agent_0``), warm started (its own seed, the team's
    ``warm_*`` knobs) to the noisy pass-through if ``swap.newcomer`` is ``warm``, to the shifted convention
    (:func:`~orchestra.teamtr.chain.shifted_pass_through`) if ``mismatched``."""
    newcomer = ChainTeam(newcomer_config(team_cfg, swap))
    if swap.newcomer == "warm":
        warm_start(newcomer)
    elif swap.newcomer == "mismatched":
        warm_start(newcomer, target=shifted_pass_through(team_cfg.vocab_size, team_cfg.warm_pass))
    return newcomer


def chain_swap_shock(
    team: ChainTeam,
    swap: ChainSwapConfig,
    cfg: AlignConfig,
    *,
    newcomer: ChainTeam | None = None,
    on_check: Callable[[Metrics], None] | None = None,
) -> SwapShockReport:
    """Stage 0 on the chain: harvest probes at ``swap.agent``'s turn from the current team (train and held-out from
    independent rollouts), swap in ``newcomer`` (default :func:`build_chain_newcomer`; agent 0 of that team), align,
    and report exact J before / direct / aligned (``exact_success_with`` on the policy matrices) plus the exact
    occupancy-weighted reverse KL E_{x∼d_i} KL(P_new(·|x) ‖ P_inc(·|x)) before and after. The team is not modified.
    """
    if not 0 <= swap.agent < team.n_agents:
        raise AlignError(f"agent {swap.agent} out of range for a chain of {team.n_agents} agents (0..)")
    newcomer = build_chain_newcomer(team.cfg, swap) if newcomer is None else newcomer
    check_tokenizer_family(
        team.vocab_size,
        newcomer.vocab_size,
        incumbent_name=f"chain agent {swap.agent} (V={team.vocab_size})",
        newcomer_name=f"chain newcomer (V={newcomer.vocab_size}, seed {newcomer.cfg.seed})",
    )
    train_probes = harvest_chain_probes(team, swap.agent, cfg.num_train_probes, seeded_generator(cfg.seed, 0))
    heldout_probes = harvest_chain_probes(team, swap.agent, cfg.num_heldout_probes, seeded_generator(cfg.seed, 1))
    incumbent = ChainAgentPolicy(team, swap.agent)
    new_policy = ChainAgentPolicy(newcomer, 0, swap.train_params)
    mats = policy_matrices(team)
    occupancy = occupancies(mats)[swap.agent]  # (V, V) joint (key, input)

    def success(policy: AlignPolicy[ChainProbes]) -> float:
        assert isinstance(policy, ChainAgentPolicy)
        return exact_success_with(mats, swap.agent, policy.policy_matrix())

    def diagnostics(policy: AlignPolicy[ChainProbes]) -> Metrics:
        assert isinstance(policy, ChainAgentPolicy)
        p_new = policy.policy_matrix()
        return {
            "kl/exact_occupancy_reverse": own_step_kl(occupancy, p_new, mats[swap.agent]),  # E_d KL(new‖inc)
            "agent/pass_probability": float(np.diag(p_new).mean()),
        }

    meta = {
        "team": "chain",
        "n_agents": team.n_agents,
        "vocab_size": team.vocab_size,
        "agent": swap.agent,
        "newcomer": swap.newcomer,
        "newcomer_seed": newcomer.cfg.seed,
        "train_params": swap.train_params,
        "incumbent_pass_probability": float(np.diag(mats[swap.agent]).mean()),
        "num_train_probes": train_probes.size,
        "num_heldout_probes": heldout_probes.size,
        "distinct_train_contexts": int(torch.unique(train_probes.input_ids, dim=0).shape[0]),
    }
    return swap_shock(
        incumbent,
        new_policy,
        train_probes,
        heldout_probes,
        cfg,
        success=success,
        diagnostics=diagnostics,
        on_check=on_check,
        meta=meta,
        incumbent_state=lambda: {
            f"agent_{i}/{k}": v for i in range(team.n_agents) for k, v in team.adapter_state(i).items()
        },
    )


__all__ = [
    "ChainAgentPolicy",
    "ChainProbes",
    "ChainSwapConfig",
    "build_chain_newcomer",
    "chain_swap_shock",
    "harvest_chain_probes",
    "newcomer_config",
]
