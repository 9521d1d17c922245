"""The arithmetic family's ``python`` tool (program of thought): it runs the program a worker wrote in the real
sandbox and states what it printed; it never reads the task, so on its own it solves nothing."""

from __future__ import annotations

import pytest

from envs.tasks.program import program_of, python_tool
from envs.tasks.registry import get_family


def test_a_printed_number_becomes_the_answer() -> None:
    r = python_tool(None, [{"worker": "coder", "text": "print(12 * 3 - 5)"}])  # type: ignore[arg-type]
    assert r.verdict == "n/a" and r.text.splitlines()[-1] == "Answer: 31"
    fenced = "Here it is:\n```python\nboxes = 24 / 4\nprint(boxes)\n```"
    assert python_tool(None, [{"worker": "coder", "text": fenced}]).text.endswith("Answer: 6")  # type: ignore[arg-type]


def test_the_latest_program_is_run_past_a_critics_prose() -> None:
    transcript = [
        {"worker": "coder", "text": "print(2 + 2)"},
        {"worker": "coder", "text": "print(3 + 4)"},
        {"worker": "critic", "text": "That looks right to me."},
    ]
    assert python_tool(None, transcript).text.endswith("Answer: 7")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "verdict", "says"),
    [
        ("```python\nprint(1 / 0)\n```", "fail", "ZeroDivisionError"),
        ("```python\nwhile True:\n    pass\n```", "fail", "limit"),
        ("```python\nprint('done')\n```", "fail", "printed no number"),
        ("Tom has 4 + 6 = 10 apples.", "n/a", "No program"),  # prose is not a program
    ],
)
def test_what_is_not_a_number_says_why_and_proposes_nothing(text: str, verdict: str, says: str) -> None:
    r = python_tool(None, [{"worker": "coder", "text": text}])  # type: ignore[arg-type]
    assert r.verdict == verdict and says in r.text and "Answer:" not in r.text


def test_program_extraction() -> None:
    assert program_of("print(4 + 6)") == "print(4 + 6)"
    assert program_of("x = 4 + 6") is None  # parses, prints nothing: not an answer-bearing program
    assert program_of("The answer is 10.") is None
    assert program_of("```py\nprint(1)\n```\nand\n```python\nprint(2)\n```") == "print(2)\n"


def test_on_its_own_the_tool_solves_nothing() -> None:
    fam = get_family("arithmetic")
    for task in fam.generate("validation", 5, seed=0):
        r = fam.tools()["python"](task.public(), [])
        assert r.verdict == "n/a" and fam.verify(task, r.text).score == 0.0
