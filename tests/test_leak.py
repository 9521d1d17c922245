"""No solution-derived information reaches a conductor or a tool (issue 12, items 1-2).

* The leak test: for each default family, the same scripted transcript is played on a task and on a
  copy whose answer, generation level and every hidden (solution-derived) metadata field are
  perturbed. Every observation, every recorded state and every tool output must be identical; only
  the verifier's verdict at submit may differ.
* Tool-only: the team's ``tool_only`` rule (its tools, no LLM output to work on) solves no held-out
  task of any default family.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pytest

from envs.tasks.base import Task, ToolResult
from envs.tasks.registry import PROTOCOL_FAMILIES, get_family
from orchestra.backends.base import Completion, GenerationRequest, Usage
from orchestra.backends.tools import ToolBackend
from orchestra.runtime.conductors import conductor_factory
from orchestra.runtime.rollout import RolloutEngine, plan_jobs
from orchestra.runtime.team_file import TeamSpec, load_team
from orchestra.runtime.workers import Worker
from policies import PipelineConductor
from trajectories import Episode

# metadata each family must keep from tools and conductors (derived from the solution)
MUST_HIDE = {
    "arithmetic": {"solution_expression", "steps"},
    "blocksworld": {"optimal_moves", "kind"},
    "logic_grid": {"solution", "kind"},
    "code_synthesis": {"tests"},
}


def _team(name: str) -> TeamSpec:
    team = load_team(name)
    return dataclasses.replace(team, env=dataclasses.replace(team.env, embedder="hash"))


def _roles(team: TeamSpec) -> tuple[str, str]:
    """(the answer-proposing LLM worker, the first tool worker)."""
    llm = next(w.name for w in team.env.workers if team.workers[w.name].kind == "llm" and w.proposes_answer)
    tool = next(w.name for w in team.env.workers if team.workers[w.name].kind == "tool")
    return llm, tool


def _candidates(task: Task) -> tuple[str, str]:
    """A right and a wrong worker reply for ``task``, written from the ORIGINAL task (a fixed script)."""
    fam, ans, meta = task.family, task.answer, task.metadata
    if fam == "arithmetic":
        wrong = str(int(float(ans)) + 1)
        expr = meta["solution_expression"]
        return f"{expr} = {ans}\nAnswer: {ans}", f"{expr} = {wrong}\nAnswer: {wrong}"
    if fam == "blocksworld":
        first = ans.splitlines()[0]
        return ans, f"{first}\n{first}"  # the repeated move is illegal: the validator says FAIL
    if fam == "logic_grid":
        other = next(o for o in meta["options"] if o != ans)
        return f"Answer: {ans}", f"Answer: {other}"
    if fam == "code_synthesis":
        return f"```python\n{ans}\n```", f"```python\n{meta['signature']}\n    return None\n```"
    raise AssertionError(fam)


class ScriptBackend:
    """Replies from a script keyed by task id: the first reply is the right one, later ones the wrong one
    (so the last tool check is a FAIL, whose feedback may mention earlier candidates)."""

    model_id = "script"

    def __init__(self, script: Mapping[str, tuple[str, str]]) -> None:
        self.script = script

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        out = []
        for r in requests:
            right, wrong = self.script[r.context["task"].id]
            text = right if len(r.context["transcript"]) == 0 else wrong
            out.append(Completion(text, (1,), (-0.1,), "stop", Usage(5, 1), "script"))
        return out


class Recorder:
    """Wraps the tool backend to keep each tool's exact output and the task view it was given."""

    def __init__(self, inner: ToolBackend) -> None:
        self.inner, self.model_id = inner, inner.model_id
        self.outputs: list[tuple[str, str, Any]] = []

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        res = self.inner.generate(requests)
        self.outputs += [
            (r.context["task"].id, c.text, c.metadata["verdict"]) for r, c in zip(requests, res, strict=True)
        ]
        return res


def _perturb(value: Any) -> Any:
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 7
    if isinstance(value, str):
        return value + " (perturbed)"
    if isinstance(value, list):
        return [_perturb(v) for v in reversed(value)] or ["perturbed"]
    if isinstance(value, dict):
        return {k: _perturb(v) for k, v in value.items()}
    return "perturbed"


def perturbed(task: Task) -> Task:
    meta = {k: (_perturb(v) if k in task.hidden else v) for k, v in task.metadata.items()}
    return dataclasses.replace(task, answer="PERTURBED 12345", difficulty=task.difficulty + 1, metadata=meta)


def _play(team: TeamSpec, tasks: list[Task], script: Mapping[str, tuple[str, str]]) -> tuple[list[Episode], list]:
    family = get_family(team.family)
    llm_name, tool_name = _roles(team)
    tools = Recorder(ToolBackend(family.tools()))
    llm = ScriptBackend(script)
    workers = {}
    for w in team.env.workers:
        rt = team.workers[w.name]
        backend = tools if rt.kind == "tool" else llm
        workers[w.name] = Worker(w.name, rt.kind, backend, rt.generation, w.prompt_version, rt.tool)  # type: ignore[arg-type]
    steps = [f"{llm_name}:solve", f"{tool_name}:check", f"{llm_name}:revise", f"{tool_name}:check"]
    engine = RolloutEngine(
        team, family, workers, lambda: PipelineConductor(team.env, steps), conductor_name="leak", progress=False
    )
    return engine.run(plan_jobs(tasks, 0, "leak")), tools.outputs


@pytest.mark.parametrize("family_name", PROTOCOL_FAMILIES)
def test_perturbing_hidden_fields_changes_no_observation_state_or_tool_output(family_name: str) -> None:
    team = _team(family_name)
    family = get_family(team.family)
    tasks = family.generate("test", 8, seed=3)
    assert MUST_HIDE[family_name] <= set(tasks[0].hidden), f"{family_name} must hide {MUST_HIDE[family_name]}"
    script = {t.id: _candidates(t) for t in tasks}
    base, base_tools = _play(team, tasks, script)
    pert, pert_tools = _play(team, [perturbed(t) for t in tasks], script)
    assert len(base_tools) == len(pert_tools) == 2 * len(tasks)
    assert base_tools == pert_tools  # identical tool texts and verdicts
    assert any(v == "pass" for _, _, v in base_tools) and any(v == "fail" for _, _, v in base_tools)
    for a, b in zip(base, pert, strict=True):
        assert [s.action.label for s in a.steps] == [s.action.label for s in b.steps]
        for sa, sb in zip(a.steps, b.steps, strict=True):
            assert np.array_equal(np.asarray(sa.observation), np.asarray(sb.observation))
            assert np.array_equal(np.asarray(sa.action_mask), np.asarray(sb.action_mask))
            assert sa.state == sb.state
        assert a.metadata["final_state"] == b.metadata["final_state"]
        assert "PERTURBED" not in str(b.metadata["final_state"])


@pytest.mark.parametrize("family_name", PROTOCOL_FAMILIES)
def test_tools_get_the_public_view_only(family_name: str) -> None:
    family = get_family(family_name)
    task = family.generate("test", 1, seed=0)[0]
    seen: list[Task] = []

    def spy(t: Task, transcript: Sequence[Mapping[str, Any]]) -> ToolResult:
        seen.append(t)
        return ToolResult("ok", "n/a")

    ToolBackend({"spy": spy}).generate([GenerationRequest((), context={"tool": "spy", "task": task, "transcript": []})])
    (view,) = seen
    assert view.answer == "" and view.difficulty == 0 and not set(task.hidden) & set(view.metadata)
    assert view.prompt == task.prompt


class NoLLM:
    model_id = "none"

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        raise AssertionError("a tool-only schedule called an LLM worker")


@pytest.mark.parametrize("family_name", PROTOCOL_FAMILIES)
def test_tool_only_conductor_solves_no_held_out_task(family_name: str) -> None:
    team = _team(family_name)
    family = get_family(team.family)
    tools = ToolBackend(family.tools())
    workers = {
        w.name: Worker(
            w.name,
            team.workers[w.name].kind,
            tools if team.workers[w.name].kind == "tool" else NoLLM(),  # type: ignore[arg-type]
            team.workers[w.name].generation,
            w.prompt_version,
            team.workers[w.name].tool,
        )
        for w in team.env.workers
    }
    engine = RolloutEngine(
        team, family, workers, conductor_factory("tool_only", team), conductor_name="tool_only", progress=False
    )
    eps = engine.run(plan_jobs(family.generate("test", 40, seed=0), 0, "tool"))
    assert len(eps) == 40 and sum(e.success for e in eps) == 0
    assert all(s.action.kind == "submit" or s.message.model_id.startswith("tool:") for e in eps for s in e.steps)
