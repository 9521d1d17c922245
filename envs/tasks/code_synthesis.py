"""Python function synthesis with hidden unit tests run in the sandbox.

Each task shows a signature, a docstring and one example call; 6 hidden tests (derived from the task
content, so the same prompt always has the same tests) live in ``metadata["tests"]`` and only the
verifier runs them. The ``test_runner`` tool runs the 2 *visible* tests (``metadata["visible_tests"]``:
the example and one more typical call, never an edge case), so a PASS can be wrong, as in MBPP and
HumanEval practice. Specs range
from one-liners (difficulty 1: ``add``, ``is_even``, ``multiply`` by a constant…) through small loops
(2: ``count_vowels``, ``fizzbuzz`` with given divisors…) to small algorithms (3: ``is_prime``,
``run_length_encode``, ``caesar`` with a given shift…). Kinds: ``"numeric"``, ``"string"``,
``"list"`` (the type of data the function works on).

Why instance-dependent schedules pay off: the 135M model writes correct one-liners in a ```python
block, so a test run is wasted on easy items; on loops with edge cases (``factorial(0)``, ``fizzbuzz``
with unusual divisors) the ``test_runner``'s first failure (``Test 2 of 2: fizzbuzz(15) returned
'Fizz', expected 'FizzBuzz'``) is what a reviser needs.

Code extraction: the last fenced code block (```` ```python ````, ```` ```py ```` or bare ```` ``` ````;
an unclosed fence runs to the end) that defines the function, else the last fenced block; without
fences, the whole text, or if that does not compile, the longest compiling stretch starting at
``def <name>(``. Verifier: score = fraction of hidden tests passed (a result must ``==`` the expected
value, and booleans must be booleans); correct only if all pass. The ``test_runner`` tests the latest
non-tool message that contains ``def <name>``.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from envs.tasks.base import Split, Task, ToolFn, ToolResult, Verdict, split_of
from envs.tasks.code_specs import N_TESTS, SPEC_BY_ID, SPECS, Args, Spec, function_name, reference_source
from envs.tasks.common import Draw, code_blocks, content_id, latest_candidate, sample_distinct, stable_rng, tool_result
from envs.tasks.sandbox import run_python
from envs.tasks.verdicts import (
    MAX_DEPTH,
    MAX_VALUE_CHARS,
    call_each,
    channel_file,
    describe_exception,
    harness_source,
    line_sender,
    make_plain_encoder,
    read_back,
    read_channel,
    same_value,
    why_unfinished,
)


def _call(name: str, args: Sequence[Any]) -> str:
    return f"{name}({', '.join(repr(a) for a in args)})"


def _short(text: str, n: int = 80) -> str:
    return text if len(text) <= n else text[: n - 3] + "..."


def extract_code(text: str, name: str) -> str:
    """The candidate's code (rules in the module docstring)."""
    blocks = code_blocks(text)
    if blocks:
        defining = [b for b in blocks if re.search(rf"\bdef\s+{re.escape(name)}\s*\(", b)]
        return str((defining or blocks)[-1])
    try:
        compile(text, "<candidate>", "exec")
        return text
    except (SyntaxError, ValueError):
        pass
    m = re.search(rf"^[ \t]*def\s+{re.escape(name)}\s*\(", text, re.MULTILINE)
    if m is None:
        return text
    lines = text[m.start() :].splitlines()
    for end in range(len(lines), 0, -1):
        chunk = "\n".join(lines[:end])
        try:
            compile(chunk, "<candidate>", "exec")
            return chunk
        except (SyntaxError, ValueError):
            continue
    return text


# ----------------------------------------------------------------------------------------------------------------
# hidden tests: only the arguments enter the candidate's process, which reports plain return values; this process
# compares them with the expected values (the design: :mod:`envs.tasks.verdicts`)

# the candidate's program: the harness, then a call to it (the code and arguments as literals); stdout is the
# candidate's own and is ignored, results go to the private file descriptor `fd`
_HARNESS = "{source}\ncall_each({fd}, {code!r}, {name!r}, {calls!r}, {limit}, {depth})\n"


@dataclass(frozen=True)
class TestReport:
    passed: int
    total: int
    first_failure: str | None  # one line for the reviser, None if all passed


def run_tests(code: str, name: str, tests: Sequence[Mapping[str, Any]], **limits: Any) -> TestReport:
    """Run ``tests`` (``{"args", "expected"}``) against ``code`` in one sandboxed process. Only the arguments
    enter that process; it writes each return value (plain data) to a private channel as soon as the call
    returns, so tests finished before a timeout still count, and this process compares the values with the
    expected ones (:func:`same_value`)."""
    total = len(tests)
    calls = make_plain_encoder(MAX_VALUE_CHARS * 64, MAX_DEPTH + 2)([list(t["args"]) for t in tests])
    f, fd = channel_file()
    with f:
        program = _HARNESS.format(
            source=harness_source(describe_exception, line_sender, call_each),
            fd=fd,
            code=code,
            name=name,
            calls=calls,
            limit=MAX_VALUE_CHARS,
            depth=MAX_DEPTH,
        )
        res = run_python(program, pass_fds=(fd,), **limits)
        reports, load_error = read_channel(read_back(f, total), total)
    if load_error == "missing":
        return TestReport(0, total, f"The code does not define a function named {name}.")
    if load_error is not None:
        return TestReport(0, total, f"The code fails to run: {load_error}")
    ok = [
        i in reports and reports[i].error is None and not reports[i].repeated and same_value(reports[i].value, want)
        for i, want in enumerate(t["expected"] for t in tests)
    ]
    passed = sum(ok)
    for i, t in enumerate(tests):
        if ok[i]:
            continue
        r = reports.get(i)
        call = _short(_call(name, t["args"]))
        head = f"Test {i + 1} of {total}: {call}"
        if r is None:
            return TestReport(passed, total, f"{head} did not finish ({why_unfinished(res)}).")
        if r.repeated:
            return TestReport(passed, total, f"{head} reported more than one result.")
        if r.not_plain:
            return TestReport(passed, total, f"{head} returned a value that is not plain data ({r.error}).")
        if r.error is not None:
            return TestReport(passed, total, f"{head} raised {r.error}")
        return TestReport(
            passed, total, f"{head} returned {_short(repr(r.value))}, expected {_short(repr(t['expected']))}."
        )
    return TestReport(passed, total, None)


def task_parts(spec: Spec, params: Mapping[str, Any]) -> tuple[str, str, str, dict[str, Any]]:
    """Canonical key, prompt, reference source and metadata (with hidden tests) of one function.
    Tests are drawn from a generator seeded by the key: the same prompt always has the same tests."""
    source = reference_source(spec, params)
    key = f"code|{spec.id}|{json.dumps(dict(params), sort_keys=True)}"
    name = function_name(spec)
    ns: dict[str, Any] = {}
    exec(compile(source, f"<reference {spec.id}>", "exec"), ns)  # our own trusted reference code
    trng = stable_rng("code-tests", key)
    arg_lists: list[Args] = [list(e) for e in spec.edges]
    for _ in range(200):
        if len(arg_lists) >= N_TESTS:
            break
        args = spec.gen(trng)
        if args not in arg_lists:
            arg_lists.append(args)
    arg_lists = arg_lists[:N_TESTS]
    trng.shuffle(arg_lists)
    tests = [{"args": a, "expected": ns[name](*json.loads(json.dumps(a)))} for a in arg_lists]
    # show a typical call, not an edge case: edge cases stay hidden, where a test run pays off
    edges = [list(e) for e in spec.edges]
    typical = [t for t in tests if t["args"] not in edges] or tests
    ex = typical[0]
    # the test runner's tests: the example and one more typical call (MBPP shows one assert, keeps the rest)
    visible = typical[:2]
    prompt = (
        "Write a Python function.\n\n"
        f'{spec.signature}\n    """{spec.doc.format(**params)}"""\n\n'
        f"Example: {_call(name, ex['args'])} returns {ex['expected']!r}\n"
        "Reply with the complete function in a ```python block."
    )
    meta = {
        "kind": spec.kind,
        "spec": spec.id,
        "params": dict(params),
        "function": name,
        "signature": spec.signature,
        "tests": tests,
        "visible_tests": visible,
    }
    return key, prompt, source, meta


HIDDEN = ("tests", "kind")  # the verifier's tests; the kind is visible in the prompt, hidden for uniformity


class CodeSynthesisFamily:
    """Tiny Python functions with hidden tests (see the module docstring). ``sandbox`` overrides the
    limits passed to :func:`envs.tasks.sandbox.run_python` (e.g. ``{"cpu_seconds": 1}``)."""

    name = "code_synthesis"
    difficulties: tuple[int, ...] = (1, 2, 3)

    def __init__(self, test_fraction: float = 0.2, sandbox: Mapping[str, Any] | None = None) -> None:
        self.test_fraction = test_fraction
        self.sandbox = dict(sandbox or {})

    def _draw(self, rng: random.Random, level: int) -> Draw:
        spec = rng.choice([s for s in SPECS if s.level == level])
        key, prompt, source, meta = task_parts(spec, spec.params(rng))

        def make(task_id: str, split: Split, seed: int) -> Task:
            return Task(task_id, self.name, split, prompt, source, level, seed, meta, HIDDEN)

        return key, level, make

    def make_task(self, spec_id: str, params: Mapping[str, Any] | None = None, seed: int = 0) -> Task:
        """The task of one spec and parameter set (its split still decided by its content)."""
        spec = SPEC_BY_ID[spec_id]
        key, prompt, source, meta = task_parts(spec, dict(params or {}))
        split = split_of(key, self.test_fraction)
        return Task(content_id(self.name, key), self.name, split, prompt, source, spec.level, seed, meta, HIDDEN)

    def generate(self, split: Split, n: int, seed: int, difficulty: int | None = None) -> list[Task]:
        """``n`` distinct functions of ``split`` (split by spec + parameters)."""
        return sample_distinct(self.name, split, n, seed, difficulty, self.difficulties, self._draw, self.test_fraction)

    def verify(self, task: Task, text: str) -> Verdict:
        """Fraction of hidden tests passed; correct only if all pass."""
        name, tests = task.metadata["function"], task.metadata["tests"]
        code = extract_code(text, name)
        if not re.search(rf"\bdef\s+{re.escape(name)}\s*\(", code):  # a format failure: no extraction
            return Verdict(0.0, f"no definition of {name} found", None)
        rep = run_tests(code, name, tests, **self.sandbox)
        if rep.first_failure is None:
            return Verdict(1.0, f"all {rep.total} hidden tests passed", code)
        return Verdict(
            rep.passed / rep.total, f"{rep.passed}/{rep.total} hidden tests passed; {rep.first_failure}", code
        )

    def tools(self) -> Mapping[str, ToolFn]:
        """``test_runner``: runs the *visible* tests (the prompt's example and one more) on the latest candidate
        and reports the first failure; the verifier's hidden tests include edge cases it never runs."""

        def test_runner(task: Task, transcript: Sequence[Mapping[str, Any]]) -> ToolResult:
            name = task.metadata["function"]
            cand = latest_candidate(transcript, lambda t: re.search(rf"\bdef\s+{re.escape(name)}\b", t) is not None)
            if cand is None:
                return tool_result("n/a", f"No code to test yet. Write the function {name} in a ```python block.")
            code = extract_code(cand, name)
            rep = run_tests(code, name, task.metadata["visible_tests"], **self.sandbox)
            if rep.first_failure is None:
                return tool_result("pass", f"All {rep.total} visible tests passed.", f"```python\n{code.strip()}\n```")
            return tool_result("fail", rep.first_failure)

        return {"test_runner": test_runner}
