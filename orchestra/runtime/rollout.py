"""The rollout engine: many episodes of one team under one conductor, several envs stepped at once.

Rollout is apart from learning (docs/architecture.md §6). Each loop advances every active env to its next worker
turn (conductor decisions are cheap), then serves all pending worker turns with ONE ``generate`` call
per backend, so a batching backend (transformers, an HTTP server) sees a batch across envs.

Each finished episode becomes a trajectory record (docs/architecture.md §4) and is handed to the writer at once
(flush + fsync per episode), so a killed run loses at most the episodes in flight.

Faults end an episode, not a run: a worker turn its backend cannot serve (an HTTP error after the backend's own
retries, a malformed reply, an exception inside llama.cpp, transformers or a tool) ends that episode as *errored*
(``Episode.error``: cause, message, worker, attempts), written like any other and counted in
``RolloutStats.errors`` by cause; the other envs go on. With ``episode_retries = k`` a faulted episode is first
replayed from its start up to k times (same task, same seeds), and only the last fault is recorded.
"""

from __future__ import annotations

import hashlib
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
from tqdm import tqdm

from envs.perturb import Perturbation, parse_perturbation, perturbed
from envs.tasks.base import Task, TaskFamily
from envs.team_env import CONDUCTOR, Instruct, TeamEnv
from orchestra.backends.base import BackendError, Completion, Failure, generate_settled
from orchestra.runtime.team_file import TeamSpec
from orchestra.runtime.workers import Worker
from policies.base import ConductorPolicy
from trajectories import (
    SCHEMA_VERSION,
    Action,
    ConductorRef,
    Episode,
    EpisodeError,
    Message,
    Reward,
    Step,
    TaskRef,
    TeamRef,
    TrajectoryWriter,
)


@dataclass(frozen=True)
class EpisodeJob:
    episode_id: str
    task: Task
    seed: int


def episode_seed(seed: int, index: int) -> int:
    """A stable per-episode seed from the run seed and the episode index."""
    h = hashlib.sha256(f"{seed}:{index}".encode()).digest()
    return int.from_bytes(h[:4], "big")


def turn_seed(episode_seed: int, turn: int) -> int:
    """The sampling seed of a worker turn: sampled runs repeat exactly, and each turn of an episode draws afresh."""
    return episode_seed + 7919 * turn


def plan_jobs(tasks: Sequence[Task], seed: int, prefix: str) -> list[EpisodeJob]:
    """Episode i runs task i with ``episode_seed(seed, i)``: the plan is the same on every run,
    so ``--resume`` can skip what is done and redo exactly what is missing."""
    return [EpisodeJob(f"{prefix}-{i:05d}", t, episode_seed(seed, i)) for i, t in enumerate(tasks)]


@dataclass
class _Slot:
    job: EpisodeJob
    env: TeamEnv
    conductor: ConductorPolicy
    steps: list[Step] = field(default_factory=list)
    pending: dict[str, Any] | None = None  # the conductor decision awaiting its worker's message
    tokens: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    t0: float = field(default_factory=time.perf_counter)
    attempt: int = 1  # how many times this episode has been started (episode-level retries)


@dataclass
class RolloutStats:
    episodes: int = 0
    tokens: int = 0
    generated_tokens: int = 0  # tokens not served from the cache
    llm_calls: int = 0
    cache_hits: int = 0
    wall_s: float = 0.0
    errors: dict[str, int] = field(default_factory=dict)  # errored episodes by the cause of their last fault
    turn_faults: int = 0  # worker turns a backend failed (each retried episode counts every fault it met)
    episode_retries: int = 0  # episodes replayed from their start after a fault

    def merge(self, other: RolloutStats) -> None:
        """Add another engine's counts (several conductors in one recording)."""
        for k in ("episodes", "tokens", "generated_tokens", "llm_calls", "cache_hits", "wall_s"):
            setattr(self, k, getattr(self, k) + getattr(other, k))
        for k in ("turn_faults", "episode_retries"):
            setattr(self, k, getattr(self, k) + getattr(other, k))
        for cause, n in other.errors.items():
            self.errors[cause] = self.errors.get(cause, 0) + n

    def as_metrics(self) -> dict[str, float]:
        w = max(self.wall_s, 1e-9)
        return {
            "rollout/episodes": self.episodes,
            "rollout/tokens": self.tokens,
            "rollout/generated_tokens": self.generated_tokens,
            "rollout/llm_calls": self.llm_calls,
            "rollout/cache_hits": self.cache_hits,
            "perf/wall_s": round(self.wall_s, 3),
            "perf/episodes_per_s": round(self.episodes / w, 4),
            "perf/tokens_per_s": round(self.generated_tokens / w, 2),
            "faults/errored_episodes": sum(self.errors.values()),
            "faults/turn_faults": self.turn_faults,
            "faults/episode_retries": self.episode_retries,
            **{f"faults/errors/{cause}": n for cause, n in sorted(self.errors.items())},
        }


class RolloutEngine:
    def __init__(
        self,
        team: TeamSpec,
        family: TaskFamily,
        workers: dict[str, Worker],
        conductor_factory: Callable[[], ConductorPolicy],
        *,
        conductor_name: str,
        conductor_checkpoint: str | None = None,
        run_id: str = "run",
        num_envs: int = 8,
        progress: bool = True,
        episode_retries: int = 0,
        perturb: Sequence[str] = (),
        perturb_seed: int = 0,
    ) -> None:
        if episode_retries < 0:
            raise ValueError(f"episode_retries: expected an int >= 0, got {episode_retries}")
        self.team, self.family, self.workers = team, family, workers
        self.conductor_factory = conductor_factory
        self.conductor_name, self.conductor_checkpoint = conductor_name, conductor_checkpoint
        self.run_id, self.num_envs, self.progress = run_id, max(1, num_envs), progress
        self.episode_retries = episode_retries
        # robustness wrappers (envs.perturb specs, e.g. "drop=0.2") around every env, seeded by perturb_seed and
        # each episode's seed; their events go to the episode's metadata["perturbations"]
        self.perturb, self.perturb_seed = tuple(perturb), int(perturb_seed)
        if self.perturb:
            for spec in self.perturb:
                parse_perturbation(spec)  # a bad spec fails here, before any episode runs
        self._envs: list[TeamEnv] = []
        self.stats = RolloutStats()

    def _env(self, i: int) -> TeamEnv:
        while len(self._envs) <= i:
            encoder = self._envs[0].encoder if self._envs else None
            env = TeamEnv(self.team.env, self.family, encoder=encoder)
            # a wrapper forwards every TeamEnv attribute (PettingZoo BaseWrapper), so the engine drives it unchanged
            self._envs.append(cast(TeamEnv, perturbed(env, self.perturb, self.perturb_seed)) if self.perturb else env)
        return self._envs[i]

    def run(
        self,
        jobs: Sequence[EpisodeJob],
        writer: TrajectoryWriter | None = None,
        on_episode: Callable[[Episode], None] | None = None,
    ) -> list[Episode]:
        queue = list(jobs)[::-1]
        # a person (HumanConductor.interactive) plays one episode at a time: never two tasks interleaved
        width = 1 if getattr(self.conductor_factory(), "interactive", False) else self.num_envs
        slots: list[_Slot | None] = [None] * min(width, max(len(queue), 1))
        done: list[Episode] = []
        t_start = time.perf_counter()
        bar = tqdm(
            total=len(queue), desc=f"{self.team.name}/{self.conductor_name}", unit="ep", disable=not self.progress
        )
        try:
            while queue or any(s is not None for s in slots):
                for i, s in enumerate(slots):
                    if s is None and queue:
                        slots[i] = self._start(i, queue.pop())
                # 1) conductors act until each env waits for a worker (or ends)
                for i, s in enumerate(slots):
                    if s is not None:
                        ep = self._advance_conductor(s)
                        if ep is not None:
                            slots[i] = None
                            self._finish(ep, s, writer, on_episode, done, bar, t_start)
                # 2) one batched generate call per backend for every waiting worker
                groups: dict[int, list[tuple[int, _Slot, Worker]]] = defaultdict(list)
                for i, s in enumerate(slots):
                    if s is not None and s.env.agents and s.env.agent_selection != CONDUCTOR:
                        w = self.workers[s.env.agent_selection]
                        groups[id(w.backend)].append((i, s, w))
                for members in groups.values():
                    requests = [
                        w.request(
                            s.env.worker_chat(w.name), s.job.task, s.env.transcript, turn_seed(s.job.seed, s.env.turn)
                        )
                        for _, s, w in members
                    ]
                    completions = generate_settled(members[0][2].backend, requests)
                    if len(completions) != len(requests):
                        raise RuntimeError(
                            f"backend {members[0][2].backend!r} returned {len(completions)} completions for "
                            f"{len(requests)} requests (the backend contract is one per request, in order)"
                        )
                    for (i, s, w), c in zip(members, completions, strict=True):
                        if isinstance(c, Failure):
                            self.stats.turn_faults += 1
                            if s.attempt <= self.episode_retries:
                                self.stats.episode_retries += 1
                                slots[i] = self._start(i, s.job, attempt=s.attempt + 1)
                                continue
                            ep = self._errored(s, w, c)
                        else:
                            ep = self._worker_turn(s, w, c)
                        if ep is not None:
                            slots[i] = None
                            self._finish(ep, s, writer, on_episode, done, bar, t_start)
        finally:
            bar.close()
        self.stats.wall_s += time.perf_counter() - t_start
        return done

    # -- internals --------------------------------------------------------------------------------
    def _start(self, i: int, job: EpisodeJob, attempt: int = 1) -> _Slot:
        env = self._env(i)
        env.reset(seed=job.seed, options={"task": job.task})
        conductor = self.conductor_factory()
        conductor.reset(job.seed)
        return _Slot(job=job, env=env, conductor=conductor, attempt=attempt)

    def _errored(self, s: _Slot, w: Worker, f: Failure) -> Episode:
        """The episode a fault ended: the steps before the failed turn, never a success, the cause on record.
        The failed turn's conductor decision is dropped (no message came back for it)."""
        s.pending = None
        self.stats.errors[f.cause] = self.stats.errors.get(f.cause, 0) + 1
        err = EpisodeError(cause=f.cause, message=f.message[:500], worker=w.name, attempts=s.attempt)
        return self._episode(s, error=err)

    def _advance_conductor(self, s: _Slot) -> Episode | None:
        env = s.env
        while env.agents and env.agent_selection == CONDUCTOR and not self._ended(env):
            obs = env.observe(CONDUCTOR)
            state = env.infos[CONDUCTOR]["state"]
            mask = obs["action_mask"]
            choice = s.conductor.act(obs["observation"], mask, state)
            if isinstance(choice, Instruct):  # the conductor's own words: recorded with the nearest declared action
                mapped = env.map_instruction(choice.worker, choice.text)
                a, text, similarity = mapped.action, choice.text.strip(), mapped.similarity
                step_action: Instruct | int = choice
            else:
                a, text, similarity = int(choice), None, None
                step_action = a
            worker, instruction = env.config.decode_action(a)
            s.pending = {
                "t": len(s.steps),
                "state": state,
                "observation": obs["observation"],
                "action_mask": mask,
                "action": Action(
                    id=a,
                    kind="submit" if worker is None else "worker",
                    worker=worker,
                    instruction=instruction,
                    text=text,
                    similarity=similarity,
                ),
            }
            env.step(step_action)
            executed = getattr(env, "executed_action", None)  # action noise (envs.perturb) may have replaced it
            if self.perturb and isinstance(executed, int | np.integer) and int(executed) != a:
                a = int(executed)
                worker, instruction = env.config.decode_action(a)
                s.pending["action"] = Action(
                    id=a, kind="submit" if worker is None else "worker", worker=worker, instruction=instruction
                )
            s.pending["vec"] = dict(env.step_reward_vector)
            if worker is None:
                self._close_step(s, None)
                return self._episode(s)
        if self._ended(env):
            return self._episode(s)
        return None

    @staticmethod
    def _ended(env: TeamEnv) -> bool:
        return any(env.terminations.values()) or any(env.truncations.values())

    def _worker_turn(self, s: _Slot, w: Worker, c: Completion) -> Episode | None:
        s.env.step(Worker.env_action(c))
        assert s.pending is not None
        for k, v in s.env.step_reward_vector.items():
            s.pending["vec"][k] += v
        s.tokens[w.name] += c.usage.completion_tokens
        self.stats.tokens += c.usage.completion_tokens
        if w.kind == "llm":
            self.stats.llm_calls += 1
            if c.cached:
                self.stats.cache_hits += 1
            else:
                self.stats.generated_tokens += c.usage.completion_tokens
        prompt_version = next(x.prompt_version for x in s.env.config.workers if x.name == w.name)
        instruction = s.pending["action"].instruction
        msg = Message(
            worker=w.name,
            instruction=instruction,
            text=c.text,
            token_ids=list(c.token_ids),
            logprobs=[float(x) for x in c.logprobs],
            model_id=c.model_id,
            prompt_version=prompt_version,
            finish_reason=c.finish_reason,
            prompt_tokens=c.usage.prompt_tokens,
            completion_tokens=c.usage.completion_tokens,
            cached=c.cached,
            verdict=c.metadata.get("verdict"),
        )
        self._close_step(s, msg)
        if self._ended(s.env):
            return self._episode(s)
        return None

    def _close_step(self, s: _Slot, msg: Message | None) -> None:
        p = s.pending
        assert p is not None
        env = s.env
        vec = {k: float(v) for k, v in p["vec"].items()}
        scalar = env.config.scalarise(vec)
        s.steps.append(
            Step(
                t=p["t"],
                state=p["state"],
                observation=[float(x) for x in np.asarray(p["observation"], dtype=np.float32)],
                action_mask=[int(x) for x in p["action_mask"]],
                action=p["action"],
                message=msg,
                reward=Reward(named=vec, scalar=scalar),
                terminated=any(env.terminations.values()),
                truncated=any(env.truncations.values()) and not any(env.terminations.values()),
            )
        )
        s.pending = None

    def _episode(self, s: _Slot, error: EpisodeError | None = None) -> Episode:
        env = s.env
        task = s.job.task
        verdict = env.final_verdict if error is None else None
        cfg = env.config
        final_state = env.state_dict()
        events = cast(Perturbation, env).all_events() if self.perturb else []
        noted = {"perturb": list(self.perturb), "perturbations": events} if self.perturb else {}
        return Episode(
            schema_version=SCHEMA_VERSION,
            episode_id=s.job.episode_id,
            run_id=self.run_id,
            task=TaskRef(id=task.id, family=task.family, split=task.split, seed=task.seed, difficulty=task.difficulty),
            team=TeamRef(
                name=cfg.name,
                workers=list(cfg.worker_names),
                model_ids={n: w.model_id for n, w in self.workers.items()},
                prompt_versions={w.name: w.prompt_version for w in cfg.workers},
            ),
            conductor=ConductorRef(name=self.conductor_name, checkpoint=self.conductor_checkpoint),
            seed=s.job.seed,
            steps=s.steps,
            return_=float(sum(st.reward.scalar for st in s.steps)),
            success=bool(verdict is not None and verdict.correct),
            score=float(verdict.score) if verdict is not None else 0.0,
            terminated=error is None and any(env.terminations.values()),
            truncated=error is None and any(env.truncations.values()) and not any(env.terminations.values()),
            usage={"tokens": dict(s.tokens), "wall_time_s": round(time.perf_counter() - s.t0, 4)},
            final_observation=[float(x) for x in env.encoder.encode(final_state)],
            metadata={
                "final_state": final_state,
                "verdict_reason": (
                    f"ended by a fault: {error.cause}"
                    if error is not None
                    else verdict.reason
                    if verdict is not None
                    else "not submitted (turn budget spent)"
                ),
                **noted,
            },
            error=error,
        )

    def _finish(
        self,
        ep: Episode,
        s: _Slot,
        writer: TrajectoryWriter | None,
        on_episode: Callable[[Episode], None] | None,
        done: list[Episode],
        bar: Any,
        t_start: float,
    ) -> None:
        if writer is not None:
            writer.write(ep)
        episode_end = getattr(s.conductor, "episode_end", None)  # a person sees the outcome (HumanConductor)
        if episode_end is not None:
            episode_end(ep)
        if on_episode is not None:
            on_episode(ep)
        done.append(ep)
        self.stats.episodes += 1
        bar.update(1)
        el = max(time.perf_counter() - t_start, 1e-9)
        bar.set_postfix(ep_s=f"{len(done) / el:.2f}", tok_s=f"{self.stats.generated_tokens / el:.0f}")


def require_no_faults(episodes: list[Episode], what: str) -> list[Episode]:
    """``episodes`` if no fault cut one short, else a :class:`BackendError` naming the first. For callers that must
    not learn from or score a faulted episode (phase 2: one fault stops the stage, which ``--resume`` repeats from
    its checkpoint), where a recording would record it and go on."""
    bad = [e for e in episodes if e.error is not None]
    if bad:
        e = bad[0]
        assert e.error is not None
        raise BackendError(
            f"a backend fault ended {len(bad)} episode(s) of {what} (first: {e.error.cause}, {e.error.worker}'s "
            f"turn: {e.error.message}); phase 2 does not train on faulted episodes: rerun with --resume",
            cause=e.error.cause,
        )
    return episodes


def episode_metrics(episodes: Iterable[Episode]) -> dict[str, float]:
    """Flat namespaced metrics of a set of episodes, incl. ``agent/{name}/parse_fail_rate``."""
    eps = [e for e in episodes if e.error is None]  # a fault is not an outcome (counted in RolloutStats.errors)
    out: dict[str, float] = {}
    if not eps:
        return out
    out["rollout/success_rate"] = float(np.mean([e.success for e in eps]))
    out["rollout/mean_return"] = float(np.mean([e.return_ for e in eps]))
    out["rollout/mean_turns"] = float(np.mean([e.worker_turns for e in eps]))
    out["rollout/mean_tokens"] = float(np.mean([e.total_tokens for e in eps]))
    msgs: dict[str, list[Any]] = defaultdict(list)
    for e in eps:
        for st in e.metadata.get("final_state", {}).get("transcript", []):
            msgs[st["worker"]].append(st)
    for name, ms in sorted(msgs.items()):
        proposing = [m for m in ms if m.get("proposes_answer") and m.get("verdict") is None]
        if proposing:
            out[f"agent/{name}/parse_fail_rate"] = float(np.mean([m.get("answer") is None for m in proposing]))
        out[f"agent/{name}/turns_per_episode"] = len(ms) / len(eps)
    return out
