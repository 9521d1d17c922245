"""A user's data in the field's conventions (envs/tasks/user_data.py): GSM8K, MATH, MBPP and HumanEval records from
JSONL, Parquet and a datasets.save_to_disk folder load and verify; visible tests differ from hidden ones; every
malformed variant is one clear error naming the file, line or row, and field."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from envs.tasks.base import SPLITS
from envs.tasks.registry import get_family, tools_for, verify_task
from envs.tasks.user_data import UserDataError, UserDataFamily, last_boxed, math_value

GSM8K = [
    {
        "question": "Tom has 4 apples and buys 6 more. How many apples?",
        "answer": "He has 4 + 6 = <<4+6=10>>10.\n#### 10",
    },
    {"question": "A pen costs 3 dollars. How much do 1,000 pens cost?", "answer": "3 * 1000 = 3000\n#### 3,000"},
    {"question": "Half of 9?", "answer": "9 / 2 = 4.5\n#### 4.5", "split": "test"},
]
MATH = [
    {"problem": "What is $\\frac{1}{2} + \\frac{1}{4}$?", "solution": "We get $\\boxed{\\frac{3}{4}}$.", "level": 2},
    {"problem": "Solve $x + 1 = 3$.", "solution": "So $x = \\boxed{2}$."},
    {"problem": "Name the set of even primes.", "solution": "Only two: $\\boxed{\\{2\\}}$.", "split": "test"},
]
MBPP = [
    {
        "task_id": 11,
        "text": "Write a function to add two numbers.",
        "code": "def add(a, b):\n    return a + b",
        "test_list": ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(0, 0) == 0"],
    },
    {
        "task_id": 12,
        "text": "Write a function that returns the absolute value of x.",
        "test_list": ["assert my_abs(3) == 3", "assert my_abs(-4) == 4", "assert my_abs(0) == 0"],
        "test_setup_code": "import math",
    },
]
HUMANEVAL = [
    {
        "task_id": "HumanEval/0",
        "prompt": 'def double(x: int) -> int:\n    """Return twice x.\n    >>> double(2)\n    4\n    """\n',
        "entry_point": "double",
        "canonical_solution": "    return 2 * x\n",
        "test": "def check(candidate):\n    assert candidate(2) == 4\n    assert candidate(-3) == -6\n",
    }
]


def _jsonl(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def _all(fam: UserDataFamily) -> list[Any]:
    return [t for sp in SPLITS for t in fam.generate(sp, sum(i.split == sp for i in fam.items), 0)]


def test_gsm8k_jsonl(tmp_path: Path) -> None:
    fam = get_family("jsonl", path=_jsonl(tmp_path / "gsm8k.jsonl", GSM8K))
    assert fam.format == "gsm8k"  # type: ignore[attr-defined]
    tasks = {t.answer: t for t in _all(fam)}  # type: ignore[arg-type]
    assert set(tasks) == {"10", "3000", "4.5"} and tasks["4.5"].split == "test"
    assert fam.verify(tasks["10"], "4 + 6 = 10\n#### 10").correct and not fam.verify(tasks["10"], "#### 11").correct
    assert fam.verify(tasks["3000"], "The total is $3,000.").correct
    assert verify_task(tasks["10"], "Answer: 10").correct  # a stored task verifies without the file
    assert "calculator" in tools_for(tasks["10"]) and "rationale" in tasks["10"].metadata


def test_math_parquet(tmp_path: Path) -> None:
    import pandas as pd

    path = tmp_path / "math.parquet"
    pd.DataFrame(MATH).to_parquet(path)
    fam = UserDataFamily(path, name="math")
    assert fam.format == "math"  # type: ignore[attr-defined]
    by = {t.answer: t for t in _all(fam)}  # type: ignore[arg-type]
    half = by["\\frac{3}{4}"]
    assert half.metadata["extra"]["level"] == 2 and half.family == "math"
    for reply in ("So the sum is $\\boxed{\\dfrac{3}{4}}$.", "\\boxed{0.75}", "Answer: 3/4"):
        assert fam.verify(half, reply).correct, reply
    assert not fam.verify(half, "\\boxed{\\frac{1}{2}}").correct
    assert fam.verify(by["\\{2\\}"], "It is \\boxed{ \\{2\\} }.").correct
    assert last_boxed("a \\boxed{\\frac{1}{2}} b \\boxed{x^{2}}") == "x^{2}" and math_value("\\frac{-1}{4}") == -0.25


@pytest.mark.slow
def test_mbpp_datasets_folder_with_visible_and_hidden_tests(tmp_path: Path) -> None:
    import datasets

    folder = tmp_path / "mbpp"
    datasets.DatasetDict(
        {"train": datasets.Dataset.from_list(MBPP[:1]), "test": datasets.Dataset.from_list(MBPP[1:])}
    ).save_to_disk(str(folder))
    fam = UserDataFamily(folder, name="mbpp")
    assert fam.format == "mbpp"  # type: ignore[attr-defined]
    add = fam.generate("train", 1, 0)[0]
    absolute = fam.generate("test", 1, 0)[0]
    assert add.metadata["function"] == "add" and "assert add(1, 2) == 3" in add.prompt  # MBPP shows one test
    assert "assert add(-1, 1) == 0" not in add.prompt  # the others stay hidden
    good = "```python\ndef add(a, b):\n    return a + b\n```"
    assert fam.verify(add, good).correct and verify_task(add, good).correct
    only_visible = "```python\ndef add(a, b):\n    return 3 if (a, b) == (1, 2) else 7\n```"
    v = fam.verify(add, only_visible)
    assert v.score == pytest.approx(1 / 3) and "hidden tests passed" in v.reason
    runner = tools_for(add)["test_runner"]
    assert runner(add, [{"worker": "coder", "text": only_visible}]).verdict == "pass"  # the visible check is fooled
    assert runner(add, [{"worker": "coder", "text": "def add(a, b):\n    return a - b"}]).verdict == "fail"
    assert fam.verify(absolute, "def my_abs(x):\n    return math.fabs(x) if False else abs(x)").correct  # setup code
    assert not fam.verify(absolute, "no code here").correct


@pytest.mark.slow
def test_humaneval_jsonl(tmp_path: Path) -> None:
    fam = UserDataFamily(_jsonl(tmp_path / "he.jsonl", HUMANEVAL), name="humaneval", test_fraction=0.0)
    task = fam.generate("train", 1, 0)[0]
    assert task.id == "humaneval-HumanEval/0" and "def double(x: int) -> int:" in task.prompt
    assert fam.verify(task, "```python\ndef double(x):\n    return 2 * x\n```").correct
    assert not fam.verify(task, "```python\ndef double(x):\n    return x + 2\n```").correct
    assert (
        tools_for(task)["test_runner"](task, [{"worker": "coder", "text": "def double(x):\n    return 2*x"}]).verdict
        == "n/a"
    )


@pytest.mark.parametrize(
    ("record", "message"),
    [
        ({"question": "q", "answer": "no final answer here"}, None),  # a plain QA record: valid, no error
        ({"question": "q", "answer": "42\n#### forty-two"}, "'answer': the text after '####' is not a number"),
        ({"problem": "p", "solution": "no box"}, "'solution' has no \\\\boxed"),
        ({"text": "t", "test_list": []}, "'test_list' is empty"),
        ({"text": "t", "test_list": ["assert f(1) ==="]}, "'tests' is not valid Python"),
        ({"text": "t", "test_list": [3]}, "'test_list' must be a list of non-empty strings"),
        ({"prompt": "def f():\n", "entry_point": "f", "test": "assert f() == 1"}, "must define check"),
        ({"prompt": "p", "entry_point": "1x", "test": "def check(c): pass"}, "'entry_point' must be a Python name"),
        ({"title": "what is this"}, "cannot tell the format"),
        ({"question": "q", "answer": 1, "split": "dev"}, "'split' must be one of train, validation, test"),
        ({"question": "q", "answer": 1, "difficulty": "hard"}, "'difficulty' must be an integer"),
    ],
)
def test_malformed_records_are_one_clear_error(tmp_path: Path, record: dict[str, Any], message: str | None) -> None:
    path = _jsonl(tmp_path / "bad.jsonl", [record])
    if message is None:
        assert UserDataFamily(path).format == "qa"
        return
    with pytest.raises(UserDataError, match=message) as e:
        UserDataFamily(path)
    assert str(e.value).startswith(f"{path}:1: ") and "\n" not in str(e.value)


def test_files_that_cannot_be_read_are_one_clear_error(tmp_path: Path) -> None:
    cases = {
        tmp_path / "empty.jsonl": "no records",
        tmp_path / "junk.parquet": "not a readable Parquet file",
        tmp_path / "data.csv": "unsupported data",
        tmp_path / "missing.jsonl": "cannot read",
    }
    (tmp_path / "empty.jsonl").write_text("\n\n")
    (tmp_path / "junk.parquet").write_bytes(b"not parquet")
    (tmp_path / "data.csv").write_text("a,b\n")
    for path, message in cases.items():
        with pytest.raises(UserDataError, match=message) as e:
            UserDataFamily(path)
        assert str(path) in str(e.value)


@pytest.mark.slow
def test_cli_names_a_split_too_small_in_one_line(tmp_path: Path) -> None:
    data = _jsonl(tmp_path / "gsm8k.jsonl", GSM8K)
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "orchestra",
            "record",
            "--team",
            "arithmetic",
            "--conductor",
            "pipeline",
            "--family",
            str(data),
            "--episodes",
            "50",
            "--out",
            str(tmp_path / "r.jsonl"),
            "--no-cache",
            "--quiet",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert res.stderr.strip().splitlines()[-1].startswith(f"error: {data}: 50 train tasks requested, the data holds")
