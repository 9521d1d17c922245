"""Where a job's episodes are played, picked once from its :class:`~orchestra.runtime.session.RunOptions`: in this
process (:class:`~orchestra.runtime.player.LocalPlayer`) or on Ray actors (``--ray`` / ``--ray-address``:
:class:`~orchestra.runtime.distributed.RayPool`). A job asks for a player and never names Ray.

Lifetimes: :class:`Players` holds the Ray cluster for the whole job (one cluster for every team of an evaluation),
:meth:`Players.open` one team's player (its actors, which load that team's workers). Ray starts on the first call with
episodes to play, so a resumed job with nothing left starts no cluster and no actor.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence

from orchestra.runtime.distributed import RayOptions, RayPool, ray_cluster
from orchestra.runtime.player import EnginePlan, EpisodePlayer, LocalPlayer, Played
from orchestra.runtime.rollout import EpisodeJob, RolloutStats
from orchestra.runtime.session import RunOptions, Session
from trajectories import Episode, TrajectoryWriter


class Players:
    """The players of one job. A context manager: a Ray cluster it started is shut down on the way out."""

    def __init__(self, run: RunOptions) -> None:
        self.run = run
        self.ray = RayOptions.of(run)  # None: this process; the --ray-* options are checked here, before anything runs
        self._cluster = contextlib.ExitStack()
        self._connected = False

    def __enter__(self) -> Players:
        return self

    def __exit__(self, *exc: object) -> None:
        self._cluster.close()

    @contextlib.contextmanager
    def open(self, team: str, family: str | None, session: Session) -> Iterator[EpisodePlayer]:
        """The player of one team (``team`` and ``family`` as given, for the actors to load; ``session``, the same
        team loaded here)."""
        if self.ray is None:
            yield LocalPlayer(session, self.run)
            return
        opts = self.ray

        def start() -> RayPool:
            if not self._connected:
                self._cluster.enter_context(ray_cluster(opts))
                self._connected = True
            return RayPool(opts, team, family, self.run, title=session.team.name)

        player = _StartedOnFirstPlay(start)
        try:
            yield player
        finally:
            player.close()


class _StartedOnFirstPlay:
    """A Ray pool started by the first call that has episodes to play."""

    def __init__(self, start: Callable[[], RayPool]) -> None:
        self._start = start
        self._pool: RayPool | None = None

    def play(
        self,
        plan: EnginePlan,
        jobs: Sequence[EpisodeJob],
        writer: TrajectoryWriter,
        on_episode: Callable[[Episode], None],
        planned: int,
    ) -> Played:
        if self._pool is None:
            if not jobs:
                return Played([], RolloutStats(), {})
            self._pool = self._start()
        return self._pool.play(plan, jobs, writer, on_episode, planned)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()


__all__ = ["Players"]
