"""TeamEnv conformance (PettingZoo api_test / seed_test on every family's team) and behaviour."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from pettingzoo.test import api_test, seed_test

from envs.config import TeamEnvConfig, WorkerSpec
from envs.observation import ObservationEncoder, derive_flags
from envs.tasks.registry import get_family
from envs.team_env import CONDUCTOR, IllegalActionError, TeamEnv
from orchestra.runtime.team_file import builtin_teams, load_team

TEAMS = builtin_teams()


def make_env(team_name: str, embedder: str = "hash") -> TeamEnv:
    team = load_team(team_name)
    cfg = dataclasses.replace(team.env, embedder=embedder)
    return TeamEnv(cfg, get_family(team.family))


def test_every_family_has_a_builtin_team() -> None:
    families = {load_team(t).family for t in TEAMS}
    assert {"arithmetic", "logic_grid", "blocksworld", "code_synthesis"} <= families


@pytest.mark.parametrize("team", TEAMS)
def test_pettingzoo_api(team: str) -> None:
    api_test(make_env(team), num_cycles=30)


@pytest.mark.parametrize("team", TEAMS)
def test_pettingzoo_seed(team: str) -> None:
    seed_test(lambda: make_env(team), num_cycles=20)


def _cfg(max_turns: int = 3) -> TeamEnvConfig:
    return TeamEnvConfig(
        name="t",
        workers=(
            WorkerSpec("solver", "llm", ("solve", "revise"), "all", True),
            WorkerSpec("calculator", "tool", ("check",), "last", True),
            WorkerSpec("critic", "llm", ("check",), "own", False),
        ),
        instructions={"solve": "Solve it.", "revise": "Fix it.", "check": "Check it."},
        max_turns=max_turns,
        embedder="hash",
    )


def _arith_env(max_turns: int = 3) -> TeamEnv:
    env = TeamEnv(_cfg(max_turns), get_family("arithmetic"))
    env.reset(seed=3)
    return env


def test_action_layout_and_mask() -> None:
    env = _arith_env()
    cfg = env.config
    assert cfg.num_actions == 3 * 3 + 1
    obs = env.observe(CONDUCTOR)
    mask = obs["action_mask"]
    legal = {cfg.action_label(a) for a in np.flatnonzero(mask)}
    # submit is masked until some worker proposed an answer; instructions a worker does not take are masked
    assert legal == {"solver:solve", "solver:revise", "calculator:check", "critic:check"}
    assert obs["observation"].dtype == np.float32
    assert obs["observation"].shape == (env.encoder.size,)
    with pytest.raises(IllegalActionError, match="masked"):
        env.step(cfg.submit_action)
    with pytest.raises(IllegalActionError, match="out of range"):
        env.step(99)


def test_preconditions_mask_turns_with_nothing_to_work_on() -> None:
    base = _cfg()
    workers = (
        dataclasses.replace(base.workers[0], requires=(("revise", "message"),)),
        base.workers[1],
        dataclasses.replace(base.workers[2], requires=(("check", "candidate"),)),
    )
    env = TeamEnv(dataclasses.replace(base, workers=workers), get_family("arithmetic"))
    env.reset(seed=3)
    cfg, enc = env.config, env.encoder
    task = env.task
    assert task is not None

    def legal() -> set[str]:
        obs = env.observe(CONDUCTOR)
        # the mask recovered from the observation vector alone agrees with the env's
        np.testing.assert_array_equal(enc.legal_mask(obs["observation"])[0], obs["action_mask"])
        return {cfg.action_label(a) for a in np.flatnonzero(obs["action_mask"])}

    assert legal() == {"solver:solve", "calculator:check"}  # nothing to revise or review yet
    with pytest.raises(IllegalActionError, match="masked"):
        env.step(cfg.action_id("critic", "check"))
    env.step(cfg.action_id("solver", "solve"))
    env.step({"text": "I do not know.", "tokens": 4})
    assert legal() == {"solver:solve", "solver:revise", "calculator:check"}  # a message, no candidate
    env.step(cfg.action_id("solver", "revise"))
    env.step({"text": f"Answer: {task.answer}", "tokens": 3})
    assert legal() == {"solver:solve", "solver:revise", "calculator:check", "critic:check", "submit"}
    with pytest.raises(ValueError, match=r"requires: 'fly' is not one of its instructions"):
        dataclasses.replace(base, workers=(dataclasses.replace(base.workers[0], requires=(("fly", "message"),)),))


def test_submit_terminates_and_scores_with_the_verifier() -> None:
    env = _arith_env()
    task = env.task
    assert task is not None
    env.step(env.config.action_id("solver", "solve"))
    assert env.agent_selection == "solver"
    env.step({"text": f"The result is {task.answer}. Answer: {task.answer}", "tokens": 12})
    assert env.agent_selection == CONDUCTOR
    assert env.step_reward_vector["token_cost"] == pytest.approx(-0.12)
    flags = derive_flags(env.state_dict())
    assert flags["has_candidate"] and flags["candidate"] is not None
    env.step(env.config.submit_action)
    assert all(env.terminations.values()) and not any(env.truncations.values())
    assert env.step_reward_vector["success"] == 1.0
    assert env.final_verdict is not None and env.final_verdict.correct


def test_give_up_ends_a_hopeless_episode_as_a_failure() -> None:
    env = TeamEnv(dataclasses.replace(_cfg(), give_up=True), get_family("arithmetic"))
    env.reset(seed=3)
    obs = env.observe(CONDUCTOR)
    assert obs["action_mask"][env.config.submit_action] == 1  # legal before any candidate
    np.testing.assert_array_equal(env.encoder.legal_mask(obs["observation"])[0], obs["action_mask"])
    env.step(env.config.action_id("solver", "solve"))
    env.step({"text": "I do not know.", "tokens": 4})
    env.step(env.config.submit_action)
    assert all(env.terminations.values()) and not any(env.truncations.values())
    assert env.step_reward_vector["success"] == 0.0
    assert env.final_verdict is not None and not env.final_verdict.correct
    assert "gave up" in env.final_verdict.reason
    # without the option, submit waits for a candidate (test_action_layout_and_mask)
    assert _arith_env().observe(CONDUCTOR)["action_mask"][env.config.submit_action] == 0


def test_budget_leaves_only_submit_or_truncates() -> None:
    env = _arith_env(max_turns=2)
    task = env.task
    assert task is not None
    wrong = str(int(float(task.answer)) + 1)
    for _ in range(2):
        env.step(env.config.action_id("solver", "solve"))
        env.step({"text": f"Answer: {wrong}", "tokens": 3})
    # budget spent with a candidate: one last decision, and submit is the only legal action
    assert not any(env.truncations.values()) and env.agent_selection == CONDUCTOR
    assert np.flatnonzero(env.observe(CONDUCTOR)["action_mask"]).tolist() == [env.config.submit_action]
    env.step(env.config.submit_action)
    assert env.step_reward_vector["success"] == 0.0 and all(env.terminations.values())
    # budget spent with nothing to submit: truncation, no verdict
    env2 = _arith_env(max_turns=2)
    for _ in range(2):
        env2.step(env2.config.action_id("solver", "solve"))
        env2.step({"text": "I do not know.", "tokens": 4})
        assert env2.step_reward_vector["format"] == -1.0
    assert all(env2.truncations.values()) and not any(env2.terminations.values())
    assert env2.final_verdict is None


def test_visibility_per_worker() -> None:
    env = _arith_env(max_turns=5)
    env.step(env.config.action_id("solver", "solve"))
    env.step({"text": "SOLVER-SAYS 5. Answer: 5", "tokens": 3})
    env.step(env.config.action_id("critic", "check"))
    env.step({"text": "CRITIC-SAYS fine", "tokens": 2})
    env.step(env.config.action_id("critic", "check"))
    critic_chat = env.observe("critic")["chat"][-1]["content"]
    assert "CRITIC-SAYS" in critic_chat and "SOLVER-SAYS" not in critic_chat  # sees: own
    env.step({"text": "CRITIC-SAYS again", "tokens": 2})
    env.step(env.config.action_id("solver", "revise"))
    solver_chat = env.observe("solver")["chat"]
    assert "SOLVER-SAYS" in solver_chat[-1]["content"] and "CRITIC-SAYS" in solver_chat[-1]["content"]
    assert "Fix it." in solver_chat[-1]["content"]  # the conductor's instruction reaches the worker


def test_worker_out_of_turn_is_rejected() -> None:
    env = _arith_env()
    env.step(env.config.action_id("solver", "solve"))
    env.agent_selection = "critic"  # simulate a buggy driver
    with pytest.raises(IllegalActionError, match="did not pick"):
        env.step("hello")


def test_observation_is_a_function_of_the_structured_state() -> None:
    env = _arith_env(max_turns=5)
    env.step(env.config.action_id("solver", "solve"))
    env.step({"text": "2 + 2 = 4. Answer: 4", "tokens": 9})
    enc = ObservationEncoder(env.config)
    state = env.state_dict()
    assert "answer" not in state["task"]  # the ground truth never enters the state
    np.testing.assert_array_equal(enc.encode(state), env.observe(CONDUCTOR)["observation"])
    names = enc.feature_names()
    assert len(names) == enc.size
    vec = enc.encode(state)
    assert vec[names.index("has_candidate")] == 1.0
    assert vec[names.index("last_worker_solver")] == 1.0
    assert vec[names.index("turn_frac")] == pytest.approx(1 / 5)


def test_pettingzoo_api_and_seed_on_a_users_jsonl_family(tmp_path: Path) -> None:
    data = tmp_path / "qa.jsonl"
    rows = [{"question": f"What is {i} + {2 * i}?", "answer": str(3 * i)} for i in range(1, 41)]
    data.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    family = get_family("jsonl", path=str(data))
    cfg = dataclasses.replace(load_team("arithmetic").env, embedder="hash")
    api_test(TeamEnv(cfg, family), num_cycles=30)
    seed_test(lambda: TeamEnv(cfg, family), num_cycles=20)


def test_env_id_is_versioned_and_its_history_is_in_the_spec_table() -> None:
    import re

    import envs.team_env as team_env

    version = re.fullmatch(r"orchestra_team_v(\d+)", team_env.TeamEnv.metadata["name"])
    assert version is not None and team_env.TeamEnv.metadata["name"] == team_env.ENV_ID
    doc = team_env.__doc__ or ""
    assert f"``{team_env.ENV_ID}``" in doc and f"v{version.group(1)}:" in doc.split("Version history", 1)[1]


def test_a_priced_worker_charges_its_price_per_call_and_per_token() -> None:
    cfg = _cfg()
    solver = dataclasses.replace(cfg.workers[0], price_per_call=0.05, price_per_token=0.002)
    cfg = dataclasses.replace(cfg, workers=(solver, *cfg.workers[1:]), reward_weights={"success": 1.0, "price": 1.0})
    env = TeamEnv(cfg, get_family("arithmetic"))
    env.reset(seed=3)
    task = env.task
    assert task is not None
    env.step(cfg.action_id("solver", "solve"))
    env.step({"text": f"Answer: {task.answer}", "tokens": 20})
    assert env.step_reward_vector["price"] == pytest.approx(-(0.05 + 0.002 * 20))
    env.step(cfg.action_id("calculator", "check"))
    env.step({"text": "N/A", "tokens": 0, "verdict": "n/a"})
    assert env.step_reward_vector["price"] == 0.0  # an unpriced worker costs nothing
    env.step(cfg.submit_action)
    assert env.rewards[CONDUCTOR] == pytest.approx(1.0)
    with pytest.raises(ValueError, match=r"workers\[0\] \(solver\)\.price\.per_call: must be >= 0"):
        dataclasses.replace(cfg, workers=(dataclasses.replace(solver, price_per_call=-1.0), *cfg.workers[1:]))


def test_demonstrations_come_before_the_real_turn_laid_out_like_it() -> None:
    cfg = _cfg()
    solver = dataclasses.replace(
        cfg.workers[0], role_prompt="You solve.", examples=(("What is 2 + 2?", "print(2 + 2)"),)
    )
    env = TeamEnv(dataclasses.replace(cfg, workers=(solver, *cfg.workers[1:])), get_family("arithmetic"))
    env.reset(seed=3)
    assert env.task is not None
    env.step(env.config.action_id("solver", "solve"))
    chat = env.worker_chat("solver")
    assert [m["role"] for m in chat] == ["system", "user", "assistant", "user"]
    assert chat[1]["content"] == "Solve it.\n\nTask:\nWhat is 2 + 2?" and chat[2]["content"] == "print(2 + 2)"
    assert chat[3]["content"] == f"Solve it.\n\nTask:\n{env.task.prompt}"
    with pytest.raises(ValueError, match=r"\(calculator\)\.examples: only an llm worker"):
        TeamEnvConfig(
            name="t",
            workers=(cfg.workers[0], dataclasses.replace(cfg.workers[1], examples=(("q", "a"),))),
            instructions=cfg.instructions,
        )
