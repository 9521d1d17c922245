"""The sandbox refuses fork bombs, runaway CPU, huge allocations, reads outside the stdlib and its temp
dir, writes outside its temp dir and network connections — each within its limits — and runs
well-behaved code.

Most refusals are shown more than once: with every layer on, and with the others switched off, to show
each layer (audit hook, Landlock, rlimits, network namespace, unprivileged uid) holds on its own where
this OS provides it; those checks skip when ``SandboxResult.mechanisms`` says the layer is not available
here. Landlock checks skip only where the kernel has no Landlock (asked directly, not through the
sandbox, so a sandbox that fails to apply it fails them)."""

from __future__ import annotations

import ctypes
import json
import os
import socket
import sqlite3
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from envs.tasks.sandbox import run_python


def _mechanisms() -> tuple[str, ...]:
    return run_python("pass").mechanisms


def _kernel_landlock_abi() -> int:
    if not sys.platform.startswith("linux"):
        return 0
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    # landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION)
    return max(0, int(libc.syscall(ctypes.c_long(444), None, ctypes.c_long(0), ctypes.c_long(1))))


MECH = _mechanisms()
LANDLOCK_ABI = _kernel_landlock_abi()
needs_landlock = pytest.mark.skipif(LANDLOCK_ABI == 0, reason="this kernel has no Landlock (reads are not confined)")
REPO = Path(__file__).resolve().parents[1]


def test_well_behaved_code_runs_in_an_empty_scrubbed_temp_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORCHESTRA_TEST_SECRET", "hunter2")
    code = (
        "import os, json\n"
        "open('scratch.txt', 'w').write('ok')\n"
        "print(json.dumps({'cwd': os.getcwd(), 'files': sorted(os.listdir('.')), 'env': dict(os.environ),"
        " 'read': open('scratch.txt').read()}))\n"
    )
    r = run_python(code)
    assert r.ok and r.returncode == 0 and not r.timed_out and r.killed_reason is None, r.stderr
    out = json.loads(r.stdout)
    assert out["files"] == ["scratch.txt"] and out["read"] == "ok"
    assert "hunter2" not in r.stdout and set(out["env"]) <= {"PATH", "HOME", "TMPDIR", "LANG", "LC_CTYPE"}
    assert not os.path.exists(out["cwd"]), "the temp dir is deleted afterwards"
    assert "rlimits" in r.mechanisms and "audit" in r.mechanisms


def test_errors_and_output_limit() -> None:
    r = run_python("raise ValueError('boom')")
    assert not r.ok and r.returncode == 1 and "ValueError: boom" in r.stderr and r.killed_reason is None
    big = run_python("print('x' * 100000)", max_output_bytes=1000)
    assert big.ok and len(big.stdout) < 1100 and big.stdout.endswith("[output truncated]")


def test_fork_bomb_is_refused() -> None:
    r = run_python("import os\nwhile True:\n    os.fork()\n")
    assert not r.ok and "PermissionError: sandbox: os.fork is not allowed" in r.stderr
    sub = run_python("import subprocess\nsubprocess.run(['true'])\n")
    assert not sub.ok and "PermissionError" in sub.stderr
    assert not r.timed_out and not sub.timed_out  # refused at once, not stopped by the wall clock


@pytest.mark.skipif("nproc" not in MECH, reason="RLIMIT_NPROC not applicable here")
def test_fork_bomb_is_refused_by_the_os_layer_alone() -> None:
    r = run_python("import os\nwhile True:\n    os.fork()\n", audit_hook=False)
    assert not r.ok and "BlockingIOError" in r.stderr, r.stderr
    assert not r.timed_out  # the process limit stopped it, not the wall clock


@pytest.mark.skipif("uid" not in MECH, reason="needs root to run the code under a fresh uid")
def test_escaped_children_are_killed() -> None:
    # children start their own session (out of the process group) and would sleep forever
    code = (
        "import os, time\n"
        "for _ in range(3):\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        "        os.setsid()\n"
        "        time.sleep(60)\n"
        "        os._exit(0)\n"
        "    print(pid, flush=True)\n"
    )
    r = run_python(code, audit_hook=False, max_processes=10)
    pids = [int(x) for x in r.stdout.split()]
    assert len(pids) == 3, r.stderr

    def alive(pid: int) -> bool:
        try:
            with open(f"/proc/{pid}/status") as f:
                return "State:\tZ" not in f.read()
        except OSError:
            return False

    deadline = time.monotonic() + 2
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(alive(p) for p in pids)


def test_infinite_loop_hits_the_cpu_limit() -> None:
    r = run_python("while True:\n    pass\n", cpu_seconds=1, wall_seconds=10)
    # killed by the 1 s CPU limit, not by the 10 s wall clock
    assert not r.ok and not r.timed_out and r.killed_reason == "CPU time limit"


def test_sleeping_forever_hits_the_wall_clock_limit() -> None:
    r = run_python("import time\ntime.sleep(60)\n", wall_seconds=1)
    assert not r.ok and r.timed_out and r.killed_reason == "wall-clock limit" and r.returncode is None


def test_huge_allocation_hits_the_memory_limit() -> None:
    r = run_python("x = bytearray(2 * 1024 ** 3)\nprint('allocated')\n", memory_mb=256)
    assert not r.ok and r.killed_reason == "memory limit" and "allocated" not in r.stdout


ONLY_AUDIT: dict[str, Any] = {"landlock": False, "drop_privileges": False}
ONLY_LANDLOCK: dict[str, Any] = {"audit_hook": False, "drop_privileges": False, "isolate_network": False}
ONLY_UID: dict[str, Any] = {"audit_hook": False, "landlock": False}
LAYERS = [
    pytest.param({}, id="all-layers"),
    pytest.param(ONLY_AUDIT, id="audit-hook-alone"),
    pytest.param(ONLY_LANDLOCK, id="landlock-alone", marks=needs_landlock),
    pytest.param(
        ONLY_UID,
        id="uid-alone",
        marks=pytest.mark.skipif("uid" not in MECH, reason="needs root to run the code under a fresh uid"),
    ),
]


@pytest.mark.parametrize("layers", LAYERS)
def test_write_outside_the_temp_dir_is_refused(tmp_path: Path, layers: dict[str, Any]) -> None:
    target = tmp_path / "escape.txt"
    r = run_python(f"open({str(target)!r}, 'w').write('pwned')\n", **layers)
    assert not r.ok and "PermissionError" in r.stderr, r.stderr
    assert not target.exists()
    keep = tmp_path / "keep.txt"
    keep.write_text("mine")
    rm = run_python(f"import os\nos.remove({str(keep)!r})\n", **layers)
    assert not rm.ok and "PermissionError" in rm.stderr and keep.read_text() == "mine"
    if layers == ONLY_LANDLOCK:
        assert "landlock" in r.mechanisms and not {"audit", "uid", "netns"} & set(r.mechanisms), r.mechanisms


# -- reads (Landlock) ---------------------------------------------------------------------------------------------

_READ_PROBE = """
import json, os, sys
out = {}
for kind, path in json.loads(sys.argv_paths):
    try:
        if kind == "list":
            os.listdir(path)
        else:
            with open(path, "rb") as f:
                f.read(16)
        out[path] = "read"
    except OSError as e:
        out[path] = type(e).__name__
print(json.dumps(out))
"""


def _probe_reads(paths: list[tuple[str, str]], **layers: Any) -> tuple[dict[str, str], tuple[str, ...]]:
    code = _READ_PROBE.replace("sys.argv_paths", repr(json.dumps(paths)))
    r = run_python(code, **layers)
    assert r.ok, r.stderr
    return json.loads(r.stdout), r.mechanisms


@pytest.fixture
def secrets_outside(tmp_path: Path) -> list[tuple[str, str]]:
    cache = tmp_path / "responses.sqlite"  # stands for the backends' response cache
    with sqlite3.connect(cache) as db:
        db.execute("create table t (k text, v text)")
        db.execute("insert into t values ('prompt', 'cached answer')")
    os.chmod(cache, 0o644)
    return [
        ("file", "/etc/shadow"),
        ("list", os.path.expanduser("~")),  # the parent's home dir (/root when run as root)
        ("file", str(REPO / "README.md")),  # the repository checkout
        ("file", str(cache)),
    ]


@needs_landlock
@pytest.mark.parametrize(
    "layers", [pytest.param({}, id="all-layers"), pytest.param(ONLY_LANDLOCK, id="landlock-alone")]
)
def test_reads_outside_the_stdlib_and_work_dir_are_refused(
    secrets_outside: list[tuple[str, str]], layers: dict[str, Any]
) -> None:
    seen, mechanisms = _probe_reads(secrets_outside, **layers)
    assert "landlock" in mechanisms
    assert seen == {p: "PermissionError" for _, p in secrets_outside}, seen


def test_without_landlock_reads_are_not_confined_and_say_so(secrets_outside: list[tuple[str, str]]) -> None:
    # the control for the test above (the files are there and readable), and the visible fallback
    r = run_python("pass", landlock=False)
    assert not r.reads_confined and "landlock" not in r.mechanisms
    seen, _ = _probe_reads(secrets_outside, landlock=False)
    repo_file, cache = secrets_outside[2][1], secrets_outside[3][1]
    assert seen[repo_file] == "read" and seen[cache] == "read", seen


@needs_landlock
def test_landlock_is_enforced_where_the_kernel_has_it() -> None:
    r = run_python("pass")
    assert r.reads_confined and "landlock" in r.mechanisms, r.mechanisms


STDLIB = [
    "json",
    "re",
    "collections",
    "math",
    "itertools",
    "functools",
    "heapq",
    "dataclasses",
    "typing",
    "fractions",
    "decimal",
    "datetime",
    "string",
    "random",
    "statistics",
    "bisect",
    "hashlib",
    "textwrap",
    "unicodedata",
    "zlib",
    "sqlite3",
    "threading",
    "zoneinfo",
    "csv",
    "struct",
    "array",
    "copy",
    "enum",
    "pathlib",
    "tempfile",
    "uuid",
    "base64",
    "difflib",
    "lzma",
    "bz2",
    "inspect",
    "ast",
]


@pytest.mark.parametrize(
    "layers", [pytest.param({}, id="all-layers"), pytest.param(ONLY_LANDLOCK, id="landlock-alone")]
)
def test_stdlib_imports_and_work_dir_writes_still_work(layers: dict[str, Any]) -> None:
    code = (
        "import importlib, os\n"
        f"for m in {STDLIB!r}:\n"
        "    importlib.import_module(m)\n"
        "import hashlib, sqlite3, threading, time, zoneinfo, datetime, decimal, fractions\n"
        "t = threading.Thread(target=lambda: None)\nt.start()\nt.join()\n"
        # daemon threads still running at exit are stopped by pthread_exit, which loads libgcc_s (else: abort)
        "def spin():\n    while True:\n        time.sleep(0.0001)\n"
        "for _ in range(4):\n    threading.Thread(target=spin, daemon=True).start()\n"
        "db = sqlite3.connect('scratch.db')\ndb.execute('create table t (x)')\ndb.commit()\n"
        "paris = datetime.datetime(2024, 7, 1, tzinfo=zoneinfo.ZoneInfo('Europe/Paris'))\n"
        "os.mkdir('d')\nopen('d/a.txt', 'w').write('ok')\nos.rename('d/a.txt', 'd/b.txt')\n"
        "print(hashlib.sha256(b'x').hexdigest()[:8], paris.tzname(), 'é'.encode('cp1252'), 'x'.encode('utf-16'),\n"
        "      decimal.Decimal('1.1') + 1, fractions.Fraction(1, 3), sorted(os.listdir('.')), open('d/b.txt').read(),\n"
        "      time.localtime().tm_year > 2000)\n"
    )
    r = run_python(code, max_processes=8, memory_mb=512, cpu_seconds=5, wall_seconds=30, **layers)
    assert r.ok, r.stderr
    assert r.stdout.split() == [
        "2d711642",
        "CEST",
        "b'\\xe9'",
        "b'\\xff\\xfex\\x00'",
        "2.1",
        "1/3",
        "['d',",
        "'scratch.db']",
        "ok",
        "True",
    ], r.stdout
    if LANDLOCK_ABI:
        assert r.reads_confined


_CAPS = (
    "import ctypes\n"
    "hdr, data = (ctypes.c_uint32 * 2)(0x20080522, 0), (ctypes.c_uint32 * 6)()\n"
    "assert ctypes.CDLL(None).capget(hdr, data) == 0\n"
    "print(data[0], data[1])\n"  # effective, permitted (low 32 bits)
)


@needs_landlock
@pytest.mark.skipif("uid" not in MECH, reason="needs root to run the code under a fresh uid")
def test_as_root_the_child_keeps_no_capability_once_landlock_confines_reads() -> None:
    r = run_python(_CAPS, audit_hook=False)  # the hook refuses ctypes
    assert r.ok and r.stdout.split() == ["0", "0"] and "nocaps" in r.mechanisms, (r.stdout, r.stderr)
    # the fallback without Landlock keeps CAP_DAC_READ_SEARCH (bit 2), which reads the stdlib under /root
    fallback = run_python(_CAPS, audit_hook=False, landlock=False)
    assert fallback.ok and fallback.stdout.split() == ["4", "4"] and "nocaps" not in fallback.mechanisms


def test_pass_fds_hands_a_private_channel_to_the_child() -> None:
    r_fd, w_fd = os.pipe()
    try:
        res = run_python(f"import os\nos.write({w_fd}, b'through the channel')\nprint('stdout')\n", pass_fds=(w_fd,))
        assert res.ok, res.stderr
        with pytest.raises(OSError):
            os.fstat(w_fd)  # closed here once the child had it, so the read below ends at EOF
        assert os.read(r_fd, 100) == b"through the channel" and os.read(r_fd, 100) == b""
        assert res.stdout == "stdout\n"
    finally:
        os.close(r_fd)


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.bind(("127.0.0.1", 0))
    srv.listen(5)
    srv.settimeout(0.3)
    yield srv
    srv.close()


def _connect_code(port: int) -> str:
    return f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=2)\nprint('connected')\n"


def _accepted(srv: socket.socket) -> bool:
    try:
        conn, _ = srv.accept()
    except TimeoutError:
        return False
    conn.close()
    return True


def test_the_listener_is_reachable_without_the_sandbox(listener: socket.socket) -> None:
    # control: the port is real, so the refusals below are refusals of a real attempt
    with socket.create_connection(listener.getsockname(), timeout=1):
        pass
    assert _accepted(listener)


def test_network_connection_is_refused(listener: socket.socket) -> None:
    r = run_python(_connect_code(listener.getsockname()[1]))
    assert not r.ok and "connected" not in r.stdout and "PermissionError" in r.stderr
    assert not _accepted(listener)


@pytest.mark.skipif("netns" not in MECH, reason="no network namespace available here")
def test_network_is_unreachable_in_the_namespace(listener: socket.socket) -> None:
    r = run_python(_connect_code(listener.getsockname()[1]), audit_hook=False, landlock=False)
    assert not r.ok and "connected" not in r.stdout and "Network is unreachable" in r.stderr, r.stderr
    assert not _accepted(listener)


@needs_landlock
@pytest.mark.skipif(LANDLOCK_ABI < 4, reason="Landlock confines TCP from ABI 4 on")
def test_landlock_alone_refuses_tcp(listener: socket.socket) -> None:
    r = run_python(_connect_code(listener.getsockname()[1]), **ONLY_LANDLOCK)
    assert not r.ok and "connected" not in r.stdout and "PermissionError" in r.stderr, r.stderr
    assert "landlock" in r.mechanisms and not {"audit", "uid", "netns"} & set(r.mechanisms), r.mechanisms
    assert not _accepted(listener)
