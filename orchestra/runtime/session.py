"""A loaded team: its team file, task family and workers, reused by every conductor of one job; and the run options
every recording job shares."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envs.tasks.base import TaskFamily
from envs.tasks.registry import get_family
from envs.tasks.user_data import is_user_data
from orchestra.runtime.team_file import TeamSpec, load_team
from orchestra.runtime.workers import Worker, build_workers


@dataclass(frozen=True)
class RunOptions:
    """How a job runs its episodes (not what it runs): shared by recording, evaluation and phase 1."""

    seed: int = 0  # run seed: tasks and per-episode seeds derive from it
    num_envs: int = 8  # envs stepped at once; worker requests are batched across them
    use_cache: bool = True  # the response cache (greedy calls, and seeded samples from llama.cpp)
    cache_path: str | None = None  # response cache file; None = $ORCHESTRA_CACHE_DIR/responses.sqlite
    progress: bool = True  # progress bars on stderr
    # llama.cpp workers decode one request at a time from an empty KV cache (batch_size 1, no prefix cache), the
    # path the published tables were recorded with; default: the team files' batched settings
    serial: bool = False
    # a worker turn its backend cannot serve (after the backend's own retries) ends its episode as errored (recorded,
    # counted by cause, left out of results and datasets); replay such an episode from its start up to this many
    # times first
    episode_retries: int = 0
    # Ray-distributed rollouts (orchestra/runtime/distributed.py): actors play the episodes, this process writes
    # them; --ray starts a local cluster
    ray: bool = False
    ray_address: str | None = None  # an existing Ray cluster (e.g. HEAD:6379, or "auto"); implies --ray
    ray_actors: int = 2  # rollout actors, each with its own workers and backends
    ray_actor_cpus: float = 1.0  # Ray CPUs each actor reserves; its native libraries run on that many threads


def resolve_family(team: TeamSpec, family: str | None) -> TaskFamily:
    """The task family a team runs on: ``family`` (a registered name, or a user's data: see
    :func:`~envs.tasks.user_data.is_user_data`) or the team's own."""
    name = family or team.family
    if is_user_data(name):
        return get_family("jsonl", path=name)
    return get_family(name)


class Session:
    """A loaded team with its family and workers, reused across the conductors of one job."""

    def __init__(
        self, team: str, family: str | None, use_cache: bool, cache_path: str | None, serial: bool = False
    ) -> None:
        self.team = load_team(team)
        self.family = resolve_family(self.team, family)
        self._cache_path, self._use_cache, self._serial = cache_path, use_cache, serial

    @functools.cached_property
    def workers(self) -> dict[str, Worker]:
        """The team's workers with their backends, loaded on first use (a Ray driver plans episodes without them)."""
        return build_workers(
            self.team,
            self.family.tools(),
            cache_path=Path(self._cache_path) if self._cache_path else None,
            use_cache=self._use_cache,
            serial=self._serial,
        )

    @classmethod
    def of(cls, team: str, family: str | None, run: RunOptions) -> Session:
        return cls(team, family, run.use_cache, run.cache_path, run.serial)

    def backends(self) -> dict[str, Any]:
        """The loaded LLM backends by their team-file key (``backends: {smollm2: ...}``), so an LLM conductor on the
        same key shares the workers' model and response cache instead of loading a second, uncached copy."""
        out: dict[str, Any] = {}
        for name, w in self.workers.items():
            key = self.team.workers[name].backend
            if w.kind == "llm" and key is not None:
                out.setdefault(key, w.backend)
        return out


__all__ = ["RunOptions", "Session", "resolve_family"]
