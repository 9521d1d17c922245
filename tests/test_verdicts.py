"""Unforgeable test verdicts: hostile candidates score 0 on every test they did not pass by computing the right
value, honest ones score as before.

Code synthesis (``run_tests``): the candidate's process only receives the arguments and reports return values
as plain data; the parent compares them with the expected values. User data (``run_asserts``): the asserts run
in a separate test process that calls the candidate's functions over pipes. Several candidates below are
attacks that *did* forge a full score against the previous in-process harness (frame inspection for the
expected value, an ``__eq__`` that always says yes, fake result lines with the harness's nonce, a helper that
shadows the setup's reference); each test is written so that it fails if the verdict is forged."""

from __future__ import annotations

from typing import Any

import pytest

from envs.tasks.code_synthesis import run_tests
from envs.tasks.user_data import helper_names, run_asserts
from envs.tasks.verdicts import MAX_DEPTH, NotPlain, make_plain_decoder, make_plain_encoder, read_channel, same_value

FAST: dict[str, Any] = {"cpu_seconds": 1, "wall_seconds": 5}
TESTS = [{"args": [2, 3], "expected": 5}, {"args": [10, -4], "expected": 6}, {"args": [7, 7], "expected": 14}]
HONEST = "def add(a, b):\n    return a + b\n"

# writes fake records in every format it can think of (old JSON lines, the new plain records, every value in a
# range that holds all expected values) to every descriptor, stdout included, then returns nonsense
BRUTE_FORCE = """
import os
lines = []
for i in range(5):
    lines += ['["r",%d,%d]' % (i, v) for v in range(-20, 21)]
    lines += ['{"i": %d, "ok": true, "got": "5"}' % i, '["ok",%d]' % i, '["r",%d,true]' % i]
data = ("\\n" + "\\n".join(lines) + "\\n").encode()
for fd in range(256):
    try:
        os.write(fd, data)
    except OSError:
        pass
def add(a, b):
    return None
"""

# the old harness printed results behind a nonce held in its own frame: find every string that looks like one
# and print passing results with it, now and again at exit (after the harness's own lines; this forged 3/3
# against that harness)
FAKE_STDOUT = """
import atexit, gc, os, re, sys
marks = {"@@result-0000000000000000@@"}
f = sys._getframe()
while f is not None:
    for d in (f.f_locals, f.f_globals):
        for v in list(d.values()):
            code = getattr(v, "__code__", None)
            for c in (code.co_consts if code else ()) + (v,):
                if isinstance(c, str):
                    marks.update(re.findall("@@result-[0-9a-f]+@@", c))
    f = f.f_back
def fake():
    for m in marks:
        for i in range(5):
            line = "\\n" + m + '{"i": %d, "ok": true, "got": "5"}' % i + "\\n"
            os.write(1, line.encode())
            print(line, flush=True)
fake()
atexit.register(fake)
def add(a, b):
    return -1
"""

# looks for the expected values anywhere in its process: frames (the old harness's loop variable `_t`), gc,
# inspect.stack (this forged 3/3 against the old harness)
FRAMES = """
import gc, inspect, sys
def _find():
    found = []
    f = sys._getframe()
    while f is not None:
        for d in (f.f_locals, f.f_globals):
            for v in list(d.values()):
                if isinstance(v, dict) and "expected" in v:
                    found.append(v["expected"])
        f = f.f_back
    for fi in inspect.stack():
        t = fi.frame.f_globals.get("_t")
        if isinstance(t, dict):
            found.append(t.get("expected"))
    for o in gc.get_objects():
        if isinstance(o, dict) and "expected" in o:
            found.append(o["expected"])
    return found
def add(a, b):
    found = _find()
    return found[0] if found else -999
"""

PATCH_BUILTINS = """
import builtins, json
json.dumps = lambda *a, **k: '{"i": 0, "ok": true}'
json.loads = lambda *a, **k: {"i": 0, "ok": True}
builtins.isinstance = lambda *a: True
builtins.print = lambda *a, **k: None
builtins.repr = lambda *a: "5"
builtins.bool = lambda *a: True
builtins.len = lambda *a: 0
builtins.callable = lambda *a: True
builtins.enumerate = lambda it, start=0: ((0, x) for x in it)
builtins.type = lambda *a: int
def add(a, b):
    return -1
"""

HOSTILE_EQ = """
class Anything:
    def __eq__(self, other):
        return True
    def __ne__(self, other):
        return False
    def __hash__(self):
        return 5
    def __repr__(self):
        return "5"
    def __bool__(self):
        return True
def add(a, b):
    return Anything()
"""

SUBCLASSES = """
class I(int):
    def __eq__(self, other):
        return True
    __hash__ = int.__hash__
class S(str):
    def __eq__(self, other):
        return True
    __hash__ = str.__hash__
class L(list):
    def __eq__(self, other):
        return True
calls = [0]
def add(a, b):
    calls[0] += 1
    return [I(0), S("x"), L()][calls[0] - 1]
"""

HOSTILE_CONTAINERS = """
class I(int):
    def __eq__(self, other):
        return True
    __hash__ = int.__hash__
calls = [0]
def add(a, b):
    calls[0] += 1
    return [[I(0)], {"k": I(0)}, (I(0),)][calls[0] - 1]
"""


@pytest.mark.parametrize(
    "code",
    [
        pytest.param(BRUTE_FORCE, id="brute-force-fake-records-on-every-fd"),
        pytest.param(FAKE_STDOUT, id="fake-result-lines-on-stdout"),
        pytest.param(FRAMES, id="frame-and-gc-inspection"),
        pytest.param(PATCH_BUILTINS, id="patched-builtins-and-json"),
        pytest.param(HOSTILE_EQ, id="object-with-hostile-eq-hash-repr"),
        pytest.param(SUBCLASSES, id="int-str-list-subclasses"),
        pytest.param(HOSTILE_CONTAINERS, id="subclass-inside-containers"),
        pytest.param("import sys\nsys.exit(0)\ndef add(a, b):\n    return a + b\n", id="sys-exit-in-body"),
        pytest.param("import os\nos._exit(0)\ndef add(a, b):\n    return a + b\n", id="os-exit-in-body"),
        pytest.param("def add(a, b):\n    import sys\n    sys.exit(0)\n", id="sys-exit-in-function"),
        pytest.param("def add(a, b):\n    import os\n    os._exit(0)\n", id="os-exit-in-function"),
        pytest.param("def add(a, b):\n    raise SystemExit(0)\n", id="raise-systemexit"),
        pytest.param("def add(a, b):\n    raise KeyboardInterrupt\n", id="raise-keyboardinterrupt"),
        pytest.param(
            "import os\nos.close(1)\nos.dup2(os.open(os.devnull, os.O_WRONLY), 2)\ndef add(a, b):\n    return 0\n",
            id="closed-and-dup-stdout",
        ),
        pytest.param(
            "import os\ndef add(a, b):\n    for fd in range(1024):\n        try:\n            os.close(fd)\n"
            "        except OSError:\n            pass\n    return a + b\n",
            id="closes-every-fd-then-answers",  # right values, but nothing reaches the parent: no pass
        ),
        pytest.param("def add(a, b):\n    return 'x' * 10 ** 7\n", id="huge-string"),
        pytest.param("def add(a, b):\n    return list(range(10 ** 6))\n", id="huge-list"),
        pytest.param(
            "def add(a, b):\n    x = []\n    for _ in range(5000):\n        x = [x]\n    return x\n", id="deep"
        ),
        pytest.param("def add(a, b):\n    x = []\n    x.append(x)\n    return x\n", id="self-containing"),
        pytest.param("def add(a, b):\n    return 10 ** 100000\n", id="huge-int"),
    ],
)
def test_hostile_candidates_score_zero(code: str) -> None:
    rep = run_tests(code, "add", TESTS, **FAST)
    assert (rep.passed, rep.total) == (0, 3), rep
    assert rep.first_failure is not None and rep.first_failure.startswith(("Test 1 of 3", "The code")), rep


def test_hostile_values_are_named_in_the_feedback() -> None:
    # the reasons, not just the scores: nothing to find in the process, patches change nothing, values are refused
    frames = run_tests(FRAMES, "add", TESTS, **FAST)
    assert frames.first_failure == "Test 1 of 3: add(2, 3) returned -999, expected 5.", (
        "no expected value in its process"
    )
    patched = run_tests(PATCH_BUILTINS, "add", TESTS, **FAST)
    assert patched.first_failure == "Test 1 of 3: add(2, 3) returned -1, expected 5."
    rep = run_tests(HOSTILE_EQ, "add", TESTS, **FAST)
    assert rep.first_failure == (
        "Test 1 of 3: add(2, 3) returned a value that is not plain data (a Anything is not plain data)."
    )
    huge = run_tests("def add(a, b):\n    return 'x' * 10 ** 7\n", "add", TESTS, **FAST)
    assert huge.first_failure is not None and "not plain data (larger than 1000000 characters)" in huge.first_failure
    digits = run_tests("def add(a, b):\n    return 10 ** 100000\n", "add", TESTS, **FAST)
    assert digits.first_failure is not None and "an int with too many digits" in digits.first_failure
    quit_ = run_tests("def add(a, b):\n    raise SystemExit(0)\n", "add", TESTS, **FAST)
    assert quit_.first_failure == "Test 1 of 3: add(2, 3) raised SystemExit: 0"
    gone = run_tests("def add(a, b):\n    import os\n    os._exit(0)\n", "add", TESTS, **FAST)
    assert gone.first_failure == "Test 1 of 3: add(2, 3) did not finish (no result)."
    brute = run_tests(BRUTE_FORCE, "add", TESTS, **FAST)
    assert brute.first_failure == "Test 1 of 3: add(2, 3) reported more than one result."


def test_honest_candidates_score_as_before() -> None:
    assert run_tests(HONEST, "add", TESTS, **FAST) == run_tests(HONEST, "add", TESTS, **FAST)
    rep = run_tests(HONEST, "add", TESTS, **FAST)
    assert (rep.passed, rep.total, rep.first_failure) == (3, 3, None)
    wrong = run_tests("def add(a, b):\n    return a * b\n", "add", TESTS, **FAST)
    assert (wrong.passed, wrong.first_failure) == (0, "Test 1 of 3: add(2, 3) returned 6, expected 5.")
    half = run_tests("def add(a, b):\n    return a + b if a < 5 else 0\n", "add", TESTS, **FAST)
    assert (half.passed, half.first_failure) == (1, "Test 2 of 3: add(10, -4) returned 0, expected 6.")
    loud = run_tests("print('@@result'); import os\ndef add(a, b):\n    print(a, b)\n    return a + b\n", "add", TESTS)
    assert loud.passed == 3, "the candidate's own prints do not disturb the verdicts"
    missing = run_tests("def plus(a, b):\n    return a + b\n", "add", TESTS, **FAST)
    assert (missing.passed, missing.first_failure) == (0, "The code does not define a function named add.")
    broken = run_tests("def add(a, b):\n    return a +\n", "add", TESTS, **FAST)
    assert broken.passed == 0 and broken.first_failure is not None and "SyntaxError" in broken.first_failure


def test_tests_finished_before_a_crash_or_timeout_still_count() -> None:
    first_only = (
        "import os\nn = [0]\ndef add(a, b):\n    n[0] += 1\n    if n[0] > 1:\n        os._exit(0)\n    return a + b\n"
    )
    rep = run_tests(first_only, "add", TESTS, **FAST)
    assert (rep.passed, rep.first_failure) == (1, "Test 2 of 3: add(10, -4) did not finish (no result).")
    spin = "def add(a, b):\n    while a > 5:\n        pass\n    return a + b\n"
    slow = run_tests(spin, "add", TESTS, cpu_seconds=1, wall_seconds=10)
    assert (slow.passed, slow.first_failure) == (1, "Test 2 of 3: add(10, -4) did not finish (CPU time limit).")


def test_a_test_reported_twice_fails() -> None:
    # a correct function that also writes a (correct) record of its own for test 1: that test is reported twice
    # and fails, the others pass
    code = (
        "import os\nfor fd in range(3, 64):\n    try:\n        os.write(fd, b'[\"r\",0,5]\\n')\n"
        "    except OSError:\n        pass\n" + HONEST
    )
    rep = run_tests(code, "add", TESTS, **FAST)
    assert (rep.passed, rep.first_failure) == (2, "Test 1 of 3: add(2, 3) reported more than one result.")


def test_types_are_checked_after_the_round_trip() -> None:
    tests: list[dict[str, Any]] = [
        {"args": [1], "expected": True},
        {"args": [2], "expected": 2},
        {"args": [3], "expected": [1, 2]},
        {"args": [4], "expected": [False]},
        {"args": [5], "expected": 2.5},
    ]
    exact = "def f(n):\n    return [None, True, 2, [1, 2], [False], 2.5][n]\n"
    assert run_tests(exact, "f", tests, **FAST).passed == 5
    loose = "def f(n):\n    return [None, 1, 2.0, (1, 2), [0], 2.5][n]\n"
    rep = run_tests(loose, "f", tests, **FAST)
    # 1 is not True, a tuple is not a list, 0 is not False; 2.0 == 2 passes (as `assert f(2) == 2` would)
    assert rep.passed == 2 and rep.first_failure == "Test 1 of 5: f(1) returned 1, expected True.", rep


def test_plain_codec_round_trip_and_refusals() -> None:
    enc, dec = make_plain_encoder(10_000, MAX_DEPTH), make_plain_decoder(10_000, MAX_DEPTH)
    values = [
        None,
        True,
        0,
        -(2**70),
        1.5,
        float("inf"),
        'é\ud800"',
        b"\x00\xff",
        [1, [2]],
        (1, (2,)),
        {1, 2},
        frozenset({"a"}),
        {"a": [1], (1, 2): None},
        [],
        (),
        {},
        set(),
    ]
    for v in values:
        back = dec(enc(v))
        assert type(back) is type(v) and same_value(back, v), v

    class Int(int):
        pass

    deep: list[object] = []
    for _ in range(MAX_DEPTH + 1):
        deep = [deep]
    for bad in [Int(3), [Int(3)], {1: object()}, "x" * 20_000, deep, 10**30000, print]:
        with pytest.raises(NotPlain):
            enc(bad)
    for text in [
        '{"x": 1}',
        "NaN",
        '{"tuple": [1], "tuple": [2]}',
        '{"set": [[1]]}',
        '{"dict": [[1, 2, 3]]}',
        '{"bytes": "AB"}',
        "[1,",
        '{"dict": [[1, 2], [1, 3]]}',
        "[" * 5000 + "]" * 5000,
    ]:
        with pytest.raises(NotPlain):
            dec(text)


def test_read_channel_rules() -> None:
    data = b'["r",0,5]\n["r",1,6]\n["r",1,6]\ngarbage\n["r",7,1]\n{"i": 2, "ok": true}\n["e",2,"boom"]\n["r",0'
    reports, load_error = read_channel(data, 3)
    assert load_error is None
    assert reports[0].value == 5 and not reports[0].repeated
    assert reports[1].repeated  # reported twice: fails
    assert reports[2].error == "boom"
    assert set(reports) == {0, 1, 2}  # index 7 is out of range; the unterminated last line is ignored


# ---------------------------------------------------------------------------------------------------------------
# assert-style tests (user data: MBPP / HumanEval)

ASSERTS = ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(20, 22) == 42"]

# the function reads the expected constant from its caller's code (the old harness ran the assert in the
# candidate's process: this passed every test)
CALLER_CONSTS = """
import sys
def add(a, b):
    f = sys._getframe(1)
    ints = [c for c in f.f_code.co_consts if type(c) is int]
    return ints[-1] if ints else -999
"""

# pre-writes replies to every descriptor, the reply pipe included, before any call: they are read as its answers,
# which makes it no better than `return 99`
PREWRITE_REPLIES = """
import os
for fd in range(3, 256):
    try:
        os.write(fd, b'["v",99]\\n' * 50 + b'["r",0,true]\\n["r",1,true]\\n["r",2,true]\\n')
    except OSError:
        pass
def add(a, b):
    return 99
"""

# writes passing verdicts into any file descriptor of any other process it can open through /proc
PROC_FDS = """
import os
for pid in os.listdir("/proc") if os.path.isdir("/proc") else []:
    if not pid.isdigit() or int(pid) == os.getpid():
        continue
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        continue
    for fd in fds:
        try:
            w = os.open(f"/proc/{pid}/fd/{fd}", os.O_WRONLY | os.O_APPEND)
            os.write(w, b'["r",0,true]\\n["r",1,true]\\n["r",2,true]\\n')
            os.close(w)
        except OSError:
            pass
def add(a, b):
    return 99
"""


@pytest.mark.parametrize(
    ("code", "limits"),
    [
        pytest.param(CALLER_CONSTS, {}, id="reads-the-caller-frame"),
        pytest.param(HOSTILE_EQ, {}, id="hostile-eq"),
        pytest.param(SUBCLASSES, {}, id="subclasses"),
        pytest.param(PATCH_BUILTINS, {}, id="patched-builtins"),
        pytest.param(BRUTE_FORCE, {}, id="brute-force-fake-records"),
        pytest.param(PREWRITE_REPLIES, {}, id="pre-written-replies"),
        pytest.param(PROC_FDS, {"audit_hook": False}, id="proc-fds-os-layers-only"),
        pytest.param(PROC_FDS, {"audit_hook": False, "landlock": False}, id="proc-fds-without-landlock"),
        pytest.param("import sys\nsys.exit(0)\n" + HONEST, {}, id="sys-exit-in-body"),
        pytest.param("import os\nos._exit(0)\n" + HONEST, {}, id="os-exit-in-body"),
        pytest.param("def add(a, b):\n    import os\n    os._exit(0)\n", {}, id="os-exit-in-function"),
        pytest.param("def add(a, b):\n    raise KeyboardInterrupt\n", {}, id="raise-keyboardinterrupt"),
        pytest.param("def add(a, b):\n    raise SystemExit(0)\n", {}, id="raise-systemexit"),
        pytest.param("def add(a, b):\n    return 'x' * 10 ** 7\n", {}, id="huge-string"),
    ],
)
def test_hostile_candidates_fail_the_asserts(code: str, limits: dict[str, object]) -> None:
    passed, failure = run_asserts(code, ASSERTS, entry="add", **FAST, **limits)  # type: ignore[arg-type]
    assert passed == 0 and failure is not None, failure


def test_a_candidate_cannot_take_over_the_setups_reference_helper() -> None:
    setup = "def expect(a, b):\n    return a + b\n"
    tests = ["assert add(2, 3) == expect(2, 3)", "assert sorted([add(1, 1), 1]) == [1, 2]"]
    forged = "def add(a, b):\n    return 0\ndef expect(a, b):\n    return 0\ndef sorted(x):\n    return [1, 2]\n"
    assert run_asserts(forged, tests, setup, entry="add", **FAST) == (
        0,
        "Test 1 of 2 failed: assert add(2, 3) == expect(2, 3) (assertion failed)",
    )
    assert run_asserts(HONEST, tests, setup, entry="add", **FAST) == (2, None)
    assert helper_names(setup, tests) == ["add"]  # `expect` is the setup's, `sorted` a builtin


def test_honest_candidates_pass_the_asserts() -> None:
    assert run_asserts(HONEST, ASSERTS, entry="add", **FAST) == (3, None)
    assert run_asserts(HONEST, ASSERTS, **FAST) == (3, None)  # the entry point found as a name the tests read
    assert run_asserts("def add(a, b):\n    return a * b + 1\n", ASSERTS, **FAST) == (
        2,
        "Test 3 of 3 failed: assert add(20, 22) == 42 (assertion failed)",
    )
    assert run_asserts("def add(a, b):\n    return a +\n", ASSERTS, **FAST)[1].startswith(  # type: ignore[union-attr]
        "The code fails to run: SyntaxError"
    )
    assert run_asserts(HONEST, [], **FAST) == (0, None)  # no tests: the code loads
    spin = "def add(a, b):\n    while a > 0:\n        pass\n    return a + b\n"
    assert run_asserts(spin, ["assert add(-1, 1) == 0", "assert add(1, 2) == 3"], cpu_seconds=1, wall_seconds=10) == (
        1,
        "Test 2 of 2 did not finish (CPU time limit).",
    )


def test_assert_values_keep_their_types_and_exceptions_cross() -> None:
    code = (
        "def f(x):\n"
        "    if x < 0:\n"
        "        raise ValueError('negative')\n"
        "    return {'t': (x, x), 's': {x}, 'b': b'x', 'f': x / 2, 'n': None}\n"
    )
    tests = [
        "assert f(2) == {'t': (2, 2), 's': {2}, 'b': b'x', 'f': 1.0, 'n': None}",
        "assert isinstance(f(1)['t'], tuple) and type(f(1)['f']) is float",
        "try:\n    f(-1)\nexcept ValueError as e:\n    assert str(e) == 'negative'\nelse:\n    raise AssertionError",
        "assert f(3)['t'] == [3, 3]",  # a tuple is not a list
    ]
    assert run_asserts(code, tests, entry="f", **FAST) == (
        3,
        "Test 4 of 4 failed: assert f(3)['t'] == [3, 3] (assertion failed)",
    )


def test_humaneval_check_calls_a_helper_of_the_prompt() -> None:
    # HumanEval/38-style: the check calls `encode_cyclic`, which the prompt (so the candidate's code) defines
    code = "def encode_cyclic(s):\n    return s[1:] + s[:1]\ndef decode_cyclic(s):\n    return s[-1:] + s[:-1]\n"
    check = "def check(candidate):\n    for s in ['abc', 'hello']:\n        assert candidate(encode_cyclic(s)) == s\n"
    tests = [f"{check}\ncheck(decode_cyclic)"]
    assert helper_names("", tests) == ["decode_cyclic", "encode_cyclic"]
    assert run_asserts(code, tests, entry="decode_cyclic", **FAST) == (1, None)
    not_a_value = "def check(candidate):\n    assert candidate(lambda: 1) == 1\n\ncheck(decode_cyclic)"
    passed, failure = run_asserts(code, [not_a_value], entry="decode_cyclic", **FAST)
    assert passed == 0 and failure is not None and "not plain data" in failure
