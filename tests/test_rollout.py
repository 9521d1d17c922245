"""Integration: record episodes with real SmolLM2 workers (llama.cpp, short generations)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from envs.tasks.registry import get_family
from orchestra.jobs.record import RecordConfig, record
from orchestra.runtime.conductors import conductor_factory
from orchestra.runtime.llm_conductor import LLMConductor
from orchestra.runtime.rollout import RolloutEngine, episode_metrics, plan_jobs
from orchestra.runtime.session import RunOptions
from orchestra.runtime.team_file import load_team
from orchestra.runtime.workers import build_workers
from trajectories import TrajectoryWriter, read_trajectories

pytestmark = pytest.mark.slow


def short_team(tmp_path: Path, name: str = "arithmetic", max_tokens: int = 24) -> Path:
    """The built-in team with short generations and the hash embedder (keeps the test quick)."""
    raw = yaml.safe_load(load_team(name).path.read_text())
    raw["embedder"] = "hash"
    for w in raw["workers"]:
        if w.get("kind", "llm") == "llm":
            w.setdefault("generation", {})["max_tokens"] = max_tokens
    p = tmp_path / f"{name}-short.yaml"
    p.write_text(yaml.safe_dump(raw, sort_keys=False))  # keep the instruction order: it is the action layout
    return p


def test_record_with_real_smollm2_workers(tmp_path: Path) -> None:
    team_file = short_team(tmp_path)
    cfg = RecordConfig(
        team=str(team_file),
        conductor="round_robin",
        episodes=3,
        run=RunOptions(seed=1, num_envs=2, cache_path=str(tmp_path / "cache.sqlite"), progress=False),
    )
    res = record(cfg, tmp_path / "a.jsonl")
    report = read_trajectories(res.trajectories, strict=True)
    assert len(report.episodes) == 3 and not report.problems
    ep = report.episodes[0]
    # round robin: solver, calculator, critic, then submit; the critic's check is masked until some message holds a
    # candidate answer, and then round robin takes the first legal action (the sampled solver may write no number)
    third = "critic:check" if ep.steps[2].state["flags"]["has_candidate"] else "solver:solve"
    assert [s.action.label for s in ep.steps] == ["solver:solve", "calculator:check", third, "submit"]
    solver_msg = ep.steps[0].message
    assert solver_msg is not None and solver_msg.model_id.startswith("llamacpp:")
    assert 0 < len(solver_msg.token_ids) == len(solver_msg.logprobs) == solver_msg.completion_tokens <= 24
    assert all(lp <= 0 for lp in solver_msg.logprobs)
    assert solver_msg.prompt_version and ep.team.prompt_versions["solver"] == solver_msg.prompt_version
    tool_msg = ep.steps[1].message
    assert tool_msg is not None and tool_msg.verdict in ("pass", "fail", "n/a") and tool_msg.token_ids == []
    assert ep.terminated and not ep.truncated and ep.steps[-1].terminated
    assert ep.final_observation is not None and len(ep.final_observation) == len(ep.steps[0].observation)
    assert ep.return_ == pytest.approx(sum(s.reward.scalar for s in ep.steps))
    # run directory: resolved config, metrics
    assert (res.run_dir / "config.json").exists() and (res.run_dir / "metrics.csv").exists()
    assert "agent/solver/parse_fail_rate" in res.metrics
    # a second run of the same recording is served from the response cache and is identical
    res2 = record(cfg, tmp_path / "b.jsonl")
    assert res2.metrics["rollout/cache_hits"] == res2.metrics["rollout/llm_calls"] > 0
    for e1, e2 in zip(report.episodes, read_trajectories(res2.trajectories).episodes, strict=True):
        assert [s.message.text if s.message else None for s in e1.steps] == [
            s.message.text if s.message else None for s in e2.steps
        ]
        assert e1.success == e2.success and e1.return_ == e2.return_


def test_batched_engine_equals_one_env_at_a_time(tmp_path: Path) -> None:
    """Stepping 3 envs at once gives the same episodes as one env at a time (greedy workers on the serial llama.cpp
    path, whose outputs do not depend on the batch; the batched path's bound: tests/test_backends_llamacpp.py)."""
    team = load_team(short_team(tmp_path, max_tokens=16))
    family = get_family(team.family)
    tasks = family.generate("test", 3, seed=4)
    out = {}
    for n_envs in (1, 3):
        workers = build_workers(team, family.tools(), use_cache=False, serial=True)
        engine = RolloutEngine(
            team,
            family,
            workers,
            conductor_factory("heuristic", team),
            conductor_name="heuristic",
            num_envs=n_envs,
            progress=False,
        )
        with TrajectoryWriter(tmp_path / f"n{n_envs}.jsonl") as w:
            eps = engine.run(plan_jobs(tasks, 0, "x"), writer=w)
        out[n_envs] = {
            e.episode_id: [(s.action.id, s.message.text if s.message else None) for s in e.steps] for e in eps
        }
        assert episode_metrics(eps)["rollout/mean_turns"] >= 1
    assert out[1] == out[3]


def test_llm_conductor_names_a_legal_speaker_with_smollm2(tmp_path: Path) -> None:
    team = load_team(short_team(tmp_path))
    conductor = conductor_factory("llm", team)()
    assert isinstance(conductor, LLMConductor)
    cfg = team.env
    mask = np.zeros(cfg.num_actions, dtype=np.int8)
    for label in ("solver:solve", "calculator:check", "critic:check"):
        mask[cfg.action_id(*label.split(":"))] = 1
    state = {"task": {"prompt": "What is 7 + 5?"}, "turn": 0, "max_turns": 5, "transcript": []}
    a = conductor.act(np.zeros(3), mask, state)
    assert mask[a] == 1 and conductor.decisions == 1
    # parsing: labels first, then a bare worker name; junk falls back and is counted
    legal = [int(x) for x in np.flatnonzero(mask)]
    assert conductor.parse("I pick calculator:check now", legal) == cfg.action_id("calculator", "check")
    assert conductor.parse("the critic should speak", legal) == cfg.action_id("critic", "check")
    assert conductor.parse("???", legal) is None
