"""The player of episodes: one seam between a job that plans and writes episodes and whatever plays them.

A job (``orchestra record``, ``evaluate``, phase 1) plans :class:`~orchestra.runtime.rollout.EpisodeJob` s per
conductor and stays the single writer of its trajectory file; an :class:`EpisodePlayer` plays them and hands each
episode over the moment it ends. :class:`LocalPlayer` plays in this process; :class:`~orchestra.runtime.distributed.
RayPool` on Ray actors; :class:`~orchestra.runtime.players.Players` picks one from the run options. What a player
needs to build one conductor's engine is an :class:`EnginePlan`, the same in this process and in every actor.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import NamedTuple, Protocol

from orchestra.runtime.conductors import conductor_factory, split_spec
from orchestra.runtime.rollout import EpisodeJob, RolloutEngine, RolloutStats
from orchestra.runtime.session import RunOptions, Session
from policies.base import ConductorPolicy
from policies.conductors.exploration import EpsilonGreedyConductor
from trajectories import Episode, TrajectoryWriter


def _exploring(base: Callable[[], ConductorPolicy], epsilon: float, seed: int) -> ConductorPolicy:
    return EpsilonGreedyConductor(base(), epsilon, seed)


def make_conductor(
    spec: str, session: Session, seed: int, epsilon: float = 0.0
) -> tuple[Callable[[], ConductorPolicy], Callable[[], ConductorPolicy]]:
    """(the conductor's factory, the base factory before ε-exploration) of a ``NAME`` or ``LABEL:CHECKPOINT`` spec;
    the same in the driver and in every actor."""
    base = conductor_factory(spec, session.team, seed, session.backends())
    if epsilon > 0:
        return partial(_exploring, base, epsilon, seed), base
    return base, base


@dataclass(frozen=True)
class EnginePlan:
    """What a player needs to build the engine of one conductor: everything but the workers, which it owns."""

    spec: str  # conductor NAME or LABEL:CHECKPOINT
    name: str  # the recorded conductor name (with +epsE when exploring)
    run_id: str
    seed: int
    epsilon: float = 0.0
    perturb: tuple[str, ...] = ()

    def engine(self, session: Session, run: RunOptions) -> tuple[RolloutEngine, Callable[[], ConductorPolicy]]:
        """The engine, and the conductor's base factory (its instances share an LLM conductor's reply counters)."""
        factory, base = make_conductor(self.spec, session, self.seed, self.epsilon)
        engine = RolloutEngine(
            session.team,
            session.family,
            session.workers,
            factory,
            conductor_name=self.name,
            conductor_checkpoint=split_spec(self.spec)[1],
            run_id=self.run_id,
            num_envs=run.num_envs,
            progress=False,
            episode_retries=run.episode_retries,
            perturb=self.perturb,
            perturb_seed=self.seed,
        )
        return engine, base


class Played(NamedTuple):
    """What one :meth:`EpisodePlayer.play` call played."""

    episodes: list[Episode]  # in the order they were written
    stats: RolloutStats  # this call's rollout counts (turns, tokens, faults, wall time)
    counters: dict[str, float]  # an LLM conductor's reply counts (``conductor/…``); empty for any other conductor


class EpisodePlayer(Protocol):
    """Plays one conductor's planned episodes; each is written by ``writer`` (the job's single writer) and passed to
    ``on_episode`` the moment it ends, so a killed job loses at most the episodes in flight."""

    def play(
        self,
        plan: EnginePlan,
        jobs: Sequence[EpisodeJob],
        writer: TrajectoryWriter,
        on_episode: Callable[[Episode], None],
        planned: int,
    ) -> Played:
        """Play ``jobs``: the ones left of the ``planned`` episodes of ``plan`` (a person is told where the
        recording stands)."""
        ...


class LocalPlayer:
    """Episodes played in this process, one engine per call, on the session's workers (loaded here, so a bad model
    path fails before a job opens any file)."""

    def __init__(self, session: Session, run: RunOptions) -> None:
        self.session, self.run = session, run
        _ = session.workers

    def play(
        self,
        plan: EnginePlan,
        jobs: Sequence[EpisodeJob],
        writer: TrajectoryWriter,
        on_episode: Callable[[Episode], None],
        planned: int,
    ) -> Played:
        engine, base = plan.engine(self.session, self.run)
        tell = getattr(base(), "plan", None)  # a person is told where the recording stands (HumanConductor)
        if tell is not None:
            tell(planned - len(jobs), planned)
        engine.progress = self.run.progress
        got = engine.run(jobs, writer=writer, on_episode=on_episode)
        counters = getattr(base(), "counters", None)
        return Played(got, engine.stats, dict(counters()) if counters is not None else {})


__all__ = ["EnginePlan", "EpisodePlayer", "LocalPlayer", "Played", "make_conductor"]
