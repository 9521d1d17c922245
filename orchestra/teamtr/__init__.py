"""TeamTR (phase 2): fine-tune the workers of a team under a fixed conductor (DESIGN §5).

Pure-function layer, imported eagerly: losses, advantages and KL estimators (:mod:`orchestra.teamtr.losses`) and
credit assignment (:mod:`orchestra.teamtr.credit`). Formulas: the design notes ``research/algorithms.md``.
Re-exported lazily (PEP 562), so that importing the pure layer imports neither transformers nor peft: the
telephone-chain testbed (:mod:`~orchestra.teamtr.chain`), the trainer (:mod:`~orchestra.teamtr.trainer`), the
chain as a trainable team (:mod:`~orchestra.teamtr.team`), checkpoints (:mod:`~orchestra.teamtr.checkpoint`), the
benchmark (:mod:`~orchestra.teamtr.bench`), Stage-0 alignment (:mod:`~orchestra.teamtr.align`, generic, and
:mod:`~orchestra.teamtr.align_chain`, :mod:`~orchestra.teamtr.align_llm`) and the real-LLM team (:mod:`~orchestra.teamtr.llm`).
"""

from __future__ import annotations

import importlib
from typing import Any

from orchestra.teamtr.credit import (
    DROP,
    ShapleyEstimate,
    counterfactual_value,
    leave_one_out_credit,
    shapley_exact,
    shapley_monte_carlo,
)
from orchestra.teamtr.losses import (
    AGGREGATIONS,
    adaptive_kl_coef_lagrangian,
    adaptive_kl_coef_ppo,
    adaptive_kl_coef_proportional,
    agentwise_normalise,
    aggregate_loss,
    grpo_advantages,
    happo_factor,
    informative_groups,
    kl_exact,
    kl_exact_per_token,
    kl_k1,
    kl_k2,
    kl_k3,
    kl_swapped_k3,
    masked_mean,
    ppo_clip_loss,
    sequence_logratio,
)

_LAZY_MODULES: dict[str, tuple[str, ...]] = {
    "orchestra.teamtr.chain": (
        "ChainBatch",
        "ChainConfig",
        "ChainModelConfig",
        "ChainTeam",
        "WarmStartReport",
        "agent_logits",
        "agent_logprobs",
        "drift_b",
        "drift_b_terms",
        "drift_d",
        "drift_d_terms",
        "exact_success",
        "exact_success_with",
        "message_logits",
        "noisy_pass_through",
        "occupancies",
        "own_step_kl",
        "own_step_terms",
        "own_step_tv",
        "pass_probabilities",
        "policy_matrices",
        "policy_matrix",
        "row_tv",
        "sample_rollouts",
        "stale_mismatch_terms",
        "team_success",
        "tv_distance",
        "warm_start",
    ),
    "orchestra.teamtr.trainer": (
        "SCHEMES",
        "AgentState",
        "RolloutBatch",
        "TeamTRConfig",
        "TrainHooks",
        "TrainLog",
        "TrainableTeam",
        "UpdateInputs",
        "compute_advantages",
        "team_loss",
        "train",
        "update_agents",
    ),
    "orchestra.teamtr.team": ("ChainRollout", "ChainTrainable"),
    "orchestra.teamtr.checkpoint": ("Checkpoint", "CheckpointError", "ConfigMismatchError", "RunDirectory"),
    "orchestra.teamtr.bench": (
        "BenchConfig",
        "acceptance_checks",
        "equal_episode_stage",
        "fit_alpha",
        "regression_fraction",
        "run_bench",
        "trust_counts",
    ),
    "orchestra.teamtr.align": (
        "AlignConfig",
        "AlignError",
        "AlignReport",
        "SwapShockReport",
        "align",
        "check_tokenizer_family",
        "reverse_kl_loss",
        "swap_shock",
    ),
    "orchestra.teamtr.align_chain": ("ChainSwapConfig", "build_chain_newcomer", "chain_swap_shock"),
    "orchestra.teamtr.llm": ("LLMRollout", "LLMTeam", "LLMTeamConfig", "LLMTeamError", "Turn"),
    "orchestra.teamtr.align_llm": ("LLMProbes", "LLMSwapConfig", "LLMWorkerPolicy", "llm_swap_shock"),
}
_LAZY: dict[str, str] = {name: module for module, names in _LAZY_MODULES.items() for name in names}


def __getattr__(name: str) -> Any:
    """Lazy re-exports (PEP 562): these modules import transformers, peft or matplotlib."""
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "AGGREGATIONS",
    "DROP",
    "ShapleyEstimate",
    "adaptive_kl_coef_lagrangian",
    "adaptive_kl_coef_ppo",
    "adaptive_kl_coef_proportional",
    "agentwise_normalise",
    "aggregate_loss",
    "counterfactual_value",
    "grpo_advantages",
    "happo_factor",
    "informative_groups",
    "kl_exact",
    "kl_exact_per_token",
    "kl_k1",
    "kl_k2",
    "kl_k3",
    "kl_swapped_k3",
    "leave_one_out_credit",
    "masked_mean",
    "ppo_clip_loss",
    "sequence_logratio",
    "shapley_exact",
    "shapley_monte_carlo",
    *_LAZY,
]
