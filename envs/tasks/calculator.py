"""A safe exact calculator and the ``calculator`` tool (arithmetic and JSONL families).

The evaluator walks a Python AST restricted to numbers, ``+ - * / // % **`` and parentheses, with
exact :class:`~fractions.Fraction` arithmetic and size limits; it never calls ``eval()``.

What the tool does (why: the 135M solver often writes the right expression with a wrong result,
``13 + 14 = 25``, so re-evaluating the expressions it wrote is a cheap, exact check). It reads only what
workers wrote, never the task: the *candidate* is the latest non-tool message that contains a number (a
critic's "looks fine" does not hide it). It checks every ``expr = value`` the candidate wrote (FAIL at
the first wrong one, e.g. ``The expression 13 + 14 evaluates to 27, not 25.``; when that is the last
equation the message ends ``Answer: <its true value>``), then that the final answer matches the last
result. With no equation but a bare expression (``4 + 6``) it evaluates it (PASS, ``Answer: 10``). With
nothing to compute: N/A. A PASS certifies the arithmetic only, not that it is the right calculation:
with an empty transcript the tool has nothing to say, so a tool-only conductor solves nothing.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any

from envs.tasks.base import Task, ToolResult
from envs.tasks.common import latest_candidate, tool_result
from envs.tasks.extract import extract_number, format_number, parse_number

MAX_EXPR_CHARS = 300
MAX_MAGNITUDE = Fraction(10) ** 30


class CalcError(ValueError):
    """The text is not an expression the calculator accepts (or overflows, divides by zero…)."""


_BINOPS = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow)


def _eval(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return Fraction(str(node.value))  # str() keeps 0.1 as 1/10, not its binary float
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
        v = _eval(node.operand)
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.BinOp) and isinstance(node.op, _BINOPS):
        a, b = _eval(node.left), _eval(node.right)
        op = node.op
        if isinstance(op, ast.Add):
            r = a + b
        elif isinstance(op, ast.Sub):
            r = a - b
        elif isinstance(op, ast.Mult):
            r = a * b
        elif isinstance(op, ast.Pow):
            if b.denominator != 1 or abs(b) > 20 or abs(a) > 10**6:
                raise CalcError("power too large")
            if a == 0 and b < 0:
                raise CalcError("division by zero")
            r = a ** int(b)
        else:
            if b == 0:
                raise CalcError("division by zero")
            if isinstance(op, ast.Div):
                r = a / b
            elif isinstance(op, ast.FloorDiv):
                r = Fraction(a // b)
            else:
                r = a % b
        if abs(r) > MAX_MAGNITUDE:
            raise CalcError("number too large")
        return r
    raise CalcError(f"unsupported syntax: {type(node).__name__}")


def normalize_expression(text: str) -> str:
    """Common ways people write arithmetic → Python syntax: ``×``/``x``/``·`` → ``*``, ``÷`` → ``/``,
    ``^`` → ``**``, unicode minus, ``$`` and thousands commas dropped."""
    t = text.replace("−", "-").replace("–", "-").replace("×", "*").replace("·", "*").replace("÷", "/")
    t = re.sub(r"(?<=[\d)])\s*[xX]\s*(?=[\d(])", " * ", t)
    t = t.replace("^", "**").replace("$", "")
    t = re.sub(r"(?<=\d),(?=\d{3}(?!\d))", "", t)
    return t


def evaluate(expr: str) -> Fraction:
    """Exact value of an arithmetic expression; raises :class:`CalcError` on anything else."""
    src = normalize_expression(expr).strip()
    if not src or len(src) > MAX_EXPR_CHARS:
        raise CalcError("empty or too long expression")
    try:
        tree = ast.parse(src, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
        raise CalcError(f"not an arithmetic expression: {src!r}") from e
    return _eval(tree)


def canonical_expression(expr: str) -> str:
    """The expression with the operands of every ``+`` chain and every ``*`` chain sorted, so ``3 + 4 * 2``
    and ``2 * 4 + 3`` share one canonical form (the split key of near-duplicates). Not for evaluation."""

    def flat(node: ast.AST, op: type) -> list[ast.AST]:
        if isinstance(node, ast.BinOp) and isinstance(node.op, op):
            return flat(node.left, op) + flat(node.right, op)
        return [node]

    def canon(node: ast.AST) -> str:
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mult)):
            sym = "+" if isinstance(node.op, ast.Add) else "*"
            return "(" + sym.join(sorted(canon(n) for n in flat(node, type(node.op)))) + ")"
        if isinstance(node, ast.BinOp):
            return f"({canon(node.left)}{type(node.op).__name__}{canon(node.right)})"
        if isinstance(node, ast.UnaryOp):
            return f"({type(node.op).__name__}{canon(node.operand)})"
        return ast.unparse(node)

    return canon(ast.parse(normalize_expression(expr).strip(), mode="eval").body)


_EXPR_CHARS = re.compile(r"[\d\s.+\-*/()%]*$")
_HAS_OP = re.compile(r"\d\s*(?:\*\*|[+\-*/%])\s*[(\d.-]")


def _tail_expression(left: str) -> str | None:
    """The arithmetic expression at the end of ``left`` (the text before an ``=``), if any."""
    m = _EXPR_CHARS.search(left[-MAX_EXPR_CHARS:])
    tail = m.group(0).strip() if m else ""
    # drop leading junk (a stray ")" or operator, an unmatched "(") until it parses
    while tail:
        if _HAS_OP.search(tail):
            try:
                evaluate(tail)
                return tail
            except CalcError:
                pass
        else:
            return None
        tail = tail[1:].lstrip()
    return None


def find_equations(text: str) -> list[tuple[str, str]]:
    """All ``expression = stated value`` pairs in ``text``, in order (``4 + 6 = 10 - 3 = 7`` gives
    two). Only expressions with at least one operator count; ``==`` (code) is ignored."""
    norm = normalize_expression(text)
    parts = re.split(r"(?<![=!<>])=(?!=)", norm)
    found: list[tuple[str, str]] = []
    for left, right in zip(parts, parts[1:], strict=False):
        m = re.match(r"\s*(-?\d+(?:\.\d+)?)", right)
        if m is None:
            continue
        expr = _tail_expression(left)
        if expr is not None:
            found.append((expr, m.group(1)))
    return found


def find_bare_expression(text: str) -> str | None:
    """The last arithmetic expression (with an operator) in ``text`` that parses, or None."""
    norm = normalize_expression(text)
    best = None
    for m in re.finditer(r"[\d(][\d\s.+\-*/()%]*[\d)]", norm):
        expr = _tail_expression(m.group(0))
        if expr is not None:
            best = expr
    return best


def matches(value: Fraction, stated: str) -> bool:
    """Does a stated result equal the exact value? A stated decimal counts as equal when it is the
    value rounded to the stated number of places (``10 / 3 = 3.33`` is accepted)."""
    s = parse_number(stated)
    if s is None:
        return False
    if s == value:
        return True
    if "." in stated:
        places = len(stated.split(".", 1)[1])
        return round(value, places) == s
    return False


def _pretty(expr: str) -> str:
    return re.sub(r"\s+", " ", expr).strip()


def calculator(task: Task, transcript: Sequence[Mapping[str, Any]]) -> ToolResult:
    """The ``calculator`` tool (behaviour in the module docstring); ``task`` is not read."""
    del task
    # the latest message with a number in it: a critic's "looks fine" does not hide the answer
    cand = latest_candidate(transcript, lambda t: extract_number(t) is not None)
    if cand is None:
        return tool_result("n/a", "No calculation to check yet. Write it with numbers, e.g. 4 + 6 = 10.")
    eqs = find_equations(cand)
    if eqs:
        for i, (expr, stated) in enumerate(eqs):
            v = evaluate(expr)
            if not matches(v, stated):
                msg = f"The expression {_pretty(expr)} evaluates to {format_number(v)}, not {stated}."
                if i == len(eqs) - 1:
                    return tool_result("fail", msg, f"Answer: {format_number(v)}")
                return tool_result("fail", msg, "Fix this step and redo the steps after it.")
        expr, stated = eqs[-1]
        last = format_number(evaluate(expr))
        final = extract_number(cand)
        if final is not None and not matches(evaluate(expr), final):
            return tool_result(
                "fail", f"The final answer {final} does not match the last result {_pretty(expr)} = {last}."
            )
        shown = "; ".join(f"{_pretty(e)} = {s}" for e, s in eqs[-3:])
        answer = final if final is not None else last
        return tool_result("pass", f"The arithmetic is correct: {shown}.", f"Answer: {answer}")
    bare = find_bare_expression(cand)
    if bare is not None:
        value = format_number(evaluate(bare))
        return tool_result("pass", f"{_pretty(bare)} = {value}.", f"Answer: {value}")
    return tool_result("n/a", "No arithmetic found in the last message. Write the calculation, e.g. 4 + 6 = 10.")
