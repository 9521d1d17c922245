"""TeamTR (phase 2): fine-tune the workers of a team under a fixed conductor (docs/architecture.md §5; formulas:
docs/algorithms.md). Import what you use from its modules; this package re-exports nothing.

* the math, pure functions on tensors: ``losses`` (PPO-clip, GRPO / Dr. MAS advantages, HAPPO factor, KL estimators,
  adaptive KL coefficients) and ``credit`` (leave-one-out and Shapley credit); they import torch only;
* the trainer: ``config`` (``TeamTRConfig`` and its presets, seed derivation), ``protocols`` (what a team must
  offer), ``trainer`` (one loop for teamtr / naive / joint / joint_indep / happo), ``trust_region`` (the per-agent
  KL check and line search), ``checkpoint`` (run directories, resumable stage checkpoints);
* two teams that satisfy the protocol: the telephone-chain testbed (``chain``, ``chain_team``, ``lora``) and real
  LLM workers of a team file (``llm``, ``llm_rollout``, ``llm_models``);
* Stage-0 alignment: ``align`` (generic), ``align_chain``, ``align_llm``.

The experiments that compare its schemes live outside it, in :mod:`orchestra.experiments`.
"""
