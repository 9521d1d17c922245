"""A user's own data as a task family, in the field's conventions, read from JSONL, Parquet or a
``datasets.save_to_disk`` folder.

Formats (``format=None`` detects it from the first record's fields):

==============  ===================================================================  =====================================
format          fields                                                               checked by
==============  ===================================================================  =====================================
``qa``          ``question``, ``answer`` (a string or a number)                      numeric (with a tolerance) or
                                                                                     normalised text, as below
``gsm8k``       ``question``, ``answer`` = a rationale ending in ``#### N``          the number N (GSM8K's convention)
``math``        ``problem``, ``solution`` with a ``\\boxed{...}`` answer (or          the boxed answer, normalised; equal
                ``answer``)                                                          numbers (``\\frac{1}{2}`` = 0.5) pass
``mbpp``        ``text`` (or ``prompt``), ``test_list`` (asserts), optional          every assert of ``test_list`` in the
                ``test_setup_code``, ``challenge_test_list``, ``entry_point``       sandbox (hidden), plus the challenge
                                                                                     tests
``humaneval``   ``prompt`` (signature + docstring), ``entry_point``, ``test`` (a     ``check(entry_point)`` in the sandbox
                ``check(candidate)`` function)
==============  ===================================================================  =====================================

What a reply offers as its answer (the candidate the env records, from which the action mask and the format
penalty follow) is read from the reply alone, never according to the expected answer: a ``qa`` item has one kind
whether its answer is a number or text, its candidate is the reply's marked answer (``Answer:``, ``####``) or last
line, and only the score compares it with the answer, numerically when that is a number; a ``gsm8k`` candidate is
the number the reply states. The worked solution (``rationale``), the hidden tests and unrecognised fields are
hidden from tools.

Every record may carry ``id`` (unique), ``difficulty`` (int, default 1) and ``split`` (``train`` / ``test``,
overriding the split by content hash; a ``datasets`` folder's own ``train`` / ``test`` splits count the same); other
fields are kept in ``metadata["extra"]``. Code tasks get a ``test_runner`` tool that runs only the *visible* tests
(``visible_tests`` if given, else MBPP's first assert, which MBPP prompts show; HumanEval has none beyond the
docstring), while the verifier runs the hidden ones: the conductor sees an imperfect check, as in MBPP/HumanEval
practice. Other tasks get the ``calculator`` (it re-checks arithmetic a reply wrote, never the answer).

Errors: any problem with the data is a :class:`UserDataError` whose message names the file, the line (JSONL) or row
(Parquet, ``datasets``) and the field; asking for more tasks of a split than the file holds is one too. Nothing is
downloaded: a ``datasets`` folder is read with ``load_from_disk``.
"""

from __future__ import annotations

import ast
import builtins
import json
import os
import re
import string
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

from envs.tasks.base import SPLITS, Split, Task, ToolFn, ToolResult, Verdict, split_of
from envs.tasks.calculator import calculator
from envs.tasks.code_synthesis import extract_code
from envs.tasks.common import content_id, latest_candidate, stable_rng, tool_result
from envs.tasks.extract import extract_marked, extract_number_with_rule, parse_number
from envs.tasks.sandbox import run_python
from envs.tasks.verdicts import (
    MAX_DEPTH,
    MAX_VALUE_CHARS,
    channel_file,
    describe_exception,
    harness_source,
    line_receiver,
    line_sender,
    read_back,
    read_channel,
    run_checks,
    serve_calls,
    why_unfinished,
)

FORMATS = ("qa", "gsm8k", "math", "mbpp", "humaneval")
CODE_INSTRUCTION = "Reply with the complete function in a ```python block."


class UserDataError(ValueError):
    """A record of the data (or a request for it) is not usable; the message names the file, line or row, and
    field."""


# ----------------------------------------------------------------------------------------------------------------
# reading records


def _jsonl(path: Path) -> list[tuple[str, dict[str, Any], Split | None]]:
    try:
        raw = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise UserDataError(f"{path}: cannot read: {e}") from e
    rows: list[tuple[str, dict[str, Any], Split | None]] = []
    for lineno, line in enumerate(raw.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise UserDataError(f"{where}: invalid JSON: {e.msg} (column {e.colno})") from e
        if not isinstance(obj, dict):
            raise UserDataError(f"{where}: expected a JSON object, got {type(obj).__name__}")
        rows.append((where, obj, None))
    return rows


def _parquet(path: Path) -> list[tuple[str, dict[str, Any], Split | None]]:
    import pyarrow.parquet as pq

    try:
        records = pq.read_table(path).to_pylist()
    except Exception as e:  # pyarrow raises its own error types for a file that is not Parquet
        raise UserDataError(f"{path}: not a readable Parquet file ({type(e).__name__}: {e})") from e
    return [(f"{path}: row {i}", r, None) for i, r in enumerate(records)]


def _datasets_folder(path: Path) -> list[tuple[str, dict[str, Any], Split | None]]:
    import datasets

    try:
        data = datasets.load_from_disk(str(path))
    except Exception as e:  # datasets raises FileNotFoundError or its own errors for a folder it cannot read
        raise UserDataError(f"{path}: not a datasets.save_to_disk folder ({type(e).__name__}: {e})") from e
    parts = data.items() if isinstance(data, datasets.DatasetDict) else [(None, data)]
    rows: list[tuple[str, dict[str, Any], Split | None]] = []
    for name, part in parts:
        if name is not None and name not in SPLITS:
            raise UserDataError(f"{path}: split {name!r}: expected one of {', '.join(SPLITS)} (rename or drop it)")
        label = f" [{name}]" if name is not None else ""
        rows += [(f"{path}{label}: row {i}", dict(r), name) for i, r in enumerate(part)]
    return rows


def is_user_data(name: str) -> bool:
    """A ``--family`` that names a user's data: a ``.jsonl`` or ``.parquet`` file, or a ``datasets.save_to_disk``
    folder (it holds ``dataset_info.json`` or ``dataset_dict.json``; a folder that happens to share a family's name
    does not count)."""
    folder = Path(name)
    return name.endswith((".jsonl", ".parquet")) or any(
        (folder / marker).is_file() for marker in ("dataset_info.json", "dataset_dict.json")
    )


def read_records(path: str | Path) -> list[tuple[str, dict[str, Any], Split | None]]:
    """(where, record, split of its container) of every record: ``.jsonl`` (blank lines skipped), ``.parquet`` or a
    ``datasets.save_to_disk`` folder."""
    p = Path(path)
    if p.is_dir():
        rows = _datasets_folder(p)
    elif p.suffix == ".jsonl":
        rows = _jsonl(p)
    elif p.suffix == ".parquet":
        if not p.exists():
            raise UserDataError(f"{p}: no such file")
        rows = _parquet(p)
    else:
        raise UserDataError(
            f"{p}: unsupported data ({'no such file' if not p.exists() else p.suffix or 'no suffix'}); "
            "expected a .jsonl file, a .parquet file or a datasets.save_to_disk folder"
        )
    if not rows:
        raise UserDataError(f"{p}: no records")
    return rows


# ----------------------------------------------------------------------------------------------------------------
# conventions


def detect_format(record: Mapping[str, Any], where: str) -> str:
    """The convention of a record, from its fields."""
    keys = set(record)
    if {"problem", "solution"} <= keys or ("problem" in keys and "answer" in keys):
        return "math"
    if {"prompt", "entry_point", "test"} <= keys:
        return "humaneval"
    if "test_list" in keys:
        return "mbpp"
    if {"question", "answer"} <= keys:
        return "gsm8k" if isinstance(record["answer"], str) and "####" in record["answer"] else "qa"
    raise UserDataError(
        f"{where}: cannot tell the format from the fields {sorted(keys)} (expected question/answer, problem/solution, "
        "text/test_list or prompt/entry_point/test; or pass format=)"
    )


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` (or ``\\fbox{...}``) in ``text``, braces balanced; None if none."""
    starts = [m.end() for m in re.finditer(r"\\(?:boxed|fbox)\s*\{", text)]
    if not starts:
        return None
    i = depth = starts[-1]
    depth = 1
    while i < len(text) and depth:
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        i += 1
    return text[starts[-1] : i - 1] if depth == 0 else None


def normalize_math(s: str) -> str:
    """A boxed answer in a canonical spelling: no spaces, ``\\left``/``\\right``, ``\\!``, ``$``, ``\\text{}``
    wrappers or a trailing period; ``\\dfrac``/``\\tfrac`` → ``\\frac``."""
    s = re.sub(r"\\text\{([^{}]*)\}", r"\1", s)
    for old, new in (
        ("\\left", ""),
        ("\\right", ""),
        ("\\!", ""),
        ("\\,", ""),
        ("$", ""),
        ("\\dfrac", "\\frac"),
        ("\\tfrac", "\\frac"),
        ("^\\circ", ""),
        ("^{\\circ}", ""),
    ):
        s = s.replace(old, new)
    return re.sub(r"\s+", "", s).rstrip(".")


def math_value(s: str) -> Fraction | None:
    """A number written as ``3``, ``-0.5``, ``1,000``, ``3/4`` or ``\\frac{3}{4}``; None otherwise."""
    s = normalize_math(s).replace(",", "")
    m = re.fullmatch(r"(-?)\\frac\{(-?\d+)\}\{(-?\d+)\}", s) or re.fullmatch(r"(-?)(-?\d+)/(-?\d+)", s)
    try:
        if m:
            v = Fraction(int(m.group(2)), int(m.group(3)))
            return -v if m.group(1) else v
        return Fraction(s) if re.fullmatch(r"-?\d+(\.\d+)?", s) else None
    except (ValueError, ZeroDivisionError):
        return None


def normalize_text(s: str) -> str:
    """Lower case, drop punctuation and articles, collapse whitespace (SQuAD-style)."""
    s = s.lower().translate(str.maketrans("", "", string.punctuation))
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


@dataclass
class Item:
    """One usable record: the task text, its answer and what its checker and tools need."""

    where: str
    prompt: str
    answer: str
    kind: str  # qa | numeric | math | code (a function of the format, never of the answer)
    id: str | None = None
    difficulty: int = 1
    split: Split | None = None
    meta: dict[str, Any] = field(default_factory=dict)


def _string(record: Mapping[str, Any], key: str, where: str) -> str:
    value = record.get(key)
    if not isinstance(value, str) or not value.strip():
        raise UserDataError(f"{where}: '{key}' must be a non-empty string")
    return value


def _strings(record: Mapping[str, Any], key: str, where: str, required: bool = True) -> list[str]:
    value = record.get(key)
    if value is None and not required:
        return []
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) and v.strip() for v in value):
        raise UserDataError(f"{where}: '{key}' must be a list of non-empty strings (asserts)")
    if required and not value:
        raise UserDataError(f"{where}: '{key}' is empty: no test to run")
    return list(value)


def _compiles(code: str, key: str, where: str) -> None:
    try:
        compile(code, f"<{key}>", "exec")
    except SyntaxError as e:
        raise UserDataError(f"{where}: '{key}' is not valid Python ({e.msg}, line {e.lineno})") from e


def parse_record(record: Mapping[str, Any], fmt: str, where: str) -> Item:
    """The :class:`Item` of one record in convention ``fmt`` (UserDataError naming ``where`` and the field)."""
    if fmt == "qa":
        a = record.get("answer")
        if isinstance(a, bool) or not isinstance(a, str | int | float) or (isinstance(a, str) and not a.strip()):
            raise UserDataError(f"{where}: 'answer' must be a non-empty string or a number")
        # one kind for every qa item: a kind read off the answer ("numeric" when it parses) would tell whoever sees
        # the metadata, and the candidate the env reads from a reply, something about the answer
        return Item(where, _string(record, "question", where), str(a), "qa")
    if fmt == "gsm8k":
        rationale = _string(record, "answer", where)
        if "####" not in rationale:
            raise UserDataError(f"{where}: 'answer' has no '#### N' final answer (the GSM8K convention)")
        final = rationale.rsplit("####", 1)[1].strip().replace(",", "")
        if parse_number(final) is None:
            raise UserDataError(f"{where}: 'answer': the text after '####' is not a number: {final!r}")
        return Item(where, _string(record, "question", where), final, "numeric", meta={"rationale": rationale})
    if fmt == "math":
        problem = _string(record, "problem", where)
        if isinstance(record.get("answer"), str) and record["answer"].strip():
            boxed = record["answer"]
        else:
            solution = _string(record, "solution", where)
            found = last_boxed(solution)
            if found is None or not found.strip():
                raise UserDataError(f"{where}: 'solution' has no \\boxed{{...}} answer (and no 'answer' field)")
            boxed = found
        return Item(where, problem, boxed.strip(), "math")
    if fmt in ("mbpp", "humaneval"):
        return _code_item(record, fmt, where)
    raise UserDataError(f"{where}: unknown format {fmt!r} (expected one of {', '.join(FORMATS)})")


def _code_item(record: Mapping[str, Any], fmt: str, where: str) -> Item:
    if fmt == "mbpp":
        text = record.get("text", record.get("prompt"))
        if not isinstance(text, str) or not text.strip():
            raise UserDataError(f"{where}: 'text' (or 'prompt') must be a non-empty string")
        tests = _strings(record, "test_list", where) + _strings(record, "challenge_test_list", where, required=False)
        setup = record.get("test_setup_code") or ""
        if not isinstance(setup, str):
            raise UserDataError(f"{where}: 'test_setup_code' must be a string")
        entry = record.get("entry_point")
        if entry is None:
            m = re.search(r"assert\s+(?:not\s+)?\(?\s*([A-Za-z_]\w*)\s*\(", tests[0])
            if m is None:
                raise UserDataError(
                    f"{where}: 'test_list': cannot find the function called in {tests[0]!r}; give 'entry_point'"
                )
            entry = m.group(1)
        visible = _strings(record, "visible_tests", where, required=False) or tests[:1]
        prompt = f"{text.strip()}\nYour code should pass this test:\n" + "\n".join(visible) + f"\n{CODE_INSTRUCTION}"
    else:
        text = _string(record, "prompt", where)
        entry = _string(record, "entry_point", where)
        check = _string(record, "test", where)
        if not re.search(r"\bdef\s+check\s*\(", check):
            raise UserDataError(f"{where}: 'test' must define check(candidate) (the HumanEval convention)")
        tests = [f"{check}\ncheck({entry})"]
        setup = ""
        visible = _strings(record, "visible_tests", where, required=False)
        prompt = f"Complete this Python function.\n\n{text.rstrip()}\n\n{CODE_INSTRUCTION}"
    if not isinstance(entry, str) or not re.fullmatch(r"[A-Za-z_]\w*", entry):
        raise UserDataError(f"{where}: 'entry_point' must be a Python name, got {entry!r}")
    for i, t in enumerate([setup, *tests, *visible]):
        _compiles(t, "test_setup_code" if i == 0 else "tests", where)
    meta = {"function": entry, "tests": tests, "visible_tests": visible, "setup": setup}
    return Item(where, prompt, "(passes the hidden tests)", "code", meta=meta)


# ----------------------------------------------------------------------------------------------------------------
# checking
#
# An assert holds its expected value (``assert f(2) == 4``), so the asserts never run in the candidate's process:
# a *test process* (sandboxed too, it runs only the setup and the tests) calls the candidate's functions through
# proxies, and a *candidate process* (the setup, then the candidate's code) answers each call with the return
# value as plain data, over two pipes. The test process alone reports verdicts, on a channel the candidate has no
# descriptor of; values come back as exact builtin types, so no ``__eq__`` of the candidate's runs in a comparison.


def helper_names(setup: str, tests: Sequence[str]) -> list[str]:
    """The names the tests may call on the candidate's side besides the entry point: every name the setup or the
    tests read but never bind and that is no builtin (HumanEval's checks call helpers the prompt defines, like
    ``encode_cyclic``). So a candidate defining ``sorted``, or a helper the setup defines, takes nothing over."""
    read: set[str] = set()
    bound: set[str] = set()
    for src in (setup, *tests):
        try:
            tree = ast.parse(src)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Name):
                (read if isinstance(node.ctx, ast.Load) else bound).add(node.id)
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                bound.add(node.name)
            elif isinstance(node, ast.alias):
                bound.add((node.asname or node.name).split(".")[0])
            elif isinstance(node, ast.arg):
                bound.add(node.arg)
            elif isinstance(node, ast.ExceptHandler | ast.MatchAs | ast.MatchStar) and node.name:
                bound.add(node.name)
            elif isinstance(node, ast.MatchMapping) and node.rest:
                bound.add(node.rest)
    return sorted(read - bound - set(dir(builtins)))


_CANDIDATE = "{source}\nserve_calls({rfd}, {wfd}, {setup!r}, {code!r}, {limit}, {depth})\n"
_CHECKS = "{source}\nrun_checks({rfd}, {wfd}, {out}, {setup!r}, {tests!r}, {entry!r}, {helpers!r}, {limit}, {depth})\n"


def run_asserts(
    code: str, tests: Sequence[str], setup: str = "", entry: str | None = None, **limits: Any
) -> tuple[int, str | None]:
    """(tests passed, the first failure as one line or None) of ``code`` against assert-style ``tests``: the
    candidate's process and the test process run side by side in the sandbox (see the comment above); each
    verdict is written as soon as its test ends, so tests finished before a timeout still count. ``entry``: the
    function under test, the candidate's even where the setup defines that name too. Limitations:
    arguments and return values must be plain data (a test passing a lambda, or a function returning an object
    of its own class, fails), and a test does not see the candidate mutate an argument in place."""
    total = len(tests)
    source = harness_source(describe_exception, line_sender, line_receiver, serve_calls, run_checks)
    req_r, req_w = os.pipe()  # test process -> candidate process
    rep_r, rep_w = os.pipe()  # candidate process -> test process
    f, out = channel_file()
    common = {"setup": setup, "limit": MAX_VALUE_CHARS, "depth": MAX_DEPTH, "source": source}
    helpers = helper_names(setup, tests)
    checks = _CHECKS.format(rfd=rep_r, wfd=req_w, out=out, tests=list(tests), entry=entry, helpers=helpers, **common)
    candidate = _CANDIDATE.format(rfd=req_r, wfd=rep_w, code=code, **common)
    with f, ThreadPoolExecutor(max_workers=1) as pool:
        try:
            checker = pool.submit(run_python, checks, pass_fds=(rep_r, req_w, out), **limits)
        except BaseException:  # no run took the descriptors: close them here
            for fd in (req_r, req_w, rep_r, rep_w, out):
                os.close(fd)
            raise
        cand = run_python(candidate, pass_fds=(req_r, rep_w), **limits)  # each run closes its fds once started
        res = checker.result()
        reports, load_error = read_channel(read_back(f, total), total)
    if load_error is not None:
        return 0, f"The code fails to run: {load_error}"
    ok = [i in reports and reports[i].value is True and not reports[i].repeated for i in range(total)]
    passed = sum(ok)
    for i, t in enumerate(tests):
        if ok[i]:
            continue
        r = reports.get(i)
        shown = t.strip().splitlines()[-1][:100]
        if r is None:
            why = cand.killed_reason or res.killed_reason or why_unfinished(res if res.returncode else cand)
            return passed, f"Test {i + 1} of {total} did not finish ({why})."
        return passed, f"Test {i + 1} of {total} failed: {shown} ({r.error or 'reported more than once'})"
    return passed, None


def check_item(task: Task, text: str, **sandbox: Any) -> Verdict:
    """The verifier of a user-data task (rules in the module docstring); reads only the task, so it also verifies
    stored tasks without the data file."""
    meta = task.metadata
    kind = meta.get("kind")
    if kind == "code":
        name = meta["function"]
        code = extract_code(text, name)
        if not re.search(rf"\bdef\s+{re.escape(name)}\s*\(", code):
            return Verdict(0.0, f"no definition of {name} found", None)
        passed, failure = run_asserts(code, meta["tests"], meta.get("setup", ""), entry=name, **sandbox)
        total = len(meta["tests"])
        if failure is None:
            return Verdict(1.0, f"all {total} hidden tests passed", code)
        return Verdict(passed / total, f"{passed}/{total} hidden tests passed; {failure}", code)
    if kind == "math":
        got = last_boxed(text) or extract_marked(text)
        if got is None:
            lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
            got = lines[-1] if lines else None
        if got is None:
            return Verdict(0.0, "empty answer", None)
        want_v, got_v = math_value(task.answer), math_value(got)
        if normalize_math(got) == normalize_math(task.answer) or (want_v is not None and want_v == got_v):
            return Verdict(1.0, f"correct: {got!r}", got)
        return Verdict(0.0, f"wrong: {got!r}, expected {task.answer!r}", got)
    if kind == "numeric":  # GSM8K: the format says the answer is a number
        got_n, rule = extract_number_with_rule(text)
        if got_n is None:
            return Verdict(0.0, "no number found in the answer", None)
        return _numeric_verdict(task, text, got_n)
    # qa (and "text", the kind of tasks stored before qa had one kind): what the reply offers is read from the reply
    # alone, the same way whatever the answer, so the candidate the env records (and the action mask that follows
    # from it) cannot depend on the answer; only the score compares it with the answer, numerically when that is a
    # number
    seg = extract_marked(text)
    if seg is None:
        lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
        seg = lines[-1] if lines else None
    if seg is None:
        return Verdict(0.0, "empty answer", None)
    if parse_number(task.answer.strip()) is not None:
        return _numeric_verdict(task, text, seg)
    if normalize_text(seg) == normalize_text(task.answer):
        return Verdict(1.0, f"correct: {seg!r}", seg)
    return Verdict(0.0, f"wrong: {seg!r}, expected {task.answer!r}", seg)


def _numeric_verdict(task: Task, text: str, extracted: str) -> Verdict:
    """The score of ``text`` against a numeric answer (the number it states, by the rules of
    :func:`~envs.tasks.extract.extract_number_with_rule`, within the task's tolerance); ``extracted``, the candidate
    the reply offers, is returned whatever the answer."""
    meta = task.metadata
    want = parse_number(task.answer.strip())
    got_n, rule = extract_number_with_rule(text)
    if want is None:
        return Verdict(0.0, f"the expected answer {task.answer!r} is not a number", extracted)
    if got_n is None:
        return Verdict(0.0, "no number found in the answer", extracted)
    g = parse_number(got_n)
    assert g is not None
    tol = max(float(meta.get("abs_tol", 1e-9)), float(meta.get("rel_tol", 1e-6)) * abs(float(want)))
    if abs(float(g) - float(want)) <= tol:
        return Verdict(1.0, f"correct: {got_n} (rule {rule!r})", extracted)
    return Verdict(0.0, f"wrong: read {got_n} (rule {rule!r}), expected {task.answer}", extracted)


def visible_test_runner(task: Task, transcript: Sequence[Mapping[str, Any]]) -> ToolResult:
    """``test_runner`` of a user-data code task: the VISIBLE tests on the latest candidate."""
    meta = task.metadata
    name, visible = meta["function"], meta.get("visible_tests") or []
    cand = latest_candidate(transcript, lambda t: re.search(rf"\bdef\s+{re.escape(name)}\b", t) is not None)
    if cand is None:
        return tool_result("n/a", f"No code to test yet. Write the function {name} in a ```python block.")
    code = extract_code(cand, name)
    if not visible:
        passed, failure = run_asserts(code, [], meta.get("setup", ""), entry=name)
        if failure is not None:
            return tool_result("fail", failure)
        return tool_result("n/a", f"The code runs; this task has no visible tests to check {name} with.")
    passed, failure = run_asserts(code, visible, meta.get("setup", ""), entry=name)
    if failure is None:
        return tool_result("pass", f"All {len(visible)} visible tests passed.", f"```python\n{code.strip()}\n```")
    return tool_result("fail", failure)


def tools_of(task: Task) -> Mapping[str, ToolFn]:
    """The tools of a user-data task: the visible-test runner for code, else the calculator."""
    if task.metadata.get("kind") == "code":
        return {"test_runner": visible_test_runner}
    return {"calculator": calculator}


# ----------------------------------------------------------------------------------------------------------------
# the family


class UserDataFamily:
    """Tasks from a user's file or folder in one of :data:`FORMATS` (see the module docstring).

    Args:
        path: a ``.jsonl`` file, a ``.parquet`` file or a ``datasets.save_to_disk`` folder.
        name: the family name recorded in every task (default ``jsonl``, the CLI's ``--family FILE``).
        format: one of :data:`FORMATS`; None detects it from the first record.
        test_fraction: share of records (by content hash) in the test split, where no split is given.
        rel_tol, abs_tol: tolerance of numeric answers.
    """

    def __init__(
        self,
        path: str | Path,
        name: str = "jsonl",
        format: str | None = None,  # noqa: A002  (the field's conventional name)
        test_fraction: float = 0.2,
        rel_tol: float = 1e-6,
        abs_tol: float = 1e-9,
        sandbox: Mapping[str, Any] | None = None,
    ) -> None:
        self.path, self.name, self.test_fraction = Path(path), name, test_fraction
        self.rel_tol, self.abs_tol = rel_tol, abs_tol
        self.sandbox = dict(sandbox or {})
        rows = read_records(self.path)
        self.format = format or detect_format(rows[0][1], rows[0][0])
        if self.format not in FORMATS:
            raise UserDataError(f"{self.path}: unknown format {self.format!r} (expected one of {', '.join(FORMATS)})")
        self.items = [self._item(where, rec, split) for where, rec, split in rows]
        ids: dict[str, str] = {}
        for it in self.items:
            if it.id is not None:
                if it.id in ids:
                    raise UserDataError(f"{it.where}: duplicate id {it.id!r} (first at {ids[it.id]})")
                ids[it.id] = it.where
        self.difficulties: tuple[int, ...] = tuple(sorted({it.difficulty for it in self.items})) or (1,)

    def _item(self, where: str, record: Mapping[str, Any], container_split: Split | None) -> Item:
        item = parse_record(record, self.format, where)
        item_id = record.get("id", record.get("task_id"))
        if item_id is not None and (isinstance(item_id, bool) or not isinstance(item_id, str | int)):
            raise UserDataError(f"{where}: 'id' must be a string or an integer")
        diff = record.get("difficulty", 1)
        if isinstance(diff, bool) or not isinstance(diff, int):
            raise UserDataError(f"{where}: 'difficulty' must be an integer")
        split = record.get("split", container_split)
        if split is not None and split not in SPLITS:
            raise UserDataError(f"{where}: 'split' must be one of {', '.join(SPLITS)}, got {split!r}")
        known = {
            "question",
            "answer",
            "problem",
            "solution",
            "text",
            "prompt",
            "test_list",
            "challenge_test_list",
            "test_setup_code",
            "entry_point",
            "test",
            "visible_tests",
            "id",
            "task_id",
            "difficulty",
            "split",
        }
        item.id = None if item_id is None else str(item_id)
        item.difficulty = diff
        item.split = split or split_of(f"{self.name}|{item.prompt.strip()}", self.test_fraction)
        item.meta["extra"] = {k: v for k, v in record.items() if k not in known and _jsonable(v)}
        return item

    def _task(self, it: Item, seed: int) -> Task:
        meta = {
            **it.meta,
            "kind": it.kind,
            "format": self.format,
            "source": "user_data",
            "path": str(self.path),
            "where": it.where,
            "rel_tol": self.rel_tol,
            "abs_tol": self.abs_tol,
        }
        tid = f"{self.name}-{it.id}" if it.id is not None else content_id(self.name, it.prompt)
        assert it.split is not None
        # the verifier's tests, GSM8K's worked solution and any unrecognised field (it may hold a solution) are kept
        # from tools
        hidden = ("tests", "rationale", "extra")
        return Task(tid, self.name, it.split, it.prompt, it.answer, it.difficulty, seed, meta, hidden)

    def generate(self, split: Split, n: int, seed: int, difficulty: int | None = None) -> list[Task]:
        """``n`` items of ``split`` (and ``difficulty`` if given) in a seeded shuffle; UserDataError if the data
        holds fewer."""
        pool = [it for it in self.items if it.split == split and (difficulty is None or it.difficulty == difficulty)]
        if n > len(pool):
            level = f", difficulty {difficulty}" if difficulty is not None else ""
            raise UserDataError(
                f"{self.path}: {n} {split} tasks requested{level}, the data holds {len(pool)} "
                f"(of {len(self.items)} records; ask for fewer, or give records a 'split' field)"
            )
        order = list(range(len(pool)))
        stable_rng(self.name, split, seed, difficulty).shuffle(order)
        return [self._task(pool[i], seed) for i in order[:n]]

    def verify(self, task: Task, text: str) -> Verdict:
        return check_item(task, text, **self.sandbox)

    def tools(self) -> Mapping[str, ToolFn]:
        if self.format in ("mbpp", "humaneval"):
            return {"test_runner": visible_test_runner}
        return {"calculator": calculator}


def _jsonable(value: Any) -> bool:
    try:
        json.dumps(value)
        return True
    except (TypeError, ValueError):
        return False


__all__ = [
    "FORMATS",
    "Item",
    "UserDataError",
    "UserDataFamily",
    "check_item",
    "detect_format",
    "is_user_data",
    "last_boxed",
    "math_value",
    "normalize_math",
    "normalize_text",
    "parse_record",
    "read_records",
    "run_asserts",
    "tools_of",
    "visible_test_runner",
]
