"""Robustness wrappers (envs.perturb): PettingZoo conformance, seeded and recorded perturbations, nothing of a lost
message left where a conductor can read it."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from pettingzoo.test import api_test, seed_test

from envs.perturb import ActionNoise, MessageDrop, TextNoise, WorkerOutage, parse_perturbation, perturbed
from envs.tasks.registry import get_family
from envs.team_env import CONDUCTOR, IllegalActionError, TeamEnv
from orchestra.runtime.team_file import builtin_teams, load_team


def make_env(team_name: str = "arithmetic") -> TeamEnv:
    team = load_team(team_name)
    return TeamEnv(dataclasses.replace(team.env, embedder="hash"), get_family(team.family))


ALL = ["drop=0.5", "noise=0.2", "outage=1.0", "action_noise=0.3"]


@pytest.mark.parametrize("team", builtin_teams())
def test_every_wrapper_passes_pettingzoo_api_and_seed_tests(team: str) -> None:
    for spec in ALL:
        api_test(perturbed(make_env(team), [spec], seed=1), num_cycles=30)
    api_test(perturbed(make_env(team), ALL, seed=1), num_cycles=30)
    seed_test(lambda: perturbed(make_env(team), ALL, seed=1), num_cycles=20)


def _solver_turn(env: object, text: str) -> None:
    """Conductor picks the first legal LLM-worker action; the chosen worker answers ``text``."""
    obs = env.observe(CONDUCTOR)  # type: ignore[attr-defined]
    cfg = env.unwrapped.config  # type: ignore[attr-defined]
    llm = {w.name for w in cfg.workers if w.kind == "llm"}
    a = next(int(a) for a in np.flatnonzero(obs["action_mask"]) if cfg.decode_action(int(a))[0] in llm)
    env.step(a)  # type: ignore[attr-defined]
    env.step({"text": text, "tokens": 7})  # type: ignore[attr-defined]


def test_drop_loses_the_message_and_records_only_that_it_did() -> None:
    env = MessageDrop(make_env(), 1.0, seed=0)
    env.reset(seed=3)
    secret = "the answer is 4217"
    _solver_turn(env, secret)
    entry = env.unwrapped.transcript[-1]
    assert entry["text"] == "" and entry["perturbed"] == "drop" and entry["tokens"] == 7  # the cost was paid
    assert env.events == [{"kind": "drop", "turn": 0, "agent": entry["worker"], "chars": len(secret)}]
    state = env.unwrapped.infos[CONDUCTOR]["state"]
    assert "4217" not in json.dumps(state)  # nothing of the lost text where the conductor reads
    chat = env.unwrapped.worker_chat(entry["worker"])
    assert "4217" not in json.dumps(chat)
    env0 = MessageDrop(make_env(), 0.0, seed=0)
    env0.reset(seed=3)
    _solver_turn(env0, secret)
    assert env0.unwrapped.transcript[-1]["text"] == secret and env0.events == []


def test_noise_is_seeded_per_episode_and_at_its_rate() -> None:
    text = "x" * 2000

    def noised(seed: int, episode: int) -> str:
        env = TextNoise(make_env(), 0.1, seed=seed)
        env.reset(seed=episode)
        _solver_turn(env, text)
        return str(env.unwrapped.transcript[-1]["text"])

    a = noised(0, 5)
    assert a == noised(0, 5) and a != noised(0, 6) and a != noised(1, 5)
    changed = sum(c != "x" for c in a) / len(a)
    assert 0.06 < changed < 0.12  # 10% hit, 1 in 95 printable draws is an "x" again
    words = TextNoise(make_env(), 0.5, seed=0, unit="word")
    words.reset(seed=5)
    _solver_turn(words, " ".join(str(i) for i in range(400)))
    kept = words.unwrapped.transcript[-1]["text"].split()
    assert 150 < len(kept) < 250 and kept == sorted(kept, key=int)  # words dropped, order kept


def test_action_noise_executes_a_legal_action_and_records_both() -> None:
    env = ActionNoise(make_env(), 1.0, seed=0)
    env.reset(seed=2)
    mask = env.observe(CONDUCTOR)["action_mask"]
    submit = env.unwrapped.config.submit_action
    env.step(submit if mask[submit] else int(np.flatnonzero(mask)[0]))
    (e,) = env.events
    assert mask[e["executed"]] == 1 and env.executed_action == e["executed"]


def test_outage_masks_one_worker_for_the_episode() -> None:
    env = WorkerOutage(make_env(), 1.0, seed=0)
    cfg = env.unwrapped.config
    outs = set()
    for ep in range(12):
        env.reset(seed=ep)
        assert env.out is not None and env.events[0] == {"kind": "outage", "turn": 0, "agent": env.out}
        outs.add(env.out)
        mask = env.observe(CONDUCTOR)["action_mask"]
        assert not any(mask[a] for a in range(cfg.num_actions) if cfg.decode_action(a)[0] == env.out)
        np.testing.assert_array_equal(env.unwrapped.infos[CONDUCTOR]["action_mask"], mask)
        banned = next(a for a in range(cfg.num_actions) if cfg.decode_action(a)[0] == env.out)
        if env.unwrapped.action_mask()[banned]:
            with pytest.raises(IllegalActionError, match="is out for this episode"):
                env.step(banned)
    assert len(outs) > 1  # drawn per episode among the LLM workers
    with pytest.raises(ValueError, match="not workers of team"):
        WorkerOutage(make_env(), 0.5, workers=["nobody"])


def test_specs_parse_stack_and_refuse_bad_input() -> None:
    assert parse_perturbation("drop=0.2") == ("drop", 0.2)
    env = perturbed(make_env(), ["action_noise=0.1", "drop=0.2", "outage=0.5"], seed=3)
    assert [type(env).__name__, type(env.env).__name__, type(env.env.env).__name__] == [
        "ActionNoise",
        "WorkerOutage",
        "MessageDrop",
    ]
    for bad, msg in (
        ("drop", "KIND=STRENGTH"),
        ("loss=0.1", "KIND=STRENGTH"),
        ("drop=x", "not a number"),
        ("drop=2", r"in \[0, 1\]"),
    ):
        with pytest.raises(ValueError, match=msg):
            parse_perturbation(bad)
    with pytest.raises(ValueError, match="at most once"):
        perturbed(make_env(), ["drop=0.1", "drop=0.2"])


# ---------------------------------------------------------------------------------------------------------------
# the rollout engine under perturbation (scripted workers: the wrappers are what is tested)


def _run(perturb: tuple[str, ...], conductor: str = "heuristic", n: int = 8) -> list:  # type: ignore[type-arg]
    from envs.tasks.registry import get_family as family_of
    from orchestra.runtime.conductors import conductor_factory
    from orchestra.runtime.rollout import RolloutEngine, plan_jobs
    from tests.scripted import arithmetic_team, scripted_workers

    team = arithmetic_team()
    family = family_of(team.family)
    engine = RolloutEngine(
        team,
        family,
        scripted_workers(team),
        conductor_factory(conductor, team, 0),
        conductor_name=conductor,
        num_envs=4,
        progress=False,
        perturb=perturb,
        perturb_seed=7,
    )
    return engine.run(plan_jobs(family.generate("test", n, 0), 0, "p"))


def test_engine_records_perturbations_and_the_executed_actions() -> None:
    clean = _run(())
    assert all("perturbations" not in e.metadata for e in clean)
    dropped = _run(("drop=1.0",))
    assert [e.episode_id for e in dropped] == [e.episode_id for e in clean]  # same tasks, paired
    for e in dropped:
        llm_turns = [m for m in e.metadata["final_state"]["transcript"] if m["worker"] in ("solver", "critic")]
        assert llm_turns and all(m["text"] == "" and m["perturbed"] == "drop" for m in llm_turns)
        assert len(e.metadata["perturbations"]) == len(llm_turns) and e.metadata["perturb"] == ["drop=1.0"]
    assert sum(e.success for e in dropped) < sum(e.success for e in clean)  # no LLM text, no answer
    noisy = _run(("action_noise=1.0",), conductor="round_robin")
    for e in noisy:
        events = e.metadata["perturbations"]
        assert len(events) == len(e.steps)  # every decision replaced by a random legal one…
        for st, ev in zip(e.steps, events, strict=True):
            assert st.action.id == ev["executed"] and st.action_mask[st.action.id] == 1  # …and recorded as executed
    again = _run(("action_noise=1.0",), conductor="round_robin")  # seeded: a rerun is perturbed identically
    assert [[st.action.id for st in e.steps] for e in again] == [[st.action.id for st in e.steps] for e in noisy]
    assert [e.metadata["perturbations"] for e in again] == [e.metadata["perturbations"] for e in noisy]


def test_robustness_rows_pair_each_conductor_with_its_clean_run() -> None:
    from orchestra.report.robustness import robustness_rows, robustness_table_md

    clean = _run(()) + _run((), conductor="round_robin")
    drop = _run(("drop=1.0",)) + _run(("drop=1.0",), conductor="round_robin")
    rows = robustness_rows(clean, {"drop=1.0": drop})
    assert {(r.conductor, r.perturbation) for r in rows} == {("heuristic", "drop=1.0"), ("round_robin", "drop=1.0")}
    for r in rows:
        mine = [e for e in clean if e.conductor.name == r.conductor]
        assert r.tasks == len(mine) and r.clean_success == pytest.approx(np.mean([e.success for e in mine]))
        assert r.diff == pytest.approx(r.perturbed_success - r.clean_success) and r.diff_lo <= r.diff <= r.diff_hi
        assert r.p_holm >= r.p_mcnemar
    assert "drop=1.0" in robustness_table_md(rows)
