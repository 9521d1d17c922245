"""Test fixtures: a scripted LLM backend and real-env episodes of the arithmetic team without a model.

The calculator is the family's real tool; the solver and critic are scripted (a function of the
task), so episodes are cheap and deterministic while the env, the rollout engine and the trajectory
records are the real ones."""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from envs.tasks.base import Task
from envs.tasks.registry import get_family
from orchestra.backends.base import Completion, GenerationRequest, Usage
from orchestra.backends.tools import ToolBackend
from orchestra.runtime.conductors import conductor_factory
from orchestra.runtime.rollout import RolloutEngine, plan_jobs
from orchestra.runtime.team_file import TeamSpec, load_team
from orchestra.runtime.workers import Worker
from policies.learning.dataset import ConductorDataset
from trajectories import Episode, TrajectoryWriter


class ScriptedBackend:
    """Answers each request with ``reply(task, messages)``; token ids are fake but consistent."""

    def __init__(self, reply: Callable[[Task, Sequence[str]], str], model_id: str = "scripted") -> None:
        self.reply, self.model_id = reply, model_id
        self.calls = 0

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        out = []
        for r in requests:
            self.calls += 1
            text = self.reply(r.context["task"], [m.content for m in r.messages])
            n = max(1, len(text.split()))
            out.append(
                Completion(
                    text=text,
                    token_ids=tuple(range(n)),
                    logprobs=tuple([-0.1] * n),
                    finish_reason="stop",
                    usage=Usage(prompt_tokens=10, completion_tokens=n),
                    model_id=self.model_id,
                )
            )
        return out


def _coin(task: Task, salt: str = "") -> bool:
    return hashlib.sha256((task.id + salt).encode()).digest()[0] % 2 == 0


def solver_reply(task: Task, messages: Sequence[str]) -> str:
    """Right on half the tasks at first; a revision is always right."""
    right = _coin(task) or any("redo" in m.lower() or "may be wrong" in m.lower() for m in messages[-1:])
    answer = task.answer if right else str(int(float(task.answer)) + 1)
    return f"I computed it.\nAnswer: {answer}"


def arithmetic_team(embedder: str = "hash") -> TeamSpec:
    team = load_team("arithmetic")
    return dataclasses.replace(team, env=dataclasses.replace(team.env, embedder=embedder))


def scripted_workers(team: TeamSpec) -> dict[str, Worker]:
    family = get_family(team.family)
    tools = ToolBackend(family.tools())
    llm = ScriptedBackend(lambda t, m: solver_reply(t, m) if "Answer" in m[0] else "Looks right to me.")
    workers = {}
    for w in team.env.workers:
        rt = team.workers[w.name]
        if rt.kind == "tool":
            workers[w.name] = Worker(w.name, "tool", tools, rt.generation, w.prompt_version, rt.tool)
        else:
            workers[w.name] = Worker(w.name, "llm", llm, rt.generation, w.prompt_version)
    return workers


def record_scripted(
    team: TeamSpec, conductor: str, episodes: int, seed: int = 0, split: str = "train", path: Path | None = None
) -> list[Episode]:
    """Real rollouts of ``conductor`` on arithmetic tasks with scripted LLM workers."""
    family = get_family(team.family)
    tasks = family.generate(split, episodes, seed)  # type: ignore[arg-type]
    engine = RolloutEngine(
        team,
        family,
        scripted_workers(team),
        conductor_factory(conductor, team, seed),
        conductor_name=conductor,
        num_envs=4,
        progress=False,
    )
    jobs = plan_jobs(tasks, seed, f"{conductor}-{split}-s{seed}")
    if path is None:
        return engine.run(jobs)
    with TrajectoryWriter(path, resume=path.exists()) as writer:  # as `orchestra record --resume`: skip what is done
        return engine.run([j for j in jobs if j.episode_id not in writer.done_ids], writer=writer)


def array_dataset(**arrays: Any) -> ConductorDataset:
    """A ConductorDataset from its arrays alone (``observations``, ``actions``, ``rewards``, ``terminals``,
    ``timeouts``, ``masks``, ``episode_index``, ``final_observations``, ``episodes``) in a fixed small layout: three
    features f0..f2, actions ``w:x`` and ``submit``, no stored states. For tests of episode boundaries."""
    return ConductorDataset(
        **arrays,
        states=[{}] * len(arrays["actions"]),
        feature_names=["f0", "f1", "f2"],
        action_labels=["w:x", "submit"],
        weights={},
        team="t",
        embedder="none",
    )
