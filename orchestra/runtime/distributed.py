"""Ray-distributed rollouts: actors play the episodes, the driver writes them.

``orchestra record|evaluate --ray`` (a local cluster) or ``--ray-address ADDR`` (an existing one) hands the planned
:class:`~orchestra.runtime.rollout.EpisodeJob` s to a pool of :class:`RolloutActor` s. Each actor loads its own
:class:`~orchestra.runtime.session.Session` (team file, task family, workers and their backends, response cache) and
plays chunks of jobs with its own :class:`~orchestra.runtime.rollout.RolloutEngine`, so the engine's batching across
envs works inside each actor as it does in one process. The driver stays the single writer: every returned episode is
written (flush + fsync) the moment its chunk comes back, and ``--resume`` skips the ids already on disk, so a killed
driver loses at most the chunks in flight and never writes an episode twice.

Equality with the single-process run: an episode depends only on its job (task, episode seed) and on what its
workers reply, so the set of episodes is the single-process run's wherever the replies are the same for the same
request: tools, scripted workers, the response cache, llama.cpp's serial path (``--serial``), greedy HTTP servers.
llama.cpp's batched path rounds a turn differently in another batch composition (docs/recording.md, "Batched decoding"), and a
different chunking is a different composition.

CPU threads: each actor reserves ``actor_cpus`` of Ray's CPUs and runs its native libraries on that many threads
(``OMP_NUM_THREADS``, which torch and :func:`orchestra.backends.llamacpp.physical_cores` honour), so two actors on a
two-core machine do not each start one thread per core.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from tqdm import tqdm

from orchestra.runtime.player import EnginePlan, Played
from orchestra.runtime.rollout import EpisodeJob, RolloutEngine, RolloutStats
from orchestra.runtime.session import RunOptions, Session
from policies.base import ConductorPolicy
from trajectories import Episode, TrajectoryWriter


class RayRolloutError(RuntimeError):
    """Ray could not be reached, or an actor failed; the message says what to do (the episodes written are kept)."""


class RolloutActor:
    """One rollout process: its own session (workers, backends, cache connection) and one engine per conductor."""

    def __init__(self, team: str, family: str | None, run: RunOptions) -> None:
        self.run = run
        self.session = Session.of(team, family, run)
        self.engines: dict[EnginePlan, RolloutEngine] = {}
        self.bases: dict[EnginePlan, Callable[[], ConductorPolicy]] = {}

    def play(self, plan: EnginePlan, jobs: Sequence[EpisodeJob]) -> Played:
        """The episodes of ``jobs``, this call's rollout counts, and the conductor's reply counters so far (an LLM
        conductor's; cumulative over this actor's calls)."""
        engine = self.engines.get(plan)
        if engine is None:
            engine, self.bases[plan] = plan.engine(self.session, self.run)
            self.engines[plan] = engine
        engine.stats = RolloutStats()  # this call's counts
        episodes = engine.run(jobs)
        counters = getattr(self.bases[plan](), "counters", None)
        return Played(episodes, engine.stats, dict(counters()) if counters is not None else {})

    def ready(self) -> str:
        """The node this actor runs on (a cheap call that waits for the constructor)."""
        import socket

        return socket.gethostname()


@dataclass(frozen=True)
class RayOptions:
    """Where Ray rollouts run: taken from :class:`~orchestra.runtime.session.RunOptions`."""

    address: str | None  # None = start a local cluster
    actors: int
    actor_cpus: float

    @classmethod
    def of(cls, run: RunOptions) -> RayOptions | None:
        if not (run.ray or run.ray_address):
            return None
        if run.ray_actors < 1:
            raise ValueError(f"--ray-actors: expected an int >= 1, got {run.ray_actors}")
        if run.ray_actor_cpus <= 0:
            raise ValueError(f"--ray-actor-cpus: expected a number > 0, got {run.ray_actor_cpus}")
        return cls(run.ray_address, run.ray_actors, run.ray_actor_cpus)


def _import_ray() -> Any:
    try:
        import ray
    except ImportError as e:  # pragma: no cover - ray is a declared dependency
        raise RayRolloutError("--ray needs the ray package: pip install 'ray==2.60.0'") from e
    return ray


@contextlib.contextmanager
def ray_cluster(opts: RayOptions) -> Iterator[Any]:
    """Ray, connected: to ``opts.address``, or to a local cluster started here (sized for the actors, at least the
    machine's CPUs) and shut down on the way out. A process already connected (``ray.init`` called by its caller)
    is used as it is."""
    ray = _import_ray()
    if ray.is_initialized():
        yield ray
        return
    if opts.address is not None:
        _probe(opts.address)
    kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False, "configure_logging": False}
    if opts.address is None:
        cpus = max(os.cpu_count() or 1, math.ceil(opts.actors * opts.actor_cpus))
        kwargs.update(num_cpus=cpus, object_store_memory=256 * 1024 * 1024)
    try:
        ray.init(address=opts.address, **kwargs)
    except (ConnectionError, RuntimeError, ValueError) as e:
        where = f"the Ray cluster at {opts.address}" if opts.address else "a local Ray cluster"
        raise RayRolloutError(f"--ray: could not start or reach {where}: {_cause(e)}") from e
    try:
        yield ray
    finally:
        ray.shutdown()


class RayPool:
    """The rollout actors of one team on a connected Ray (:func:`ray_cluster`): an
    :class:`~orchestra.runtime.player.EpisodePlayer`. A context manager: the actors are killed on the way out."""

    def __init__(self, opts: RayOptions, team: str, family: str | None, run: RunOptions, title: str = "") -> None:
        ray = self.ray = _import_ray()
        self.opts, self.num_envs, self.progress = opts, run.num_envs, run.progress
        self.title = title or team  # the progress bar's: the team's name
        threads = str(max(1, math.floor(opts.actor_cpus)))
        actor_cls = ray.remote(RolloutActor).options(
            num_cpus=opts.actor_cpus, runtime_env={"env_vars": {"OMP_NUM_THREADS": threads}}, max_restarts=0
        )
        self.actors = [actor_cls.remote(team, family, run) for _ in range(opts.actors)]
        try:
            self.nodes = ray.get([a.ready.remote() for a in self.actors])
        except ray.exceptions.RayError as e:
            self.close()
            raise RayRolloutError(f"--ray: a rollout actor failed to start: {_cause(e)}") from e

    def play(
        self,
        plan: EnginePlan,
        jobs: Sequence[EpisodeJob],
        writer: TrajectoryWriter,
        on_episode: Callable[[Episode], None],
        planned: int,
    ) -> Played:
        """Play ``jobs`` on the actors in chunks of up to ``num_envs``, one chunk in flight per actor; each chunk's
        episodes are written as it comes back. Returns the episodes in arrival order, the summed rollout counts and
        the conductor's reply counters summed over actors (``planned`` is for a person, who never conducts here)."""
        ray = self.ray
        desc = f"{self.title}/{plan.name} ({len(self.actors)} ray actors)"
        width = max(1, plan_width(len(jobs), len(self.actors), self.num_envs))
        queue = [list(jobs[i : i + width]) for i in range(0, len(jobs), width)][::-1]
        stats, done = RolloutStats(), []
        counters: dict[int, dict[str, float]] = {}
        inflight: dict[Any, int] = {}
        t0 = time.perf_counter()
        bar = tqdm(total=len(jobs), desc=desc, unit="ep", disable=not self.progress)
        try:
            for i, actor in enumerate(self.actors):
                if queue:
                    inflight[actor.play.remote(plan, queue.pop())] = i
            while inflight:
                ready, _ = ray.wait(list(inflight), num_returns=1)
                i = inflight.pop(ready[0])
                try:
                    episodes, delta, count = ray.get(ready[0])
                except ray.exceptions.RayError as e:
                    raise RayRolloutError(
                        f"--ray: rollout actor {i} failed ({_cause(e)}); the episodes already written are kept, "
                        "rerun with --resume"
                    ) from e
                if queue:
                    inflight[self.actors[i].play.remote(plan, queue.pop())] = i
                for ep in episodes:
                    writer.write(ep)
                    on_episode(ep)
                    done.append(ep)
                stats.merge(delta)
                counters[i] = count
                bar.update(len(episodes))
        finally:
            bar.close()
        stats.wall_s = time.perf_counter() - t0  # the pool's wall clock (the actors' own times overlap)
        summed: dict[str, float] = {}
        for count in counters.values():
            for k, v in count.items():
                summed[k] = summed.get(k, 0) + v
        return Played(done, stats, summed)

    def close(self) -> None:
        for a in getattr(self, "actors", []):
            with contextlib.suppress(Exception):  # an actor that is already gone
                self.ray.kill(a)
        self.actors = []

    def __enter__(self) -> RayPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def plan_width(n_jobs: int, n_actors: int, num_envs: int) -> int:
    """Jobs per actor call: the engine's width (``num_envs``), smaller when that would leave actors idle."""
    return max(1, min(num_envs, math.ceil(n_jobs / max(1, n_actors))))


def _probe(address: str, timeout_s: float = 5.0) -> None:
    """Fail at once, in one line, when nothing listens at a ``HOST:PORT`` cluster address (Ray itself retries the
    connection for a minute or more). ``auto`` and addresses without a port are left to Ray."""
    import socket

    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not port.isdigit() or not host:
        return
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as e:
        raise RayRolloutError(
            f"--ray: could not start or reach the Ray cluster at {address}: nothing answers there ({e.strerror or e}); "
            "start one with `ray start --head --port=PORT`, or use --ray for a local cluster"
        ) from e


def _cause(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[-1] if text else type(e).__name__


__all__ = ["RayOptions", "RayPool", "RayRolloutError", "RolloutActor", "plan_width", "ray_cluster"]
