"""Task families: the shared contract (determinism, splits, distinctness, tools' message format),
answer extraction, arithmetic + calculator, the JSONL loader and the registry. No LLM."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from envs.tasks.arithmetic import ArithmeticFamily
from envs.tasks.base import SPLITS, Task, TaskFamily, ToolResult, split_of
from envs.tasks.calculator import CalcError, calculator, evaluate, find_equations
from envs.tasks.common import Draw, latest_candidate, sample_distinct
from envs.tasks.extract import extract_marked, extract_number, extract_number_with_rule
from envs.tasks.registry import FAMILIES, generate_tasks, get_family, tools_for, verify_task
from envs.tasks.user_data import UserDataError, UserDataFamily

JSONL_LINES = [
    {"question": f"What is {i} plus {i + 1}?", "answer": 2 * i + 1, "difficulty": 1 + i % 2} for i in range(40)
] + [
    {"question": "What is the capital of France?", "answer": "Paris", "id": "cap-fr"},
    {"question": "Which tower is in Paris?", "answer": "the Eiffel Tower"},
    {"question": "Pi to 5 places?", "answer": "3.14159"},
    {"question": "Price of the car?", "answer": "$1,200"},
    {"question": "A forced test item", "answer": "yes", "split": "test"},
]


@pytest.fixture(scope="module")
def jsonl_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("data") / "qa.jsonl"
    p.write_text("\n".join(json.dumps(x) for x in JSONL_LINES) + "\n\n", encoding="utf-8")
    return p


def make_family(name: str, jsonl_path: Path) -> TaskFamily:
    return get_family(name, path=jsonl_path) if name == "jsonl" else get_family(name)


SMALL_N = {"arithmetic": 12, "logic_grid": 8, "blocksworld": 10, "code_synthesis": 8, "jsonl": 5}


def _msg(worker: str, text: str, verdict: str | None = None) -> dict[str, object]:
    return {"worker": worker, "text": text, "verdict": verdict}


# ------------------------------------------------------------------ the contract, for every family


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_family_contract(name: str, jsonl_path: Path) -> None:
    fam = make_family(name, jsonl_path)
    assert isinstance(fam, TaskFamily)
    n = SMALL_N[name]
    train = fam.generate("train", n, seed=7)
    again = fam.generate("train", n, seed=7)
    assert [t.to_dict() for t in train] == [t.to_dict() for t in again], "same seed must give the same tasks"
    other = fam.generate("train", n, seed=8)
    assert [t.id for t in other] != [t.id for t in train], "another seed should give other tasks"
    test = fam.generate("test", min(n, 3), seed=7)
    assert len(train) == n and len({t.id for t in train}) == n and len({t.prompt for t in train}) == n
    assert all(t.split == "train" for t in train) and all(t.split == "test" for t in test)
    assert not {t.prompt for t in train} & {t.prompt for t in test}
    for t in train + test:
        assert t.family == fam.name
        assert t.difficulty in fam.difficulties
        assert isinstance(t.metadata.get("kind"), str)
        json.dumps(t.to_dict())  # JSON-serialisable, as the trajectory store needs
        assert fam.verify(t, t.answer).correct, f"{t.id}: the stored answer must verify"
        assert verify_task(t, t.answer).correct
    assert set(tools_for(train[0])) == set(fam.tools())


@pytest.mark.parametrize("name", ["arithmetic", "logic_grid", "blocksworld", "code_synthesis"])
def test_split_is_decided_by_content_across_seeds(name: str, jsonl_path: Path) -> None:
    fam = make_family(name, jsonl_path)
    train = {t.prompt for s in (1, 2) for t in fam.generate("train", 6, seed=s)}
    test = {t.prompt for s in (1, 2) for t in fam.generate("test", 6, seed=s)}
    assert not train & test
    by_id = {t.id: t.split for s in (1, 2) for sp in ("train", "test") for t in fam.generate(sp, 4, seed=s)}
    assert set(by_id.values()) == {"train", "test"}


@pytest.mark.parametrize("name", ["arithmetic", "logic_grid", "blocksworld", "code_synthesis"])
def test_difficulty_levels(name: str, jsonl_path: Path) -> None:
    fam = make_family(name, jsonl_path)
    assert fam.difficulties == (1, 2, 3)
    for d in fam.difficulties:
        assert {t.difficulty for t in fam.generate("train", 4, seed=0, difficulty=d)} == {d}
    with pytest.raises(ValueError, match="difficulty"):
        fam.generate("train", 1, seed=0, difficulty=9)


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_tool_messages_start_with_their_marker(name: str, jsonl_path: Path) -> None:
    fam = make_family(name, jsonl_path)
    marker = {"pass": "PASS", "fail": "FAIL", "n/a": "N/A"}
    for task in fam.generate("train", 3, seed=1):
        for tool in fam.tools().values():
            for transcript in ([], [_msg("solver", task.answer)], [_msg("solver", "I do not know")]):
                r = tool(task, transcript)
                assert isinstance(r, ToolResult)
                assert r.text.split("\n", 1)[0] == marker[r.verdict]


def test_sample_distinct_reports_a_too_small_pool() -> None:
    def draw(rng: random.Random, level: int) -> Draw:
        key = f"item{rng.randrange(3)}"
        return key, level, lambda i, s, seed: Task(i, "tiny", s, key, "0")

    with pytest.raises(ValueError, match="pool of such items is too small"):
        sample_distinct("tiny", "train", 5, 0, None, (1,), draw, max_draws=200)


def test_split_of_is_stable_and_roughly_proportional() -> None:
    assert split_of("abc") == split_of("abc")
    share = sum(split_of(f"item {i}") == "test" for i in range(2000)) / 2000
    assert 0.15 < share < 0.25


# ------------------------------------------------------------------ extraction


@pytest.mark.parametrize(
    ("text", "number", "rule"),
    [
        ("4 + 6 = 10 apples. He is happy. #### 10", "10", "####"),
        ("#### 7\nlater 8", "7", "####"),
        ("Answer: 5 apples\n#### 7", "7", "####"),
        ("3 + 4 = 7. Answer: 8", "8", "answer"),
        ("Answer: 12", "12", "answer"),
        ("**Answer:** 4 + 6 = 10", "10", "answer"),
        ("The answer is 42.", "42", "answer"),
        ("13 + 14 = 25", "25", "="),
        ("so 3 * 4 = 12 cookies, then 2 left", "12", "="),
        ("so it is 12.", "12", "last"),
        ("I owe -$1,200.50", "-1200.5", "last"),
        ("10-3 is 7", "7", "last"),
        ("no number at all", None, "none"),
    ],
)
def test_extract_number(text: str, number: str | None, rule: str) -> None:
    assert extract_number_with_rule(text) == (number, rule)


def test_extract_marked() -> None:
    assert extract_marked("blah\nAnswer: Paris.") == "Paris"
    assert extract_marked("#### Bob\nAnswer: Carol") == "Bob"
    assert extract_marked("Paris") is None


# ------------------------------------------------------------------ arithmetic


def test_safe_evaluator_is_exact_and_refuses_non_arithmetic() -> None:
    assert evaluate("37 * 12 + 5") == 449
    assert evaluate("(3 + 4) x 2") == 14 and evaluate("0.1 + 0.2") * 10 == 3
    for bad in ("__import__('os').system('true')", "2 ** 10000", "1 / 0", "abs(-3)", "x + 1", "9" * 400):
        with pytest.raises(CalcError):
            evaluate(bad)


def test_find_equations() -> None:
    assert find_equations("4 + 6 = 10 - 3 = 7") == [("4 + 6", "10"), ("10 - 3", "7")]
    assert find_equations("He has (3 + 4) * 2 = 14 apples and x = 5, a == b") == [("(3 + 4) * 2", "14")]


def test_arithmetic_kinds_and_word_fraction() -> None:
    assert {t.metadata["kind"] for t in ArithmeticFamily().generate("train", 40, seed=0)} == {"word_problem"}
    tasks = ArithmeticFamily(word_fraction=0.5).generate("train", 40, seed=0)
    assert {t.metadata["kind"] for t in tasks} == {"expression", "word_problem"}
    only = ArithmeticFamily(word_fraction=0.0).generate("train", 10, seed=0)
    assert {t.metadata["kind"] for t in only} == {"expression"}
    for t in tasks + ArithmeticFamily(word_fraction=0.5).generate("train", 300, seed=1):
        if t.metadata["kind"] == "expression":
            assert t.prompt == f"What is {t.metadata['expression']}?"
        assert int(t.answer) >= 0 and evaluate(
            t.metadata.get("expression") or t.metadata["solution_expression"]
        ) == int(t.answer)


def test_arithmetic_verifier_formats() -> None:
    fam = ArithmeticFamily()
    for t in fam.generate("train", 10, seed=3):
        a = int(t.answer)
        for good in (f"blah blah #### {a}", f"Answer: {a}", f"so it is {a}.", f"It is {a}.0", f"x = {a}"):
            assert fam.verify(t, good).correct, good
        for bad in (f"#### {a + 1}", f"Answer: {a - 1}", f"so it is {a + 2}.", "I cannot say"):
            assert not fam.verify(t, bad).correct, bad
        assert fam.verify(t, "no idea").extracted is None


def _one(kind: str) -> Task:
    tasks = ArithmeticFamily(word_fraction=0.5).generate("train", 30, seed=5)
    return next(t for t in tasks if t.metadata["kind"] == kind)


def test_calculator_checks_only_what_a_worker_wrote() -> None:
    t = _one("expression")
    expr, ans = t.metadata["expression"], t.answer
    alone = calculator(t, [])
    assert alone.verdict == "n/a" and ans not in alone.text, "with nothing written it has nothing to say"
    assert not ArithmeticFamily().verify(t, alone.text).correct
    wrong = calculator(t, [_msg("solver", f"{expr} = {int(ans) + 2}")])
    assert wrong.verdict == "fail"
    assert f"The expression {expr} evaluates to {ans}, not {int(ans) + 2}." in wrong.text
    right = calculator(t, [_msg("solver", f"{expr} = {ans}"), _msg("critic", "looks fine")])
    assert right.verdict == "pass"


def test_calculator_checks_word_problem_arithmetic() -> None:
    t = _one("word_problem")
    expr, ans = t.metadata["solution_expression"], int(t.answer)
    assert calculator(t, []).verdict == "n/a", "it cannot read prose"
    good = calculator(t, [_msg("solver", f"So {expr} = {ans}. #### {ans}")])
    assert good.verdict == "pass" and good.text.endswith(f"Answer: {ans}")
    bad = calculator(t, [_msg("solver", f"So {expr} = {ans + 1}. #### {ans + 1}")])
    assert bad.verdict == "fail" and f"evaluates to {ans}, not {ans + 1}" in bad.text
    two_step = calculator(t, [_msg("solver", "4 + 6 = 11, then 11 - 2 = 9. #### 9")])
    assert two_step.verdict == "fail" and "4 + 6 evaluates to 10, not 11" in two_step.text
    bare = calculator(t, [_msg("solver", expr)])
    assert bare.verdict == "pass" and bare.text.endswith(f"Answer: {ans}")
    assert calculator(t, [_msg("solver", "I think it is many")]).verdict == "n/a"
    mismatch = calculator(t, [_msg("solver", f"{expr} = {ans}. #### {ans + 5}")])
    assert mismatch.verdict == "fail" and "does not match" in mismatch.text


def test_tools_read_the_latest_non_tool_message() -> None:
    transcript = [
        _msg("solver", "first"),
        _msg("calculator", "FAIL\nnope", "fail"),
        _msg("reviser", "second"),
        _msg("calculator", "PASS\nAnswer: 3", "pass"),
        _msg("conductor", "submit"),
    ]
    assert latest_candidate(transcript) == "second"
    assert latest_candidate([_msg("calculator", "PASS", None)]) is None


# ------------------------------------------------------------------ JSONL


def test_jsonl_checker(jsonl_path: Path) -> None:
    fam = UserDataFamily(jsonl_path, name="qa")
    assert fam.format == "qa"
    tasks = {t.prompt: t for sp in SPLITS for t in fam.generate(sp, len([i for i in fam.items if i.split == sp]), 0)}
    assert len(tasks) == len(JSONL_LINES)
    paris = tasks["What is the capital of France?"]
    assert paris.id == "qa-cap-fr" and paris.metadata["kind"] == "qa"
    assert fam.verify(paris, "I think so.\nAnswer: paris!").correct
    assert fam.verify(paris, "It is\nParis").correct
    assert not fam.verify(paris, "Answer: Lyon").correct
    assert fam.verify(tasks["Which tower is in Paris?"], "Answer: Eiffel tower.").correct
    pi = tasks["Pi to 5 places?"]
    assert pi.metadata["kind"] == "qa"  # one kind whatever the answer: a kind read off it would leak it
    assert fam.verify(pi, "#### 3.14159").correct and not fam.verify(pi, "#### 3.14").correct
    car = tasks["Price of the car?"]
    assert fam.verify(car, "It costs 1200 dollars").correct and fam.verify(car, "Answer: $1,200").correct
    sum_task = tasks["What is 3 plus 4?"]
    assert fam.verify(sum_task, "3 + 4 = 7").correct and not fam.verify(sum_task, "3 + 4 = 8").correct
    assert tasks["A forced test item"].split == "test"
    assert {t.difficulty for t in fam.generate("train", 10, 0, difficulty=2)} == {2}
    with pytest.raises(UserDataError, match="1000 test tasks requested, the data holds"):
        fam.generate("test", 1000, 0)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "invalid JSON"),
        ('{"question": "q"}', "'answer'"),
        ('{"answer": 3}', "'question'"),
        ('{"question": "q", "answer": true}', "'answer'"),
        ('["q", "a"]', "JSON object"),
        ('{"question": "q", "answer": "a", "id": "x1"}', "duplicate id"),
        ('{"question": "q", "answer": "a", "split": "dev"}', "'split'"),
    ],
)
def test_jsonl_errors_name_file_and_line(tmp_path: Path, line: str, message: str) -> None:
    p = tmp_path / "bad.jsonl"
    p.write_text('{"question": "ok", "answer": 1, "id": "x1"}\n\n' + line + "\n", encoding="utf-8")
    with pytest.raises(UserDataError, match=message) as e:
        UserDataFamily(p)
    assert f"{p}:3:" in str(e.value)


# ------------------------------------------------------------------ registry


def test_registry(jsonl_path: Path) -> None:
    assert set(FAMILIES) == {"arithmetic", "logic_grid", "blocksworld", "code_synthesis", "jsonl"}
    with pytest.raises(KeyError, match="arithmetic, blocksworld, code_synthesis, jsonl, logic_grid"):
        get_family("chess")
    tasks = generate_tasks("arithmetic", "test", 3, seed=1, difficulty=2)
    assert len(tasks) == 3 and all(t.split == "test" and t.difficulty == 2 for t in tasks)
    assert generate_tasks("jsonl", "train", 2, seed=0, path=jsonl_path)[0].family == "jsonl"
    with pytest.raises(TypeError, match="jsonl"):
        get_family("jsonl")
    t = tasks[0]
    assert verify_task(t, f"#### {t.answer}").correct and not verify_task(t, "#### -1").correct
    assert "calculator" in tools_for(t) and extract_number(tools_for(t)["calculator"](t, []).text) is not None


def test_commuted_operands_share_a_canonical_expression_and_a_split() -> None:
    from envs.tasks.base import split_of
    from envs.tasks.calculator import canonical_expression

    assert canonical_expression("3 + 4 * 2") == canonical_expression("2 * 4 + 3") == canonical_expression("4*2+3")
    assert canonical_expression("(5 - 2) / 3") != canonical_expression("(2 - 5) / 3")
    assert canonical_expression("7 - 3") != canonical_expression("3 - 7")
    key = lambda e: f"expression|{canonical_expression(e)}"  # noqa: E731
    assert split_of(key("12 + 30 * 2")) == split_of(key("2 * 30 + 12"))


def test_splits_are_disjoint_and_sized_by_fraction() -> None:
    from envs.tasks.base import split_of

    counts = {s: 0 for s in SPLITS}
    for i in range(5000):
        counts[split_of(f"item-{i}")] += 1
    assert all(abs(counts[s] / 5000 - f) < 0.03 for s, f in (("test", 0.2), ("validation", 0.2), ("train", 0.6)))
    fam = ArithmeticFamily()
    ids = {sp: {t.id for t in fam.generate(sp, 40, seed=0)} for sp in SPLITS}
    assert (
        not ids["train"] & ids["validation"] and not ids["train"] & ids["test"] and not ids["validation"] & ids["test"]
    )
