"""Arithmetic: word problems (and, optionally, bare expressions), with an exact numeric verifier.

* ``"word_problem"`` (the default items) — ``Tom has 4 apples. He buys 6 more. …``. The LLM must turn
  the prose into a calculation; the ``calculator`` tool re-evaluates the expressions the LLM wrote
  (check-and-revise), so it fixes wrong arithmetic but never a wrong calculation.
* ``"expression"`` — ``What is 37 * 12 + 5?`` (``word_fraction < 1``). The calculator does not read
  the prompt either, but a worker that copies the expression lets it finish the job: these items
  measure copying, so the default protocol leaves them out.

Difficulty: 1 = one operation on numbers ≤ 20 / one-step problems; 2 = two operations with a
multiplication, numbers ≤ 50 / one multiplicative step or two additive steps; 3 = three operations
with parentheses or exact division, numbers ≤ 99 / two or three steps mixing × and ÷.

Verifier: the final number of the text by the rules of :mod:`envs.tasks.extract` (``#### N``, then
``Answer: N``, then the number after the last ``=``, then the last number) must equal the answer
exactly (``12.0`` equals ``12``). Score 1 or 0.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from typing import Any

from envs.tasks.base import Split, Task, ToolFn, Verdict
from envs.tasks.calculator import calculator, canonical_expression, evaluate
from envs.tasks.common import Draw, sample_distinct
from envs.tasks.extract import extract_number_with_rule, format_number, numbers_equal
from envs.tasks.program import python_tool

NAMES = [
    ("Tom", "He"),
    ("Anna", "She"),
    ("Ben", "He"),
    ("Lily", "She"),
    ("Sam", "He"),
    ("Mia", "She"),
    ("Omar", "He"),
    ("Zoe", "She"),
]
ITEMS = ["apples", "marbles", "stickers", "pencils", "cookies", "cards", "stamps", "shells"]


def verify_number(answer: str, text: str) -> Verdict:
    """Exact numeric check of the extracted final number against ``answer`` (shared with JSONL)."""
    got, rule = extract_number_with_rule(text)
    if got is None:
        return Verdict(0.0, "no number found in the answer", None)
    if numbers_equal(got, answer):
        return Verdict(1.0, f"correct: {got} (read by rule {rule!r})", got)
    return Verdict(0.0, f"wrong: read {got} (rule {rule!r}), expected {answer}", got)


# ---------------------------------------------------------------------------- bare expressions


def _expression(rng: random.Random, level: int) -> str:
    r = rng.randint
    if level == 1:
        a, b = r(2, 20), r(2, 20)
        if rng.random() < 0.5:
            return f"{a} + {b}"
        return f"{max(a, b)} - {min(a, b)}"
    if level == 2:
        shape = rng.randrange(4)
        if shape == 0:
            return f"{r(11, 50)} * {r(2, 12)}"
        if shape == 1:
            return f"{r(2, 15)} * {r(2, 15)} + {r(2, 50)}"
        if shape == 2:
            return f"{r(2, 50)} + {r(2, 15)} * {r(2, 15)}"
        a, b = r(3, 15), r(3, 15)
        return f"{a} * {b} - {r(2, a * b - 1)}"
    shape = rng.randrange(4)
    if shape == 0:
        a, b, c = r(10, 99), r(10, 99), r(2, 12)
        return f"({a} + {b}) * {c} - {r(10, min(99, (a + b) * c - 1))}"
    if shape == 1:
        return f"{r(11, 99)} * {r(2, 12)} + {r(11, 99)} * {r(2, 12)}"
    if shape == 2:
        d, q = r(2, 12), r(5, 40)
        c = r(1, 99)
        return f"({d * q + c} - {c}) / {d}"
    b, k, d = r(2, 9), r(1, 9), r(2, 9)  # a - b * (c - d) with c - d = k > 0 and a > b * k
    return f"{r(b * k + 1, b * k + 60)} - {b} * ({d + k} - {d})"


# ---------------------------------------------------------------------------- word problems
# Each template: (id, level, builder(rng) -> (text, expression)). Numbers are chosen so every
# intermediate and final result is a non-negative integer.

Template = tuple[str, int, Callable[[random.Random], tuple[str, str]]]


def _who(rng: random.Random) -> tuple[str, str, str, str]:
    (name, pron), (friend, _) = rng.sample(NAMES, 2)
    return name, pron, friend, rng.choice(ITEMS)


def _t_buy(rng: random.Random) -> tuple[str, str]:
    n, p, _, it = _who(rng)
    a, b = rng.randint(2, 20), rng.randint(2, 20)
    return f"{n} has {a} {it}. {p} buys {b} more. How many {it} does {n} have now?", f"{a} + {b}"


def _t_give(rng: random.Random) -> tuple[str, str]:
    n, p, f, it = _who(rng)
    a = rng.randint(8, 20)
    b = rng.randint(2, a - 1)
    return f"{n} has {a} {it}. {p} gives {b} of them to {f}. How many {it} does {n} have left?", f"{a} - {b}"


def _t_pages(rng: random.Random) -> tuple[str, str]:
    n, _, _, _ = _who(rng)
    a, b = rng.randint(2, 20), rng.randint(2, 20)
    return f"{n} read {a} pages on Monday and {b} pages on Tuesday. How many pages did {n} read in total?", f"{a} + {b}"


def _t_bus(rng: random.Random) -> tuple[str, str]:
    a = rng.randint(10, 20)
    b = rng.randint(2, a - 1)
    return (
        f"A bus has {a} passengers. At the next stop, {b} passengers get off. How many passengers are on the bus now?",
        f"{a} - {b}",
    )


def _t_bags(rng: random.Random) -> tuple[str, str]:
    n, _, _, it = _who(rng)
    a, b = rng.randint(2, 9), rng.randint(3, 12)
    return f"{n} buys {a} bags of {it}. Each bag has {b} {it}. How many {it} does {n} buy?", f"{a} * {b}"


def _t_share(rng: random.Random) -> tuple[str, str]:
    n, _, _, it = _who(rng)
    a, b = rng.randint(2, 9), rng.randint(2, 12)
    return f"{n} shares {a * b} {it} equally among {a} friends. How many {it} does each friend get?", f"{a * b} / {a}"


def _t_buy_give(rng: random.Random) -> tuple[str, str]:
    n, p, f, it = _who(rng)
    a, b = rng.randint(5, 40), rng.randint(2, 30)
    c = rng.randint(2, a + b - 1)
    text = f"{n} has {a} {it}. {p} buys {b} more and then gives {c} to {f}. How many {it} does {n} have now?"
    return text, f"{a} + {b} - {c}"


def _t_shop(rng: random.Random) -> tuple[str, str]:
    _, _, _, it = _who(rng)
    a = rng.randint(20, 50)
    b = rng.randint(2, a // 2)
    c = rng.randint(1, a - b - 1)
    text = f"A shop has {a} {it}. It sells {b} in the morning and {c} in the afternoon. How many {it} are left?"
    return text, f"{a} - {b} - {c}"


def _t_boxes_give(rng: random.Random) -> tuple[str, str]:
    n, _, _, it = _who(rng)
    a, b = rng.randint(2, 12), rng.randint(3, 15)
    c = rng.randint(1, a * b - 1)
    text = f"{n} buys {a} boxes of {it} with {b} {it} in each box and then gives away {c} {it}. How many {it} does {n} have left?"
    return text, f"{a} * {b} - {c}"


def _t_wage(rng: random.Random) -> tuple[str, str]:
    n, p, _, _ = _who(rng)
    a, b, c = rng.randint(5, 30), rng.randint(2, 9), rng.randint(2, 9)
    text = f"{n} earns {a} dollars per hour. {p} works {b} hours on Monday and {c} hours on Tuesday. How many dollars does {n} earn in total?"
    return text, f"{a} * ({b} + {c})"


def _t_times(rng: random.Random) -> tuple[str, str]:
    n, _, f, it = _who(rng)
    a, b = rng.randint(3, 25), rng.randint(2, 6)
    text = f"{n} has {a} {it} and {f} has {b} times as many. How many {it} do they have together?"
    return text, f"{a} + {a} * {b}"


def _t_boxes_add(rng: random.Random) -> tuple[str, str]:
    n, p, _, it = _who(rng)
    a, b, c = rng.randint(2, 9), rng.randint(2, 12), rng.randint(2, 20)
    text = f"{n} puts {a * b} {it} equally into {a} boxes. Then {p.lower()} adds {c} more {it} to each box. How many {it} are in each box now?"
    return text, f"{a * b} / {a} + {c}"


TEMPLATES: list[Template] = [
    ("buy", 1, _t_buy),
    ("give", 1, _t_give),
    ("pages", 1, _t_pages),
    ("bus", 1, _t_bus),
    ("bags", 2, _t_bags),
    ("share", 2, _t_share),
    ("buy_give", 2, _t_buy_give),
    ("shop", 2, _t_shop),
    ("boxes_give", 3, _t_boxes_give),
    ("wage", 3, _t_wage),
    ("times", 3, _t_times),
    ("boxes_add", 3, _t_boxes_add),
]


# levels drawn when no difficulty is asked for: SmolLM2 solves 12-23% of level-1 and level-2 word problems
# single-shot and none of level 3 (docs/protocol.md, benchmarks/calibrate.py); level 3 stays available by name
MIX = (1, 2)
# the item's kind is visible in the prompt but kept from tools for uniformity; the rest derives from the solution
HIDDEN = ("kind", "solution_expression", "steps", "template")


class ArithmeticFamily:
    """Bare expressions and word problems (see the module docstring).

    ``word_fraction`` is the share of word problems among generated items (default 1: word problems only)."""

    name = "arithmetic"
    difficulties: tuple[int, ...] = (1, 2, 3)

    def __init__(self, word_fraction: float = 1.0, test_fraction: float = 0.2, mix: tuple[int, ...] = MIX) -> None:
        if not 0.0 <= word_fraction <= 1.0:
            raise ValueError(f"arithmetic: word_fraction must be in [0, 1], got {word_fraction}")
        if not mix or any(level not in self.difficulties for level in mix):
            raise ValueError(f"arithmetic: mix must hold levels of {self.difficulties}, got {mix}")
        self.word_fraction = word_fraction
        self.test_fraction = test_fraction
        self.mix = tuple(mix)

    def _draw(self, rng: random.Random, level: int) -> Draw:
        if rng.random() >= self.word_fraction:
            expr = _expression(rng, level)
            key = f"expression|{canonical_expression(expr)}"  # 3 + 4 and 4 + 3 are one item
            prompt = f"What is {expr}?"
            meta: dict[str, Any] = {"kind": "expression", "expression": expr, "steps": expr.count(" ") // 2}
        else:
            tid, _, build = rng.choice([t for t in TEMPLATES if t[1] == level])
            prompt, expr = build(rng)
            # names and items do not change the problem, nor does the order of commuted quantities: the key
            # is the template and its canonical calculation
            key = f"word|{tid}|{canonical_expression(expr)}"
            meta = {"kind": "word_problem", "template": tid, "solution_expression": expr, "steps": expr.count(" ") // 2}
        answer = format_number(evaluate(expr))

        def make(task_id: str, split: Split, seed: int) -> Task:
            return Task(task_id, self.name, split, prompt, answer, level, seed, meta, HIDDEN)

        return key, level, make

    def generate(self, split: Split, n: int, seed: int, difficulty: int | None = None) -> list[Task]:
        """``n`` distinct tasks of ``split`` (split by content: expression, or template + numbers)."""
        return sample_distinct(
            self.name, split, n, seed, difficulty, self.difficulties, self._draw, self.test_fraction, mix=self.mix
        )

    def verify(self, task: Task, text: str) -> Verdict:
        """Exact numeric check (extraction rules in :mod:`envs.tasks.extract`)."""
        return verify_number(task.answer, text)

    def tools(self) -> Mapping[str, ToolFn]:
        """``calculator``: re-evaluates the expressions a worker wrote; ``python``: runs the program a worker wrote in
        the sandbox (:mod:`envs.tasks.program`). Neither reads the task."""
        return {"calculator": calculator, "python": python_tool}
