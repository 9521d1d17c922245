"""The LLM freshness experiment's config: which team and trainer, how many replicate pairs and which held-out tasks,
composed with the real-LLM experiment's team and trainer (one source of each:
:data:`~orchestra.experiments.llm.config.LLM_EXPERIMENT_TEAM`,
:data:`~orchestra.experiments.llm.config.LLM_EXPERIMENT_TRAINER`)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Literal

from orchestra.experiments.freshness.config import branch_trainer
from orchestra.experiments.llm.config import LLM_EXPERIMENT_TEAM, LLM_EXPERIMENT_TRAINER, LLMExperimentConfig
from orchestra.teamtr.config import TeamTRConfig, derive_seed
from orchestra.teamtr.llm_config import LLMTeamConfig
from trajectories.rundir import config_json


@dataclass(frozen=True)
class LLMFreshnessConfig:
    """Every knob of the paired freshness experiment on the real-LLM team (``orchestra experiment freshness-llm``).

    A replicate pair is one team of ``team.workers`` (its own LoRA init and sampling salt): the upstream workers (all
    but the last; by default the solver) are updated in order on one stale batch (scheme naive), then the last worker
    (the critic) is updated from that state once per arm, and each arm's team is played greedily on the same held-out
    tasks with the same episode seeds (:mod:`~orchestra.experiments.freshness.llm_run`)."""

    # the team, conductor, model and sampling; its last trainable worker is the one the arms update
    team: LLMTeamConfig = field(default_factory=lambda: LLM_EXPERIMENT_TEAM)
    # batch, epochs, trust region: the LLM experiment's; lr: the one its validation grid chose for naive, the scheme
    # the branch state is trained with (docs/results/llm_tuning.md)
    trainer: TeamTRConfig = field(
        default_factory=lambda: replace(LLM_EXPERIMENT_TRAINER, lr=LLMExperimentConfig().lr_for("naive"))
    )
    # replicate pairs attempted; each has its own team init, stale batch and null batches. About one in five does not
    # pose the question (the solver's batch without signal: its arms are not played), so 40 leave about 30 that do
    pairs: int = 40
    eval_tasks: int = 60  # held-out tasks every arm is played on (the same tasks and episode seeds in every arm, pair)
    eval_split: Literal["validation", "test"] = "test"  # tune settings on validation; report test once
    # two more stale arms, each on its own independent batch of the stage-start team: the same procedure with
    # another seed, so their difference is 0 in expectation (the check of the statistics)
    null_check: bool = True
    seed: int = 0  # root seed: team, trainer and null-batch seeds derive from (seed, pair), held-out tasks from seed

    def __post_init__(self) -> None:
        if self.pairs < 2:
            raise ValueError(f"pairs must be ≥ 2 (a CI over replicates), got {self.pairs}")
        if self.eval_tasks < 1:
            raise ValueError(f"eval_tasks must be ≥ 1, got {self.eval_tasks}")
        if self.eval_split not in ("validation", "test"):
            raise ValueError(f"eval_split: expected validation or test, got {self.eval_split!r}")
        if len(self.team.workers) < 2:
            raise ValueError(
                f"team.workers must name ≥ 2 trainable workers (upstream ones and the last), got {self.team.workers}"
            )
        if self.trainer.batch_size % self.team.group_size:
            raise ValueError(
                f"trainer.batch_size {self.trainer.batch_size} must be a multiple of team.group_size "
                f"{self.team.group_size} (G episodes per task)"
            )

    @classmethod
    def smoke(cls, **overrides: Any) -> LLMFreshnessConfig:
        """A tiny preset for tests: the real-LLM experiment's smoke team and trainer (the random-init tiny model,
        B = 4, G = 2, lr 10⁻², 2 epochs × 2 minibatches), 2 pairs, 4 held-out tasks (seconds on one thread). Its
        figures mean nothing; it exercises every path of the full experiment."""
        smoke = LLMExperimentConfig.smoke()
        return replace(cls(team=smoke.team, trainer=smoke.trainer, pairs=2, eval_tasks=4), **overrides)

    @property
    def updated(self) -> int:
        """The worker updated in the arms: the last trainable one."""
        return len(self.team.workers) - 1

    def to_json(self) -> dict[str, Any]:
        """The config as plain JSON types, as written to ``config.json``."""
        return config_json(self)


def team_config(cfg: LLMFreshnessConfig, pair: int) -> LLMTeamConfig:
    """The team of pair ``pair``: its own LoRA init and sampling salt (no per-stage evaluation of its own)."""
    return replace(cfg.team, seed=derive_seed(cfg.seed, pair, 0, bits=31), eval_tasks=0)


def trainer_config(cfg: LLMFreshnessConfig, pair: int) -> TeamTRConfig:
    """The trainer of pair ``pair``: naive (one stale batch for the stage), the fixed order 0..n−1, one stage, no
    per-stage evaluation (the arms are played by the experiment), its seed from (seed, pair)."""
    return branch_trainer(cfg.trainer, derive_seed(cfg.seed, pair, 1, bits=31))


__all__ = ["LLMFreshnessConfig", "team_config", "trainer_config"]
