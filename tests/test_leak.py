"""No solution-derived information reaches a conductor, a tool or a worker (issue 12, items 1-2; issue 35, item 6).

* The leak test: each team is played twice on the same tasks with the same scripted worker replies, once as
  generated and once with every solution-bearing field perturbed: for the built-in families the answer, the
  generation level and every hidden metadata field; for a user's data (envs/tasks/user_data.py, one file per
  format) every field of the record that is not the problem's own statement, declared or not (the answer, a
  worked solution, the hidden tests, unrecognised fields). The conductors are every rule of the team's menu,
  ``random``, and two schedules that spend the turn budget (with and without a candidate), so every state kind
  the env can reach occurs: the first decision, a fresh candidate, a reply with no readable answer (a format
  failure), a critic's or reviewer's turn, a tool's pass, fail and n/a, a decision with the budget spent, a submit,
  a give-up (submit without a candidate) and a truncation; the test asserts each was reached, so it fails if
  coverage drops. Everything the conductor and the workers see must be identical between the two runs: every
  recorded state, observation and action mask, every action and message, every step's reward components other than
  ``success``, the final state and observation, every request an LLM worker is sent (a recording backend keeps the
  chat and the sampling parameters) and every tool call (the task view the tool is given, the transcript, its
  result).

  What may differ, and why that is no leak: the verifier's verdict at submit (the episode's score, success and
  verdict reason, the step's ``success`` reward and hence its scalar reward and the return). It is computed after
  the conductor's last decision and is the outcome being measured; a learner sees it only as the reward of a
  finished episode. A checker tool's verdict on a worker's reply is *not* allowed to differ: every tool checks
  the reply against the public view of the task (the prompt, the problem's own data, the visible tests), so its
  pass or fail is a function of what the conductor sees.
* Declared fields: every metadata field a solution perturbation changes is in the task's ``hidden`` list, and a
  built-in family's other fields are the problem's own data (``PUBLIC``), so a new solution-derived field must be
  declared or the test fails.
* A user-data reply's candidate is read from the reply alone: the same whatever the gold answer, a number, text or
  neither.
* Tool-only: the team's ``tool_only`` rule (its tools, no LLM output to work on) solves no held-out task of any
  default family, nor of a user's data.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from envs.config import TeamEnvConfig
from envs.tasks.base import Task, TaskFamily, ToolFn, ToolResult
from envs.tasks.registry import PROTOCOL_FAMILIES, get_family
from envs.tasks.user_data import UserDataFamily, check_item, parse_record
from orchestra.backends.base import Completion, GenerationRequest, Usage
from orchestra.backends.tools import ToolBackend
from orchestra.runtime.conductors import conductor_factory, team_rules
from orchestra.runtime.rollout import RolloutEngine, plan_jobs
from orchestra.runtime.team_file import TeamSpec, load_team
from orchestra.runtime.workers import Worker
from policies import PipelineConductor
from policies.base import ConductorPolicy
from trajectories import Episode

# metadata each family must keep from tools and conductors (derived from the solution)
MUST_HIDE = {
    "arithmetic": {"solution_expression", "steps"},
    "blocksworld": {"optimal_moves", "kind"},
    "logic_grid": {"solution", "kind"},
    "code_synthesis": {"tests"},
}
# metadata a built-in family may show its tool: the problem's own data, stated in the prompt (blocks, clues,
# options, the signature) or needed to check a reply (the visible tests)
PUBLIC = {
    "arithmetic": set(),
    "blocksworld": {"blocks", "init", "goal"},
    "logic_grid": {"houses", "attributes", "values", "clues", "clue_texts", "question", "options"},
    "code_synthesis": {"spec", "params", "function", "signature", "visible_tests"},
}
# the state kinds of the leak test: every team reaches each, and a team with an LLM worker that proposes no
# answer (a critic, a reviewer) reaches its turn too
KINDS = (
    "start",
    "candidate",
    "format_fail",
    "tool_pass",
    "tool_fail",
    "tool_n/a",
    "budget_spent",
    "submitted",
    "gave_up",
    "truncated",
)
CRITIC = "critic_turn"
# one team per family, and the priced arithmetic team (its program writers and the python tool)
TEAMS = (*PROTOCOL_FAMILIES, "arithmetic_priced")
GARBLED = ""  # a reply with no readable answer in any family: a format failure
CRITIQUE = "The latest answer may be wrong: check the calculation and the conditions again."


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


def _programs(task: Task) -> tuple[str, str]:
    """A right and a wrong program for an arithmetic ``task``, written from the ORIGINAL task (a fixed script)."""
    expr = task.metadata["solution_expression"]
    return f"print({expr})", f"print({expr} + 1)"


Script = Mapping[str, tuple[str, ...]]  # task id -> the answer-proposing worker's replies, in turn


def _script(tasks: Sequence[Task], replies: Callable[[Task], tuple[str, str]]) -> Script:
    """Per task the replies its answer-proposing worker gives, in turn, cycling: right, wrong, unreadable on every
    other task, wrong, right, unreadable on the others (a check fails, the revision passes), so every kind of reply
    meets every kind of schedule; on the last task every reply is unreadable (a worker that never answers, whose
    episodes run out of turns)."""
    out = {}
    for i, t in enumerate(tasks):
        right, wrong = replies(t)
        out[t.id] = (right, wrong, GARBLED) if i % 2 == 0 else (wrong, right, GARBLED)
    out[tasks[-1].id] = (GARBLED,) * 3
    return out


class RecordingBackend:
    """A scripted LLM worker that records every request it is sent (the worker, the task id, the chat and the
    sampling parameters). An answer-proposing worker replies from ``script`` (its k-th turn on a task gets the
    task's k-th reply, cycling); any other LLM worker (a critic, a reviewer) always says :data:`CRITIQUE`."""

    model_id = "script"

    def __init__(self, worker: str, script: Script | None, log: list[tuple[Any, ...]]) -> None:
        self.worker, self.script, self.log = worker, script, log

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        out = []
        for r in requests:
            task_id = r.context["task"].id
            self.log.append((self.worker, task_id, r.messages, r.params))
            k = sum(1 for m in r.context["transcript"] if m["worker"] == self.worker)
            text = CRITIQUE if self.script is None else self.script[task_id][k % 3]
            out.append(Completion(text, (1,), (-0.1,), "stop", Usage(5, 1), "script"))
        return out


def _recording_tools(tools: Mapping[str, ToolFn], log: list[tuple[Any, ...]]) -> dict[str, ToolFn]:
    """``tools``, each recording the task view it is called with, the transcript and its result."""

    def spy(name: str, fn: ToolFn) -> ToolFn:
        def tool(task: Task, transcript: Sequence[Mapping[str, Any]]) -> ToolResult:
            result = fn(task, transcript)
            log.append((name, task, copy.deepcopy(list(transcript)), result))
            return result

        return tool

    return {name: spy(name, fn) for name, fn in tools.items()}


@dataclasses.dataclass
class Played:
    """One run of the leak test: the episodes by conductor, every LLM request and every tool call, in order."""

    episodes: dict[str, list[Episode]]
    requests: list[tuple[Any, ...]]
    tool_calls: list[tuple[Any, ...]]


def _schedules(team: TeamSpec) -> dict[str, Callable[[], ConductorPolicy]]:
    """Every rule of the team's menu, ``random``, and two schedules that spend the turn budget: solve and check until
    it is spent (with a candidate, submitting is then all that is left), and ask for a solution on every turn (a
    worker that never answers readably runs out of turns: truncated)."""
    cfg: TeamEnvConfig = team.env
    llm, tool = _roles(team)
    out = {name: conductor_factory(name, team, seed=0) for name in [*team_rules(team), "random"]}
    first = {w.name: w.instructions[0] for w in cfg.workers}
    spend = [f"{llm}:{first[llm]}", f"{tool}:{first[tool]}"] * cfg.max_turns
    out["spend_budget"] = lambda: PipelineConductor(cfg, spend)
    out["ask_again"] = lambda: PipelineConductor(cfg, [f"{llm}:{first[llm]}"] * cfg.max_turns)
    return out


def _play(
    team: TeamSpec, family: TaskFamily, tasks: list[Task], script: Script, programs: Script | None = None
) -> Played:
    played = Played({}, [], [])
    tools = ToolBackend(_recording_tools(family.tools(), played.tool_calls))
    workers = {}
    for w in team.env.workers:
        rt = team.workers[w.name]
        if rt.kind == "tool":
            backend: Any = tools
        else:
            # a program writer (the priced team's) replies with ``programs``: right, wrong, none (the python tool runs
            # them); any other non-proposer critiques
            own = script if w.proposes_answer else programs if "program" in w.instructions else None
            backend = RecordingBackend(w.name, own, played.requests)
        workers[w.name] = Worker(w.name, rt.kind, backend, rt.generation, w.prompt_version, rt.tool)
    for name, factory in _schedules(team).items():
        engine = RolloutEngine(team, family, workers, factory, conductor_name=name, progress=False)
        played.episodes[name] = engine.run(plan_jobs(tasks, 0, f"leak-{name}"))
    return played


def _seen(ep: Episode) -> list[Any]:
    """What the conductor of ``ep`` saw, did and was rewarded with, short of the verifier's verdict at submit."""
    steps = [
        (
            s.t,
            s.state,
            s.observation,
            s.action_mask,
            s.action,
            s.message,
            {k: v for k, v in s.reward.named.items() if k != "success"},
            s.terminated,
            s.truncated,
        )
        for s in ep.steps
    ]
    return [ep.task.id, steps, ep.terminated, ep.truncated, ep.final_observation, ep.metadata["final_state"]]


def _kinds(ep: Episode, cfg: TeamEnvConfig) -> set[str]:
    """The state kinds ``ep`` went through (:data:`KINDS`, :data:`CRITIC`)."""
    spec = {w.name: w for w in cfg.workers}
    kinds = set()
    for s in ep.steps:
        transcript = s.state["transcript"]
        if s.state["turn"] >= s.state["max_turns"]:
            kinds.add("budget_spent")
            assert list(s.action_mask) == [0] * cfg.submit_action + [1]  # submitting is all that is left
        if not transcript:
            kinds.add("start")
            continue
        last, who = transcript[-1], spec[transcript[-1]["worker"]]
        if who.kind == "tool":
            kinds.add(f"tool_{last['verdict']}")
        elif not who.proposes_answer:
            kinds.add(CRITIC)
        else:
            kinds.add("candidate" if last["answer"] is not None else "format_fail")
    if ep.truncated:
        kinds.add("truncated")
    elif ep.terminated:
        kinds.add("submitted" if ep.metadata["final_state"]["flags"]["has_candidate"] else "gave_up")
    return kinds


def _reachable(cfg: TeamEnvConfig) -> set[str]:
    """The state kinds a team's env can reach: :data:`KINDS`, a critic's or reviewer's turn where the team has an
    LLM worker that proposes no answer, but no tool's n/a where every tool is masked until a candidate exists (it
    then always has a reply to check)."""
    kinds = set(KINDS)
    if any(w.kind == "llm" and not w.proposes_answer for w in cfg.workers):
        kinds.add(CRITIC)
    if all(dict(w.requires).get(ins) == "candidate" for w in cfg.workers if w.kind == "tool" for ins in w.instructions):
        kinds.discard("tool_n/a")
    return kinds


def _assert_nothing_leaks(team: TeamSpec, base: Played, pert: Played) -> set[str]:
    """Everything the conductor and the workers saw is identical in the two runs; returns the state kinds reached
    (asserting the team reached every one of them)."""
    assert base.requests == pert.requests  # every chat an LLM worker was sent, with its sampling parameters
    assert base.tool_calls == pert.tool_calls  # every tool's input (public view, transcript) and output
    kinds: set[str] = set()
    for name, eps in base.episodes.items():
        assert len(eps) == len(pert.episodes[name]) and all(e.error is None for e in eps)
        for a, b in zip(eps, pert.episodes[name], strict=True):
            assert _seen(a) == _seen(b), f"{team.name}/{name}/{a.task.id}: the conductor saw the perturbation"
            assert "PERTURBED" not in json.dumps(b.metadata["final_state"])
            kinds |= _kinds(a, team.env)
        assert name != "tool_only" or not any(e.success for e in eps + pert.episodes[name])
    assert _reachable(team.env) <= kinds, f"{team.name}: states never reached: {_reachable(team.env) - kinds}"
    llm_workers = {w.name for w in team.env.workers if w.kind == "llm"}
    assert {r[0] for r in base.requests} == llm_workers  # every LLM worker was sent a prompt
    tools = {rt.tool for rt in team.workers.values() if rt.kind == "tool"}
    assert {c[0] for c in base.tool_calls} == tools  # and every tool was called
    return kinds


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


def _assert_declared(base: Sequence[Task], pert: Sequence[Task]) -> None:
    """Every metadata field that the perturbation changed is declared hidden (kept from tools and conductors)."""
    for a, b in zip(base, pert, strict=True):
        assert a.id == b.id and a.prompt == b.prompt and set(a.metadata) == set(b.metadata)
        changed = {k for k in a.metadata if a.metadata[k] != b.metadata[k]}
        assert changed <= set(a.hidden), (
            f"{a.id}: solution-derived fields not declared hidden: {changed - set(a.hidden)}"
        )


@pytest.mark.parametrize("team_name", TEAMS)
def test_perturbing_the_solution_changes_nothing_a_conductor_tool_or_worker_sees(team_name: str) -> None:
    team = _team(team_name)
    family_name = team.family
    family = get_family(family_name)
    tasks = family.generate("test", 3 if family_name == "code_synthesis" else 6, seed=3)
    assert MUST_HIDE[family_name] <= set(tasks[0].hidden), f"{family_name} must hide {MUST_HIDE[family_name]}"
    assert all(set(t.metadata) <= set(t.hidden) | PUBLIC[family_name] for t in tasks), "an undeclared field"
    script = _script(tasks, _candidates)
    pert_tasks = [perturbed(t) for t in tasks]
    _assert_declared(tasks, pert_tasks)
    programs = _script(tasks, _programs) if family_name == "arithmetic" else None
    base, pert = _play(team, family, tasks, script, programs), _play(team, family, pert_tasks, script, programs)
    _assert_nothing_leaks(team, base, pert)
    assert any(e.success for eps in base.episodes.values() for e in eps)


# ----------------------------------------------------------------------------------------------------------------
# a user's data: every field that is not the problem's own statement is perturbed, declared or not

USER_DATA: dict[str, tuple[str, list[dict[str, Any]]]] = {  # format -> (team, records)
    "qa": (
        "arithmetic",
        [
            {"id": "q1", "question": "What is 6 times 7?", "answer": 42, "explanation": "6 * 7 = 42"},
            {"id": "q2", "question": "What is the capital of France?", "answer": "Paris", "source": "atlas p. 12"},
            {"id": "q3", "question": "How many legs do 3 spiders have?", "answer": "24", "difficulty": 2},
            {"id": "q4", "question": "Which planet is the largest?", "answer": "Jupiter", "notes": ["gas giant"]},
        ],
    ),
    "gsm8k": (
        "arithmetic",
        [
            {"id": "g1", "question": "Tom has 3 apples and buys 4 more. How many?", "answer": "3 + 4 = 7\n#### 7"},
            {"id": "g2", "question": "A box holds 6 eggs. How many in 5 boxes?", "answer": "6 * 5 = 30\n#### 30"},
        ],
    ),
    "math": (
        "arithmetic",
        [
            {"id": "m1", "problem": "Compute 1/2 + 1/4.", "solution": "1/2 + 1/4 = 0.75, so $\\boxed{\\frac{3}{4}}$."},
            {
                "id": "m2",
                "problem": "Solve x + 3 = 5.",
                "solution": "x = 5 - 3 = 2, so $\\boxed{2}$",
                "level": "Level 1",
            },
        ],
    ),
    "mbpp": (
        "code_synthesis",
        [
            {
                "id": "b1",
                "text": "Write a function to add two numbers.",
                "test_list": ["assert add(1, 2) == 3", "assert add(-1, 1) == 0"],
                "challenge_test_list": ["assert add(10**6, 1) == 1000001"],
                "visible_tests": ["assert add(2, 2) == 4"],
                "entry_point": "add",
                "code": "def add(a, b):\n    return a + b",
            },
            {
                "id": "b2",
                "text": "Write a function that returns the largest of a list.",
                "test_list": ["assert biggest([1, 5, 2]) == 5", "assert biggest([-3, -1]) == -1"],
                "visible_tests": ["assert biggest([4]) == 4"],
                "entry_point": "biggest",
                "code": "def biggest(xs):\n    return max(xs)",
            },
        ],
    ),
    "humaneval": (
        "code_synthesis",
        [
            {
                "id": "h1",
                "prompt": 'def double(x):\n    """Return twice x."""\n',
                "entry_point": "double",
                "test": "def check(candidate):\n    assert candidate(2) == 4\n    assert candidate(-1) == -2",
                "canonical_solution": "    return 2 * x\n",
            },
            {
                "id": "h2",
                "prompt": 'def square(x):\n    """Return x squared."""\n',
                "entry_point": "square",
                "test": "def check(candidate):\n    assert candidate(3) == 9",
                "canonical_solution": "    return x * x\n",
                "visible_tests": ["assert square(2) == 4"],
            },
            {
                "id": "h3",
                "prompt": 'def negate(x):\n    """Return -x."""\n',
                "entry_point": "negate",
                "test": "def check(candidate):\n    assert candidate(3) == -3\n    assert candidate(0) == 0",
                "canonical_solution": "    return -x\n",
                "visible_tests": ["assert negate(1) == -1"],
            },
        ],
    ),
}
# the record fields that state the problem (public); every other field may hold the solution
STATEMENT = {"id", "split", "question", "problem", "text", "prompt", "visible_tests", "entry_point", "test_setup_code"}
CODE_FIELDS = {"test_list", "challenge_test_list", "test"}  # Python: perturbed in its numbers only, so it still runs
DIGITS = str.maketrans("0123456789", "7890123456")


def _perturb_field(fmt: str, key: str, value: Any) -> Any:
    """A solution-bearing field, changed: a qa answer turns from a number to text or back (what the kind of a qa
    item used to be read from), code keeps running with other numbers, text is marked and renumbered."""
    if fmt == "qa" and key == "answer":
        return "PERTURBED" if str(value).strip().lstrip("-").isdigit() else 12345
    if isinstance(value, list):
        return [_perturb_field(fmt, key, v) for v in value]
    if isinstance(value, str):
        return value.translate(DIGITS) if key in CODE_FIELDS else "PERTURBED " + value.translate(DIGITS)
    return _perturb(value)


def _user_reply(record: Mapping[str, Any], fmt: str, task: Task) -> tuple[str, str]:
    """A right and a wrong reply to a user-data task, from the ORIGINAL record (a worked solution where it has one, so
    the calculator has a calculation to pass)."""
    if fmt in ("mbpp", "humaneval"):
        name = record["entry_point"]
        right = record["code"] if fmt == "mbpp" else record["prompt"] + record["canonical_solution"]
        return f"```python\n{right}\n```", f"```python\ndef {name}(*args):\n    return None\n```"
    if fmt == "gsm8k":
        right = record["answer"].replace("####", "Answer:")
    elif fmt == "math":
        right = record["solution"]
    else:
        right = f"{record.get('explanation', '')}\nAnswer: {task.answer}".strip()
    return right, "3 + 4 = 8\nAnswer: 8"  # the calculator says FAIL to the wrong one


def _user_family(path: Path, records: Sequence[Mapping[str, Any]]) -> UserDataFamily:
    path.write_text("".join(json.dumps({**r, "split": "test"}) + "\n" for r in records), encoding="utf-8")
    return UserDataFamily(path)  # read now: the same path then holds the perturbed records


@pytest.mark.parametrize("fmt", list(USER_DATA))
def test_perturbing_any_solution_field_of_user_data_changes_nothing_seen(fmt: str, tmp_path: Path) -> None:
    team_name, records = USER_DATA[fmt]
    team = _team(team_name)
    path = tmp_path / "data.jsonl"
    family = _user_family(path, records)
    pert_records = [{k: v if k in STATEMENT else _perturb_field(fmt, k, v) for k, v in r.items()} for r in records]
    pert_family = _user_family(path, pert_records)
    tasks = family.generate("test", len(records), seed=0)
    pert_tasks = pert_family.generate("test", len(records), seed=0)
    assert all(a.to_dict() != b.to_dict() for a, b in zip(tasks, pert_tasks, strict=True))  # each task perturbed
    _assert_declared(tasks, pert_tasks)
    by_id = {f"jsonl-{r['id']}": r for r in records}
    script = _script(tasks, lambda t: _user_reply(by_id[t.id], fmt, t))
    base, pert = _play(team, family, tasks, script), _play(team, pert_family, pert_tasks, script)
    _assert_nothing_leaks(team, base, pert)
    assert any(e.success for eps in base.episodes.values() for e in eps)


def test_a_user_data_candidate_is_read_from_the_reply_alone() -> None:
    """The kind of a qa item and the candidate a reply offers do not depend on the gold answer (the candidate the env
    records, and the action mask that follows from it, once did: a qa item was "numeric" when its answer parsed,
    and a GSM8K reply offered no candidate when its answer did not)."""
    kinds = {parse_record({"question": "q", "answer": a}, "qa", "x:1").kind for a in (42, "42", "Paris", "1/2")}
    assert kinds == {"qa"}
    replies = ["I think so.\nAnswer: 42", "It is Paris", "6 * 7 = 42", "Answer: $1,200.", "", "no idea"]
    for kind, answers in (("qa", ["42", "Paris", "not a number", "1200"]), ("numeric", ["42", "PERTURBED 12345"])):
        tasks = [Task("t", "jsonl", "test", "q", a, 1, 0, {"kind": kind}) for a in answers]
        for text in replies:
            extracted = {check_item(t, text).extracted for t in tasks}
            assert len(extracted) == 1, (kind, text, extracted)
    qa = Task("t", "jsonl", "test", "q", "1200", 1, 0, {"kind": "qa"})
    assert check_item(qa, "Answer: $1,200.").correct and not check_item(qa, "Answer: 1300").correct
    assert check_item(dataclasses.replace(qa, answer="Paris"), "It is\nparis!").correct


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


@pytest.mark.parametrize("team_name", TEAMS)
def test_tool_only_conductor_solves_no_held_out_task(team_name: str) -> None:
    team = _team(team_name)
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
