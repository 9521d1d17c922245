"""TeamTR (phase 2): fine-tune the workers of a team under a fixed conductor (DESIGN §5).

Pure-function layer: losses, advantages and KL estimators (:mod:`orchestra.teamtr.losses`) and credit
assignment (:mod:`orchestra.teamtr.credit`). Formulas: the design notes ``research/algorithms.md``.
Testbed: the telephone chain of tiny LoRA LMs with exact evaluation (:mod:`orchestra.teamtr.chain`), re-exported
lazily so that importing the pure layer does not import transformers and peft.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

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

if TYPE_CHECKING:
    from orchestra.teamtr.chain import (
        ChainBatch,
        ChainConfig,
        ChainModelConfig,
        ChainTeam,
        WarmStartReport,
        agent_logits,
        agent_logprobs,
        drift_b,
        drift_b_terms,
        drift_d,
        drift_d_terms,
        exact_success,
        exact_success_with,
        message_logits,
        noisy_pass_through,
        occupancies,
        own_step_kl,
        own_step_terms,
        own_step_tv,
        pass_probabilities,
        policy_matrices,
        policy_matrix,
        row_tv,
        sample_rollouts,
        stale_mismatch_terms,
        team_success,
        tv_distance,
        warm_start,
    )

_CHAIN = frozenset(
    {
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
    }
)


def __getattr__(name: str) -> Any:
    """Lazy re-export of :mod:`orchestra.teamtr.chain` (PEP 562): it imports transformers and peft."""
    if name in _CHAIN:
        return getattr(importlib.import_module("orchestra.teamtr.chain"), name)
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "AGGREGATIONS",
    "DROP",
    "ChainBatch",
    "ChainConfig",
    "ChainModelConfig",
    "ChainTeam",
    "ShapleyEstimate",
    "WarmStartReport",
    "adaptive_kl_coef_lagrangian",
    "adaptive_kl_coef_ppo",
    "adaptive_kl_coef_proportional",
    "agent_logits",
    "agent_logprobs",
    "agentwise_normalise",
    "aggregate_loss",
    "counterfactual_value",
    "drift_b",
    "drift_b_terms",
    "drift_d",
    "drift_d_terms",
    "exact_success",
    "exact_success_with",
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
    "message_logits",
    "noisy_pass_through",
    "occupancies",
    "own_step_kl",
    "own_step_terms",
    "own_step_tv",
    "pass_probabilities",
    "policy_matrices",
    "policy_matrix",
    "ppo_clip_loss",
    "row_tv",
    "sample_rollouts",
    "sequence_logratio",
    "shapley_exact",
    "shapley_monte_carlo",
    "stale_mismatch_terms",
    "team_success",
    "tv_distance",
    "warm_start",
]

# ----------------------------------------------------------------------------------------------------------------
# the TeamTR trainer (torch only) and the chain's trainer adapter (imports transformers and peft): lazy as well, so
# that importing the pure layer stays cheap.

if TYPE_CHECKING:
    from orchestra.teamtr.checkpoint import Checkpoint, CheckpointError, ConfigMismatchError, RunDirectory
    from orchestra.teamtr.team import ChainRollout, ChainTrainable
    from orchestra.teamtr.trainer import (
        SCHEMES,
        AgentState,
        RolloutBatch,
        TeamTRConfig,
        TrainableTeam,
        TrainHooks,
        TrainLog,
        UpdateInputs,
        compute_advantages,
        team_loss,
        train,
        update_agents,
    )

_TRAINER = (
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
)
_LAZY: dict[str, str] = {name: "orchestra.teamtr.trainer" for name in _TRAINER} | {
    "ChainRollout": "orchestra.teamtr.team",
    "ChainTrainable": "orchestra.teamtr.team",
    "Checkpoint": "orchestra.teamtr.checkpoint",
    "CheckpointError": "orchestra.teamtr.checkpoint",
    "ConfigMismatchError": "orchestra.teamtr.checkpoint",
    "RunDirectory": "orchestra.teamtr.checkpoint",
}
__all__ += [
    "SCHEMES",
    "AgentState",
    "ChainRollout",
    "ChainTrainable",
    "Checkpoint",
    "CheckpointError",
    "ConfigMismatchError",
    "RolloutBatch",
    "RunDirectory",
    "TeamTRConfig",
    "TrainHooks",
    "TrainLog",
    "TrainableTeam",
    "UpdateInputs",
    "compute_advantages",
    "team_loss",
    "train",
    "update_agents",
]

# ----------------------------------------------------------------------------------------------------------------
# the telephone-chain benchmark (imports transformers, peft and matplotlib): lazy as well.

if TYPE_CHECKING:
    from orchestra.teamtr.bench import (
        BenchConfig,
        equal_episode_stage,
        fit_alpha,
        regression_fraction,
        run_bench,
    )

_BENCH = ("BenchConfig", "equal_episode_stage", "fit_alpha", "regression_fraction", "run_bench")
_LAZY.update({name: "orchestra.teamtr.bench" for name in _BENCH})
__all__ += ["BenchConfig", "equal_episode_stage", "fit_alpha", "regression_fraction", "run_bench"]
