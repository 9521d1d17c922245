"""Instructions in the conductor's own words: the env API (``Instruct``), the human session, the LLM conductor that
writes instructions, and what trajectories and datasets keep of them. Scripted LLM workers, the real env, engine,
calculator, trajectory store and dataset builder (the pseudo-terminal run with SmolLM2 is tests/test_human_pty.py)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest

from envs.embeddings import get_embedder
from envs.observation import ObservationEncoder
from envs.tasks.registry import get_family
from envs.team_env import CONDUCTOR, IllegalActionError, Instruct, TeamEnv
from orchestra.backends.base import Completion, GenerationRequest, Usage
from orchestra.report.summaries import format_dataset_summary, format_episode
from orchestra.runtime.llm_conductor import LLMConductor
from orchestra.runtime.rollout import RolloutEngine, plan_jobs
from policies import QuitSession
from policies.conductors.human import HumanConductor
from policies.learning.dataset import ConductorDataset, build_dataset
from tests.scripted import arithmetic_team, scripted_workers
from trajectories import Episode, TrajectoryWriter, read_trajectories

TEAM = arithmetic_team("hash")
FAMILY = get_family("arithmetic")
OWN = "multiply first, then subtract"


def fresh_env() -> TeamEnv:
    env = TeamEnv(TEAM.env, FAMILY)
    env.reset(seed=3)
    return env


def test_instruct_maps_to_the_nearest_legal_declared_instruction_and_the_worker_reads_the_text() -> None:
    env = fresh_env()
    mapped = env.map_instruction("solver", OWN)
    # at turn 0 only solve is legal for the solver (revise needs a message): the nearest legal one is solve
    assert (mapped.instruction, mapped.action) == ("solve", TEAM.env.action_id("solver", "solve"))
    env.step(Instruct("solver", f"  {OWN} "))
    assert env.agent_selection == "solver"
    chat = env.worker_chat("solver")
    assert chat[-1]["content"].startswith(OWN)  # the text replaces the template ...
    assert TEAM.env.instructions["solve"] not in chat[-1]["content"]  # ... which the worker does not see
    env.step("12 * 3 = 36\nAnswer: 36")
    entry = env.transcript[-1]
    assert entry["instruction"] == "solve" and entry["instruction_text"] == OWN
    # the next declared turn reads its template again
    env.step(TEAM.env.action_id("solver", "revise"))
    assert TEAM.env.instructions["revise"] in env.worker_chat("solver")[-1]["content"]


def test_the_nearest_instruction_is_chosen_by_the_encoders_similarity() -> None:
    env = fresh_env()
    env.step(TEAM.env.action_id("solver", "solve"))
    env.step("2 + 2 = 4\nAnswer: 4")  # now solve and revise are both legal
    text = "The latest answer may be wrong. Redo the calculation using the messages below."
    emb = get_embedder("hash").embed([text, TEAM.env.instructions["solve"], TEAM.env.instructions["revise"]])
    expected = ["solve", "revise"][int(np.argmax(emb[1:] @ emb[0]))]
    mapped = env.map_instruction("solver", text)
    assert mapped.instruction == expected == "revise"
    assert mapped.similarity == pytest.approx(float(np.max(emb[1:] @ emb[0])), abs=1e-6)


@pytest.mark.parametrize(
    ("worker", "text", "why"),
    [
        ("nobody", "do it", "unknown worker"),
        ("calculator", "check harder", "is a tool"),
        ("solver", "   ", "empty"),
        ("critic", "is it right?", "cannot be given a turn now"),  # critic:check needs a candidate
    ],
)
def test_an_instruction_the_env_cannot_take_is_one_clear_error(worker: str, text: str, why: str) -> None:
    env = fresh_env()
    with pytest.raises(IllegalActionError, match=why):
        env.step(Instruct(worker, text))
    assert env.agent_selection == CONDUCTOR and env.turn == 0  # nothing happened


def human(script: str) -> tuple[HumanConductor, io.StringIO]:
    out = io.StringIO()
    return HumanConductor(TEAM.env, stdin=io.StringIO(script), stdout=out), out


def play(conductor: object, n: int, path: Path | None = None) -> list[Episode]:
    engine = RolloutEngine(
        TEAM, FAMILY, scripted_workers(TEAM), lambda: conductor, conductor_name="human", num_envs=8, progress=False
    )
    jobs = plan_jobs(FAMILY.generate("train", n, 0), 0, "human-train-s0")
    if path is None:
        return engine.run(jobs)
    with TrajectoryWriter(path, resume=path.exists()) as writer:
        return engine.run([j for j in jobs if j.episode_id not in writer.done_ids], writer=writer)


def test_a_human_session_is_one_episode_at_a_time_with_its_outcome_shown() -> None:
    person, out = human(f"solver: {OWN}\nsubmit\n?\n1\n9\ncalculator: check twice\n3\nsubmit\n")
    eps = play(person, 2)
    screen = out.getvalue()
    tasks = [e.steps[0].state["task"]["prompt"] for e in eps]
    # episode 2's task appears only after episode 1's outcome and tally: never interleaved (num_envs was 8)
    assert screen.index(tasks[0]) < screen.index(">>> submitted") < screen.index(tasks[1])
    assert screen.count("=== episode") == 2 and "=== episode 2" in screen
    assert f'--- solver (solve "{OWN}")' in screen  # who said what under which instruction
    assert "  1) solver:solve" in screen and "(tool) Check the latest answer." in screen  # actions, described
    assert "How to answer:" in screen  # ?
    assert "'9' is not an action number (1 to 5)" in screen  # a bad number: asked again
    assert "calculator is a tool" in screen
    assert "reward vector:" in screen and "session: 2 episode(s)" in screen
    first = eps[0].steps[0].action
    assert (first.text, first.label) == (OWN, "solver:solve") and first.similarity is not None
    assert [s.action.text for s in eps[1].steps] == [None, None, None]


def test_quitting_keeps_every_completed_episode_and_resume_continues(tmp_path: Path) -> None:
    path = tmp_path / "human.jsonl"
    person, _ = human(f"solver: {OWN}\nsubmit\n1\nq\n")
    with pytest.raises(QuitSession):
        play(person, 2, path)
    kept = read_trajectories(path).episodes
    assert len(kept) == 1 and kept[0].steps[0].action.text == OWN
    person, out = human("1\nsubmit\n")
    eps = play(person, 2, path)
    assert len(eps) == 1 and eps[0].episode_id != kept[0].episode_id
    assert {e.episode_id for e in read_trajectories(path).episodes} == {kept[0].episode_id, eps[0].episode_id}


def test_custom_instructions_survive_the_file_and_map_to_discrete_actions_in_the_dataset(tmp_path: Path) -> None:
    path = tmp_path / "human.jsonl"
    person, _ = human(f"solver: {OWN}\nsubmit\n1\nsubmit\n")
    play(person, 2, path)
    line = json.loads(path.read_text().splitlines()[0])
    assert line["steps"][0]["action"]["text"] == OWN
    assert "text" not in line["steps"][1]["action"]  # a declared action writes no key for it
    ep = read_trajectories(path).episodes[0]
    shown = format_episode(ep)
    assert f'own instruction: "{OWN}" (mapped to solver:solve' in shown
    ds = build_dataset([path], TEAM.env, ObservationEncoder(TEAM.env))
    assert ds.instruction_texts[0] == OWN and ds.instruction_texts[1:] == [None, None, None]
    assert int(ds.actions[0]) == TEAM.env.action_id("solver", "solve")
    summary = format_dataset_summary(ds.summary())
    assert f'"{OWN}" → solver:solve (action {TEAM.env.action_id("solver", "solve")}' in summary
    back = ConductorDataset.load(ds.save(tmp_path / "d.npz"))
    assert back.instruction_texts == ds.instruction_texts
    assert back.subset([0]).instruction_texts == [OWN, None]


class Replies:
    """A conductor backend that says the given lines in turn."""

    model_id = "scripted-conductor"

    def __init__(self, lines: list[str]) -> None:
        self.lines = list(lines)
        self.prompts: list[str] = []

    def generate(self, requests: list[GenerationRequest]) -> list[Completion]:
        self.prompts += [r.messages[-1].content for r in requests]
        text = self.lines.pop(0)
        return [Completion(text, (1,), (-0.1,), "stop", Usage(1, 1), self.model_id)]


def test_the_instruction_writing_llm_conductor_sends_its_own_words() -> None:
    backend = Replies(["solver: add the numbers first", "submit"])
    llm = LLMConductor(TEAM.env, backend, write_instructions=True)  # type: ignore[arg-type]
    eps = play(llm, 1)
    first = eps[0].steps[0]
    assert (first.action.text, first.action.label) == ("add the numbers first", "solver:solve")
    assert eps[0].steps[0].state["transcript"] == []
    assert eps[0].metadata["final_state"]["transcript"][0]["instruction_text"] == "add the numbers first"
    assert "own instruction" in backend.prompts[0] and llm.written == 1
    assert llm.counters() == {
        "conductor/decisions": 2,
        "conductor/unparsed_replies": 0,
        "conductor/own_instructions": 1,
    }
    # a reply that is neither a move nor an instruction (what SmolLM2-135M mostly says: it answers the task) takes
    # the first legal action, and is counted as such
    lost = LLMConductor(TEAM.env, Replies(["The answer is 12."]), write_instructions=True)  # type: ignore[arg-type]
    env = fresh_env()
    assert lost.act(np.zeros(1), env.action_mask(), env.state_dict()) == int(np.flatnonzero(env.action_mask())[0])
    assert lost.counters()["conductor/unparsed_replies"] == 1
    # declared moves still parse as moves; a tool or a worker that cannot act now is not addressed in free text
    legal = [int(a) for a in np.flatnonzero(fresh_env().action_mask())]
    assert llm.parse_instruction("solver: solve", legal) is None
    assert llm.parse_instruction("calculator: check it", legal) is None
    assert llm.parse_instruction("critic: look again", legal) is None
    assert llm.parse_instruction("[Solver]: 'work step by step'", legal) == Instruct("solver", "work step by step")
    # the template-only conductor never writes one
    plain = LLMConductor(TEAM.env, Replies(["solver: add the numbers first"]))  # type: ignore[arg-type]
    assert plain.act(np.zeros(1), fresh_env().action_mask(), fresh_env().state_dict()) == TEAM.env.action_id(
        "solver", "solve"
    )


@pytest.mark.slow
def test_llm_conductors_share_the_workers_model_and_cache(tmp_path: Path) -> None:
    from orchestra.backends.cache import CachedBackend
    from orchestra.runtime.conductors import conductor_factory
    from orchestra.runtime.session import Session

    session = Session("arithmetic", None, use_cache=True, cache_path=str(tmp_path / "c.sqlite"))
    shared = session.workers["solver"].backend
    assert isinstance(shared, CachedBackend)
    for name in ("llm", "llm_instruct"):
        conductor = conductor_factory(name, session.team, 0, session.backends())()
        assert isinstance(conductor, LLMConductor) and conductor.backend is shared  # not a second, uncached model


def test_the_action_record_checks_its_instruction_text() -> None:
    from trajectories import Action, SchemaError

    ok = Action(id=0, kind="worker", worker="solver", instruction="solve", text=OWN, similarity=0.2)
    assert Action.from_dict(json.loads(json.dumps(ok.to_dict()))) == ok
    plain = Action(id=0, kind="worker", worker="solver", instruction="solve")
    assert "text" not in plain.to_dict() and "similarity" not in plain.to_dict()
    with pytest.raises(SchemaError, match="similarity: an action with an instruction text needs its similarity"):
        Action(id=0, kind="worker", worker="solver", instruction="solve", text=OWN)
    with pytest.raises(SchemaError, match="text: a submit action carries no instruction text"):
        Action(id=9, kind="submit", text=OWN, similarity=0.1)
    with pytest.raises(SchemaError, match="text: expected a non-empty str"):
        Action(id=0, kind="worker", worker="solver", instruction="solve", text="", similarity=0.1)
    with pytest.raises(SchemaError, match="similarity: a similarity without an instruction text"):
        Action(id=0, kind="worker", worker="solver", instruction="solve", similarity=0.1)
