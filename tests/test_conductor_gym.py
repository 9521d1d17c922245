"""The conductor's Gymnasium view: check_env, seeding, and the safety rails (allow-list, budgets, approval)."""

from __future__ import annotations

import io
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from envs.config import TeamEnvConfig, WorkerSpec
from envs.tasks.base import Task
from envs.tasks.registry import get_family
from orchestra.backends.base import Completion, GenerationParams, GenerationRequest, Usage
from orchestra.backends.tools import ToolBackend
from orchestra.runtime.conductor_gym import ConductorGymEnv, RailViolation, SafetyRails, terminal_approval
from orchestra.runtime.team_file import TeamSpec, WorkerRuntime
from orchestra.runtime.workers import Worker

FAMILY = get_family("arithmetic")


class ScriptedBackend:
    """A fake LLM: ``reply(task, transcript) -> text``; every completion costs ``tokens`` tokens."""

    def __init__(self, reply: Callable[[Task, Sequence[dict]], str], tokens: int = 10, model_id: str = "fake") -> None:
        self.reply, self.tokens, self.model_id = reply, tokens, model_id
        self.calls = 0

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        self.calls += len(requests)
        out = []
        for r in requests:
            text = self.reply(r.context["task"], r.context["transcript"])
            out.append(
                Completion(
                    text, (1,) * self.tokens, (-0.1,) * self.tokens, "stop", Usage(5, self.tokens), self.model_id
                )
            )
        return out


def make_team(cfg: TeamEnvConfig, family: str, tools: dict[str, str] | None = None) -> TeamSpec:
    """A TeamSpec built in code (no YAML): LLM workers get backend "fake", tool workers their tool."""
    tools = tools or {}
    runtimes = {
        w.name: WorkerRuntime(
            w.name, w.kind, None if w.kind == "tool" else "fake", tools.get(w.name), GenerationParams()
        )
        for w in cfg.workers
    }
    return TeamSpec(Path("<test>"), family, cfg, {"fake": {"type": "fake"}}, runtimes, {})


CFG = TeamEnvConfig(
    name="gym-test",
    workers=(
        WorkerSpec("solver", "llm", ("solve", "revise"), "all", True),
        WorkerSpec("calculator", "tool", ("check",), "all", True),
        WorkerSpec("critic", "llm", ("check",), "all", False),
    ),
    instructions={"solve": "Solve.", "revise": "Revise.", "check": "Check."},
    max_turns=4,
    embedder="hash",
)


def make_env(rails: SafetyRails | None = None, cfg: TeamEnvConfig = CFG, seed: int = 0) -> ConductorGymEnv:
    team = make_team(cfg, "arithmetic", {"calculator": "calculator"})
    workers = {
        "solver": Worker(
            "solver", "llm", ScriptedBackend(lambda t, _: f"Answer: {t.answer}"), GenerationParams(), "v1"
        ),
        "calculator": Worker("calculator", "tool", ToolBackend(FAMILY.tools()), GenerationParams(), "v1", "calculator"),
        "critic": Worker(
            "critic", "llm", ScriptedBackend(lambda t, _: "Looks fine.", tokens=5), GenerationParams(), "v1"
        ),
    }
    workers = {k: v for k, v in workers.items() if k in cfg.worker_names}
    return ConductorGymEnv(team, FAMILY, workers, rails, seed=seed)


def A(label: str, cfg: TeamEnvConfig = CFG) -> int:
    return cfg.submit_action if label == "submit" else cfg.action_id(*label.split(":"))


def test_check_env_passes() -> None:
    # Gymnasium's checker steps random samples of the action space, which know nothing of masks:
    # "refuse" lets it step a masked one (not executed) where the default would raise
    env = make_env(SafetyRails(on_illegal="refuse"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any complaint of the checker fails the test ...
        # ... except unbounded observations: the layout is TeamEnv's, whose Box is unbounded too
        warnings.filterwarnings("ignore", message=r".*Box observation space (minimum|maximum) value is")
        check_env(env.unwrapped, skip_render_check=True)
    obs, info = env.reset(seed=1)
    assert obs.dtype == np.float32 and obs.shape == env.observation_space.shape
    assert env.action_masks().dtype == bool and env.action_masks().shape == (CFG.num_actions,)
    assert "state" in info and "reward_vector" in info
    # a refused action changes nothing and is reported
    obs2, r, term, trunc, info = env.step(A("submit"))
    assert (obs2 == obs).all() and r == 0.0 and not (term or trunc)
    assert info["rail"] == "illegal" and "masked by the env" in info["illegal"] and info["rails"]["rails/refused"] == 1


def test_a_masked_action_raises_by_default() -> None:
    env = make_env()
    env.reset(seed=0)
    with pytest.raises(RailViolation, match=r"submit.*masked by the env"):
        env.step(A("submit"))


def test_step_runs_the_worker_and_reports() -> None:
    env = make_env()
    env.reset(seed=3)
    _, r, term, trunc, info = env.step(A("solver:solve"))
    assert not (term or trunc) and info["tokens"] == 10 and info["episode_tokens"] == 10
    assert info["state"]["transcript"][-1]["worker"] == "solver"
    assert info["reward_vector"]["turn_cost"] == -1.0 and info["reward_vector"]["token_cost"] == pytest.approx(-0.1)
    assert r == pytest.approx(CFG.scalarise(info["reward_vector"]))
    assert env.action_masks()[A("submit")]
    _, r, term, trunc, info = env.step(A("submit"))
    assert term and not trunc and info["reward_vector"]["success"] == 1.0
    m = info["episode_metrics"]
    assert m["rollout/success_rate"] == 1.0 and m["rollout/ep_len_mean"] == 2 and m["rollout/ep_tokens_mean"] == 10
    with pytest.raises(RuntimeError, match="reset"):
        env.step(A("solver:solve"))


def _play(
    env: ConductorGymEnv, seed: int, rng: np.random.Generator
) -> tuple[list[int], list[np.ndarray], list[float], str]:
    """A random masked agent plays one episode."""
    obs, info = env.reset(seed=seed)
    task_id = info["state"]["task"]["id"]
    actions, observations, rewards = [], [obs], []
    done = False
    while not done:
        a = int(rng.choice(np.flatnonzero(env.action_masks())))
        obs, r, term, trunc, info = env.step(a)
        actions.append(a)
        observations.append(obs)
        rewards.append(r)
        done = term or trunc
    return actions, observations, rewards, task_id


def test_same_seed_same_task_and_trajectory() -> None:
    a = _play(make_env(), 11, np.random.default_rng(0))
    b = _play(make_env(), 11, np.random.default_rng(0))
    assert a[0] == b[0] and a[2] == b[2] and a[3] == b[3]
    assert all((x == y).all() for x, y in zip(a[1], b[1], strict=True))
    c = _play(make_env(), 12, np.random.default_rng(0))
    assert c[3] != a[3]
    # without a seed, successive resets follow the env's own seeded stream
    e1, e2 = make_env(seed=5), make_env(seed=5)
    assert [e1.reset()[1]["state"]["task"]["id"] for _ in range(3)] == [
        e2.reset()[1]["state"]["task"]["id"] for _ in range(3)
    ]


def test_allow_list_filters_and_never_lets_a_filtered_action_through() -> None:
    rails = SafetyRails(allow=("solver:*", "submit"))
    env = make_env(rails)
    rng = np.random.default_rng(0)
    for ep in range(15):
        actions, *_ = _play(env, ep, rng)
        labels = {CFG.action_label(a) for a in actions}
        assert labels <= {"solver:solve", "solver:revise", "submit"}
        assert all(m["worker"] == "solver" for m in env.team_env.transcript)
    assert env.rail_totals["rails/filtered"] > 0
    env.reset(seed=0)
    assert not env.action_masks()[A("critic:check")]
    with pytest.raises(RailViolation, match=r"critic:check.*rails.allow"):
        env.step(A("critic:check"))
    with pytest.raises(ValueError, match="matches no action"):
        make_env(SafetyRails(allow=("planner:solve",)))


def test_allow_list_dead_end_truncates() -> None:
    """Team budget spent with a candidate: only submit is legal in the env, and the allow-list forbids it."""
    cfg = TeamEnvConfig("t1", CFG.workers, CFG.instructions, max_turns=1, embedder="hash")
    env = make_env(SafetyRails(allow=("solver:solve",)), cfg=cfg)
    env.reset(seed=0)
    _, _, term, trunc, info = env.step(A("solver:solve", cfg))
    assert trunc and not term and info["rail"] == "allow"


def test_turn_and_token_budgets_truncate_and_report() -> None:
    env = make_env(SafetyRails(max_turns=2))
    env.reset(seed=0)
    _, _, term, trunc, info = env.step(A("critic:check"))
    assert not (term or trunc) and info["rail"] is None
    _, _, term, trunc, info = env.step(A("critic:check"))
    assert trunc and not term and info["rail"] == "max_turns"
    assert info["episode_metrics"]["rails/budget_truncations"] == 1
    env = make_env(SafetyRails(max_tokens=15))  # the solver spends 10 tokens per message
    env.reset(seed=0)
    _, _, _, trunc, info = env.step(A("solver:solve"))
    assert not trunc
    _, _, _, trunc, info = env.step(A("solver:revise"))
    assert trunc and info["rail"] == "max_tokens" and info["episode_tokens"] == 20
    assert env.rail_totals["rails/budget_truncations"] == 1


def test_denied_approval_masks_the_action_for_this_decision() -> None:
    asked: list[str] = []

    def deny(label: str, state: Mapping[str, Any]) -> bool:
        asked.append(label)
        return False

    env = make_env(SafetyRails(approve=deny))
    env.reset(seed=0)
    env.step(A("solver:solve"))  # not risky: no question
    assert asked == []
    obs_before = env.team_env.observe("conductor")["observation"]
    obs, r, term, trunc, info = env.step(A("submit"))
    assert asked == ["submit"] and info["denied"] == "submit" and not (term or trunc) and r == 0.0
    assert (obs == obs_before).all() and env.team_env.final_verdict is None
    assert not env.action_masks()[A("submit")]
    with pytest.raises(RailViolation, match="denied by the approver"):
        env.step(A("submit"))
    env.step(A("critic:check"))  # the next decision offers submit again
    assert env.action_masks()[A("submit")]
    # nothing else legal (team budget spent): a denial truncates
    cfg = TeamEnvConfig("t1", CFG.workers, CFG.instructions, max_turns=1, embedder="hash")
    env = make_env(SafetyRails(approve=deny), cfg=cfg)
    env.reset(seed=0)
    env.step(A("solver:solve", cfg))
    _, _, term, trunc, info = env.step(A("submit", cfg))
    assert trunc and not term and info["rail"] == "approval" and info["episode_metrics"]["rails/denied"] == 1
    # approved: executed
    env = make_env(SafetyRails(approve=lambda label, state: True))
    env.reset(seed=0)
    env.step(A("solver:solve"))
    _, _, term, _, _ = env.step(A("submit"))
    assert term


def test_terminal_approval_reads_y_or_n() -> None:
    state = {"task": {"id": "x1", "prompt": "What is 2+2?"}, "turn": 1, "max_turns": 4, "flags": {"candidate": "4"}}
    out = io.StringIO()
    assert terminal_approval(io.StringIO("y\n"), out)("submit", state) is True
    shown = out.getvalue()
    assert "approve submit? [y/N]" in shown and "What is 2+2?" in shown and "candidate answer: 4" in shown
    assert terminal_approval(io.StringIO("YES\n"), io.StringIO())("submit", state) is True
    assert terminal_approval(io.StringIO("n\n"), io.StringIO())("submit", state) is False
    assert terminal_approval(io.StringIO("\n"), io.StringIO())("submit", state) is False  # default: No
    assert terminal_approval(io.StringIO(""), io.StringIO())("submit", state) is False  # closed input: No
    # wired into the env: a person says no, then yes
    env = make_env(SafetyRails(approve=terminal_approval(io.StringIO("n\ny\n"), io.StringIO())))
    env.reset(seed=0)
    env.step(A("solver:solve"))
    assert not env.step(A("submit"))[2]
    env.step(A("solver:revise"))
    assert env.step(A("submit"))[2]
