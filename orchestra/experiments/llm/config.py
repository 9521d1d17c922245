"""The real-LLM fine-tuning experiment's config: which team, schemes, seeds and held-out tasks, composed with the
``TeamTRConfig`` and ``LLMTeamConfig`` every run trains with (one source each: :data:`LLM_EXPERIMENT_TRAINER`,
:data:`LLM_EXPERIMENT_TEAM`).

Three readings. Two accountings, as in the telephone-chain experiment (``orchestra experiment chain``): *equal stages* reads every scheme
after ``trainer.num_stages`` stages (every worker updated that many times; teamtr has then sampled n× the episodes of
the schemes that sample one batch per stage); *equal episodes* reads the one-batch schemes after n × that many stages,
when they have sampled as many episodes as teamtr (``extend_for_episodes``). Those have then also updated every worker
n× as often, so a third reading separates the two: *equal updates at n × the stages* (``equal_updates_control``), where
teamtr runs n × ``num_stages`` as well and every scheme is read there (teamtr having sampled n× the episodes)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from orchestra.experiments.harness import episode_stage
from orchestra.teamtr.config import SCHEMES, TeamTRConfig, derive_seed
from orchestra.teamtr.llm_config import LLMTeamConfig
from trajectories.rundir import config_json

# the untrained team, evaluated at stage 0 and compared with every scheme
FROZEN = "frozen"

# The experiment's team: the arithmetic team's solver and critic, both trainable, under a fixed pipeline in which both
# speak in every episode: the solver solves, the calculator checks its arithmetic (a FAIL states the true value), the
# critic reviews, the solver revises, the calculator checks again. One-step word problems (difficulty 1), where the
# frozen team's held-out success lies in the 20-60% band the comparison needs (22.5% on 40 validation tasks when the
# setting was chosen; docs/results/finetune.md quotes the test figure).
LLM_EXPERIMENT_TEAM = LLMTeamConfig(
    team="arithmetic",
    difficulty=1,
    conductor="pipeline",
    pipeline=("solver:solve", "calculator:check", "critic:check", "solver:revise", "calculator:check"),
    workers=("solver", "critic"),
    max_tokens=48,
    group_size=4,
    reward="success",
    max_batch_size=32,
    num_envs=32,
    temperature=0.7,
)
# its trainer: 16 episodes per batch (4 tasks × G = 4), 2 epochs × 2 minibatches (so an update takes up to 4 optimizer
# steps: the ratio leaves 1 after the first, the PPO clip and the trust region can act; one epoch of one minibatch made
# every update a single step at ratio 1, where neither ever acted), and a backtracking trust region of δ = 0.002 per
# token that shortens or reverts the steps that move a worker too far; π_cur's log-probs are the sampler's. The
# per-scheme learning rates come from one validation protocol for every scheme (``orchestra experiment llm-tune``,
# docs/results/llm_tuning.md), run at δ = 0.005 (:data:`TUNING_DELTA`). δ is not tuned: it is set so that the
# mechanism under test acts at the chosen learning rate. At lr 10⁻⁴ the trust region of δ = 0.005 acted in none of
# teamtr's tuning updates, and the solver's first update of the comparison (seed 0) moved it by 0.0027 per token
# (k3), 0.54 δ; δ = 0.002 puts that update above the budget, so the trust region binds on a share of the updates
# (measured per scheme in updates.csv and the report) without clamping every one of them. It is the same for every
# scheme; lr 10⁻³ with δ = 0.02 at temperature 1 collapsed the sampled success to 0 within three stages
# (docs/results/finetune-v1-summary.md).
LLM_EXPERIMENT_TRAINER = TeamTRConfig(
    num_stages=4, batch_size=16, num_epochs=2, num_minibatches=2, lr=3e-4, delta=0.002, old_logprobs="behaviour"
)
# the δ the learning-rate grid ran at (docs/results/llm_tuning_runs/config.json): its published tables stay regenerable
TUNING_DELTA = 0.005
# the learning rate per scheme that the validation grid 10⁻⁴ / 3·10⁻⁴ / 10⁻³ chose (``orchestra experiment llm-tune``,
# docs/results/llm_tuning.md): 10⁻⁴ for every scheme; trainer.lr (3·10⁻⁴) is what any other scheme trains with
TUNED_LRS: tuple[str, ...] = ("teamtr=0.0001", "naive=0.0001", "stale_indep=0.0001")


@dataclass(frozen=True)
class LLMExperimentConfig:
    """Every knob of ``orchestra experiment llm`` (defaults: the full CPU experiment).

    Per (scheme, seed) run the experiment sets the team's ``seed`` (LoRA init, sampling salt) and the trainer's
    ``seed`` from (``seed``, run seed) only, so every scheme of a seed starts from the same adapters and draws the
    same first batch (paired), the trainer's ``scheme`` and its ``num_stages`` (:meth:`stages_for`). Every
    evaluation plays the same ``eval_tasks`` tasks of ``eval_split`` with the same episode seeds (paired over tasks)."""

    team: LLMTeamConfig = field(default_factory=lambda: LLM_EXPERIMENT_TEAM)  # the team, conductor, model and sampling
    trainer: TeamTRConfig = field(default_factory=lambda: LLM_EXPERIMENT_TRAINER)  # the trainer of every run
    # trainer schemes (the frozen team is always in): teamtr, naive (one batch per stage, every worker updated on it)
    # and stale_indep (n batches per stage like teamtr, each sampled before the stage's first update: teamtr without
    # resampling), the issue-34 comparison; joint, happo and joint_indep may be added
    schemes: tuple[str, ...] = ("teamtr", "naive", "stale_indep")
    # seeds per scheme; seed s gives every scheme the same init and first batch. 8: a run is the unit of the verdicts
    # (orchestra.experiments.verdicts), and the null check splits naive's seeds in halves of 4
    seeds: int = 8
    # held-out tasks of every evaluation (the same tasks and episode seeds every time): all 133 distinct one-step word
    # problems of the test split. The issue asks for 200; mixing in level 2 would give them, but the frozen team then
    # solves 12.5% of 80 validation tasks (level 1: 16.7% of 36, level 2: 9.1% of 44), below the 20-60% band the
    # comparison needs, and widening level 1 would change the phase-1 protocol's tasks
    eval_tasks: int = 133
    eval_split: Literal["validation", "test"] = "test"  # tune settings on validation; report test once
    eval_every: int = 0  # stages between extra held-out evaluations (learning curves); 0 = the accountings' only
    extend_for_episodes: bool = True  # one-batch schemes run n × the stages (the equal-episodes accounting)
    # the schemes sampling n batches per stage (teamtr) run n × the stages too, and every scheme is also read there
    # with equal updates (teamtr having sampled n× the episodes): a second equal-updates reading, later in training,
    # beside the equal-stages one (which already compares every scheme at equal updates, teamtr having sampled n× the
    # episodes); needs extend_for_episodes. Off by default: with the multi-step updates of LLM_EXPERIMENT_TRAINER an
    # update costs ~5-15 minutes on one core (2-4 forward-backward passes over 16 episodes' prompts, plus one forward
    # per backtracking step), so running teamtr and stale_indep to n × num_stages would double 16 of the 24 runs
    equal_updates_control: bool = False
    # per-scheme learning rates overriding trainer.lr, as SCHEME=LR (e.g. the choice of ``orchestra experiment
    # llm-tune``, whose selection.json lists them); a scheme not named trains with trainer.lr
    lr_by_scheme: tuple[str, ...] = TUNED_LRS
    seed: int = 0  # root seed: run seeds, held-out tasks and their episode seeds derive from it

    def __post_init__(self) -> None:
        bad = [s for s in self.schemes if s not in SCHEMES]
        if not self.schemes or bad or len(set(self.schemes)) != len(self.schemes):
            raise ValueError(f"schemes: expected distinct entries of {SCHEMES}, got {list(self.schemes)}")
        self.scheme_lrs()  # refuses a malformed lr_by_scheme
        if self.seeds < 1 or self.eval_tasks < 1 or self.eval_every < 0 or self.trainer.num_stages < 1:
            raise ValueError("need seeds ≥ 1, eval_tasks ≥ 1, eval_every ≥ 0 and trainer.num_stages ≥ 1")
        if self.eval_split not in ("validation", "test"):
            raise ValueError(f"eval_split: expected validation or test, got {self.eval_split!r}")
        if self.trainer.batch_size % self.team.group_size:
            raise ValueError(
                f"trainer.batch_size {self.trainer.batch_size} must be a multiple of team.group_size "
                f"{self.team.group_size} (G episodes per task)"
            )

    @property
    def n_agents(self) -> int:
        return len(self.team.workers)

    @property
    def num_stages(self) -> int:
        """Stages of the equal-stages accounting: ``trainer.num_stages``."""
        return self.trainer.num_stages

    @property
    def long_stages(self) -> int | None:
        """Stages of the equal-updates control (n × ``num_stages``); None when it is off."""
        on = self.extend_for_episodes and self.equal_updates_control
        return self.n_agents * self.num_stages if on else None

    def episode_stage(self, scheme: str) -> int:
        """The stage at which a scheme has sampled as many episodes as teamtr at ``num_stages``: ``num_stages`` for
        the schemes that sample n batches per stage (teamtr, stale_indep), n × that for the others with
        ``extend_for_episodes``."""
        return episode_stage(scheme, self.n_agents, self.num_stages, self.extend_for_episodes)

    def stages_for(self, scheme: str) -> int:
        """Stages a scheme trains for: its :meth:`episode_stage`, or n × ``num_stages`` for every scheme with the
        equal-updates control."""
        return max(self.episode_stage(scheme), self.long_stages or 0)

    def eval_stages(self, scheme: str) -> tuple[int, ...]:
        """The stages after which a scheme's team is evaluated: 0 (the frozen team), the accountings' stages and
        every ``eval_every`` (when > 0)."""
        last = self.stages_for(scheme)
        extra = range(self.eval_every, last + 1, self.eval_every) if self.eval_every else ()
        stages = {0, self.num_stages, self.episode_stage(scheme), last, *extra}
        return tuple(sorted(s for s in stages if s <= last))

    @classmethod
    def smoke(cls, **overrides: Any) -> LLMExperimentConfig:
        """A tiny preset for tests: the random-init tiny model, teamtr vs naive, 1 seed, 2 stages, 6 held-out tasks
        (under a minute on 2 cores). Its figures mean nothing; it exercises every path of the full experiment."""
        team = replace(
            LLM_EXPERIMENT_TEAM,
            model="tiny",
            max_tokens=6,
            group_size=2,
            max_batch_size=8,
            num_envs=8,
            forward_batch_size=8,
        )
        trainer = replace(LLM_EXPERIMENT_TRAINER, num_stages=2, batch_size=4, num_epochs=2, num_minibatches=2, lr=1e-2)
        base = cls(
            team=team,
            trainer=trainer,
            schemes=("teamtr", "naive"),
            seeds=1,
            eval_tasks=6,
            eval_every=1,
            equal_updates_control=True,  # off in the full experiment (its cost), exercised here
            lr_by_scheme=(),
        )
        return replace(base, **overrides)

    def scheme_lrs(self) -> dict[str, float]:
        """``lr_by_scheme`` as {scheme: lr}.

        Raises:
            ValueError: an entry that is not SCHEME=LR with a scheme of SCHEMES and a positive LR, or a scheme twice.
        """
        out: dict[str, float] = {}
        for entry in self.lr_by_scheme:
            scheme, _, value = entry.partition("=")
            try:
                lr = float(value)
            except ValueError:
                lr = math.nan
            if scheme not in SCHEMES or scheme in out or not lr > 0:
                raise ValueError(f"lr_by_scheme: expected distinct SCHEME=LR entries (LR > 0), got {entry!r}")
            out[scheme] = lr
        return out

    def lr_for(self, scheme: str) -> float:
        """The learning rate scheme ``scheme`` trains with: its ``lr_by_scheme`` entry, else ``trainer.lr``."""
        return self.scheme_lrs().get(scheme, self.trainer.lr)

    def team_config(self, seed: int) -> LLMTeamConfig:
        """The team of run seed ``seed`` (every scheme shares it): its own LoRA init and sampling salt."""
        return replace(self.team, seed=derive_seed(self.seed, seed, 0, bits=31), eval_tasks=0)

    def trainer_config(self, scheme: str, seed: int, num_stages: int | None = None) -> TeamTRConfig:
        """The trainer of run (scheme, seed), trained up to ``num_stages`` (default: all its stages)."""
        return replace(
            self.trainer,
            scheme=scheme,  # type: ignore[arg-type]
            lr=self.lr_for(scheme),
            num_stages=self.stages_for(scheme) if num_stages is None else num_stages,
            seed=derive_seed(self.seed, seed, 1, bits=31),
            evaluate=False,
        )

    def to_json(self) -> dict[str, Any]:
        """The config as plain JSON types (tuples → lists), as written to ``config.json``."""
        return config_json(self)


__all__ = [
    "FROZEN",
    "LLM_EXPERIMENT_TEAM",
    "LLM_EXPERIMENT_TRAINER",
    "TUNED_LRS",
    "TUNING_DELTA",
    "LLMExperimentConfig",
]
