"""TeamTR (phase 2): fine-tune the workers of a team under a fixed conductor (DESIGN §5).

Pure-function layer: losses, advantages and KL estimators (:mod:`orchestra.teamtr.losses`) and credit
assignment (:mod:`orchestra.teamtr.credit`). Formulas: the design notes ``research/algorithms.md``.
"""

from __future__ import annotations

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
]
