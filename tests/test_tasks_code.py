"""Code synthesis: every reference solution passes its hidden tests in the sandbox, wrong ones fail,
code extraction, the test runner's messages. No LLM."""

from __future__ import annotations

import pytest

from envs.tasks.code_specs import N_TESTS, SPECS
from envs.tasks.code_synthesis import CodeSynthesisFamily, extract_code, run_tests, task_parts

FAST = {"cpu_seconds": 1, "wall_seconds": 4}


def _msg(worker: str, text: str, verdict: str | None = None) -> dict[str, object]:
    return {"worker": worker, "text": text, "verdict": verdict}


@pytest.fixture(scope="module")
def fam() -> CodeSynthesisFamily:
    return CodeSynthesisFamily(sandbox=FAST)


def test_every_reference_solution_passes_its_hidden_tests() -> None:
    # All specs in one sandboxed process per spec would be slow; run each reference through the
    # same harness the verifier uses, but with every spec's tests.
    for spec in SPECS:
        import random

        _, prompt, source, meta = task_parts(spec, spec.params(random.Random(spec.id)))
        assert len(meta["tests"]) == N_TESTS, spec.id
        assert meta["signature"] in prompt and "Example: " in prompt
        rep = run_tests(source, meta["function"], meta["tests"], **FAST)
        assert (rep.passed, rep.first_failure) == (N_TESTS, None), spec.id


def test_levels_and_kinds(fam: CodeSynthesisFamily) -> None:
    assert {s.level for s in SPECS} == {1, 2, 3}
    tasks = fam.generate("train", 30, seed=0)
    assert {t.metadata["kind"] for t in tasks} == {"numeric", "string", "list"}


def test_hidden_tests_depend_on_content_only(fam: CodeSynthesisFamily) -> None:
    a = fam.make_task("fizzbuzz", {"a": 3, "b": 5}, seed=1)
    b = fam.make_task("fizzbuzz", {"a": 3, "b": 5}, seed=2)
    assert a.id == b.id and a.metadata["tests"] == b.metadata["tests"] and a.prompt == b.prompt
    assert "divisible by both 3 and 5" in a.prompt


def test_wrong_and_partial_solutions(fam: CodeSynthesisFamily) -> None:
    t = fam.make_task("factorial")
    assert fam.verify(t, t.answer).correct
    wrong = "```python\ndef factorial(n):\n    return n\n```"
    v = fam.verify(t, wrong)
    assert 0.0 <= v.score < 1.0 and not v.correct and "expected" in v.reason
    no_zero = "```python\ndef factorial(n):\n    r = 1\n    for i in range(2, n + 1):\n        r *= i\n    return r if n else 0\n```"
    partial = fam.verify(t, no_zero)
    assert partial.score == pytest.approx(5 / 6) and "factorial(0) returned 0, expected 1" in partial.reason
    ev = fam.make_task("is_even")
    assert not fam.verify(ev, "def is_even(n):\n    return 1 - n % 2").correct, "1/0 are not booleans"
    assert fam.verify(ev, "def is_even(n):\n    return n % 2 == 0").correct
    assert fam.verify(ev, "```python\nimport os\nos.system('true')\n```").extracted is None, "no def: format failure"
    sneaky = fam.verify(ev, "```python\nimport os\nos.system('true')\ndef is_even(n):\n    return n % 2 == 0\n```")
    assert sneaky.score == 0.0 and "not allowed" in sneaky.reason


def test_code_extraction() -> None:
    chat = "Sure!\n```python\ndef add(a, b):\n    return a + b\n```\nThis adds. ```python\nprint(add(1, 2))\n```"
    assert extract_code(chat, "add").strip() == "def add(a, b):\n    return a + b"
    unclosed = "Here you go:\n```py\ndef add(a, b):\n    return a + b\n"
    assert "return a + b" in extract_code(unclosed, "add")
    prose = "def add(a, b):\n    return a + b\nThis function returns the sum of a and b."
    assert extract_code(prose, "add") == "def add(a, b):\n    return a + b"


def test_test_runner_messages(fam: CodeSynthesisFamily) -> None:
    runner = fam.tools()["test_runner"]
    t = fam.make_task("add")
    assert runner(t, []).verdict == "n/a"
    assert runner(t, [_msg("coder", "I will add them")]).verdict == "n/a"
    ok = runner(t, [_msg("coder", f"```python\n{t.answer}```\nDone.")])
    assert ok.verdict == "pass" and ok.text.startswith("PASS\nAll 2 visible tests passed.")
    assert fam.verify(t, ok.text).correct, "the runner's PASS message carries the code"
    bad = runner(t, [_msg("coder", "```python\ndef add(a, b):\n    return a - b\n```")])
    assert bad.verdict == "fail" and bad.text.startswith("FAIL\nTest ")
    assert " returned " in bad.text and ", expected " in bad.text and "add(" in bad.text
    crash = runner(t, [_msg("coder", "```python\ndef add(a, b):\n    return a +\n```")])
    assert crash.verdict == "fail" and "SyntaxError" in crash.text
    loop = runner(t, [_msg("coder", "```python\ndef add(a, b):\n    while True:\n        pass\n```")])
    assert loop.verdict == "fail" and "did not finish (CPU time limit)" in loop.text
    other = runner(t, [_msg("coder", "```python\ndef add(a, b):\n    return a + b\n```"), _msg("critic", "hmm")])
    assert other.verdict == "pass", "a later message without code does not hide the code"
