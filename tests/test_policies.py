"""Rule-based conductors drive TeamEnv to the schedules they promise, on real tasks and tools."""

from __future__ import annotations

import io

import numpy as np
import pytest

from envs.config import TeamEnvConfig, WorkerSpec
from envs.tasks.registry import get_family
from envs.team_env import CONDUCTOR, TeamEnv
from policies import (
    HeuristicConductor,
    HeuristicRules,
    HumanConductor,
    PipelineConductor,
    PolicyError,
    RandomConductor,
    RoundRobinConductor,
)

CFG = TeamEnvConfig(
    name="t",
    workers=(
        WorkerSpec("solver", "llm", ("solve", "revise"), "all", True),
        WorkerSpec("calculator", "tool", ("check",), "all", True),
    ),
    instructions={"solve": "Solve.", "revise": "Revise.", "check": "Check."},
    max_turns=6,
    embedder="none",
)
FAMILY = get_family("arithmetic")
CALC = FAMILY.tools()["calculator"]


def run(conductor, solver_texts: list[str], seed: int = 1, task=None) -> tuple[list[str], TeamEnv]:  # type: ignore[no-untyped-def]
    """Play one episode; the solver says the given texts in turn; the calculator is the real tool."""
    env = TeamEnv(CFG, FAMILY)
    env.reset(seed=seed, options={"task": task} if task is not None else None)
    conductor.reset(seed)
    labels: list[str] = []
    texts = iter(solver_texts)
    while env.agents and not (any(env.terminations.values()) or any(env.truncations.values())):
        if env.agent_selection == CONDUCTOR:
            obs = env.observe(CONDUCTOR)
            a = conductor.act(obs["observation"], obs["action_mask"], env.infos[CONDUCTOR]["state"])
            assert obs["action_mask"][a] == 1
            labels.append(CFG.action_label(a))
            env.step(a)
        elif env.agent_selection == "solver":
            env.step({"text": next(texts, "I am not sure."), "tokens": 5})
        else:
            assert env.task is not None
            r = CALC(env.task, env.transcript)
            env.step({"text": r.text, "tokens": 0, "verdict": r.verdict})
    return labels, env


def test_round_robin_cycles_then_submits() -> None:
    labels, env = run(RoundRobinConductor(CFG, rounds=2), ["Answer: 1", "Answer: 2"])
    assert labels == ["solver:solve", "calculator:check", "solver:solve", "calculator:check", "submit"]
    assert all(env.terminations.values())


def test_pipeline_follows_the_sop() -> None:
    task = FAMILY.generate("train", 1, 0)[0]
    expr = task.metadata["solution_expression"]
    labels, env = run(
        PipelineConductor(CFG, ["solver:solve", "calculator:check"]), [f"{expr} = {task.answer}"], task=task
    )
    assert labels == ["solver:solve", "calculator:check", "submit"]
    assert env.final_verdict is not None and env.final_verdict.correct
    with pytest.raises(PolicyError, match="unknown worker"):
        PipelineConductor(CFG, ["planner:solve"])
    with pytest.raises(PolicyError, match="does not take"):
        PipelineConductor(CFG, ["calculator:solve"])


def test_heuristic_revises_after_a_failing_check_and_submits_on_pass() -> None:
    env = TeamEnv(CFG, FAMILY)
    env.reset(seed=1)
    assert env.task is not None
    right = env.task.answer
    expr = env.task.metadata.get("solution_expression") or env.task.metadata["expression"]
    rules = HeuristicRules(start="solver:solve", check="calculator:check", revise="solver:revise")
    labels, env = run(HeuristicConductor(CFG, rules), ["Answer: -12345", f"{expr} = {right}. Answer: {right}"], seed=1)
    # the calculator cannot check an answer without arithmetic (n/a) → revise → check passes → submit
    assert labels == ["solver:solve", "calculator:check", "solver:revise", "calculator:check", "submit"]
    assert labels[-1] == "submit"
    assert env.final_verdict is not None and env.final_verdict.correct


def test_random_is_legal_and_reproducible() -> None:
    a, _ = run(RandomConductor(CFG, seed=5), ["Answer: 3"] * 6, seed=2)
    b, _ = run(RandomConductor(CFG, seed=5), ["Answer: 3"] * 6, seed=2)
    assert a == b and len(a) >= 1


def test_human_conductor_reads_choices_and_rejects_bad_input() -> None:
    out = io.StringIO()
    human = HumanConductor(CFG, stdin=io.StringIO("9\nbogus\ncalculator:check\n"), stdout=out)
    mask = np.zeros(CFG.num_actions, dtype=np.int8)
    mask[[CFG.action_id("solver", "solve"), CFG.action_id("calculator", "check")]] = 1
    state = {"task": {"id": "x", "prompt": "What is 2+2?"}, "turn": 0, "max_turns": 6, "transcript": []}
    assert human.act(np.zeros(3), mask, state) == CFG.action_id("calculator", "check")
    shown = out.getvalue()
    assert "What is 2+2?" in shown and "'9' is not an action number (1 to 2)" in shown
    assert "'bogus' is not a legal action" in shown
    with pytest.raises(PolicyError, match="input closed"):
        HumanConductor(CFG, stdin=io.StringIO(""), stdout=io.StringIO()).act(np.zeros(3), mask, state)
