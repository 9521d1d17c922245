"""The sandbox refuses fork bombs, runaway CPU, huge allocations, writes outside its temp dir and
network connections — each within its limits — and runs well-behaved code.

Most refusals are shown twice: with the audit hook (first line) and with it switched off, to show the
OS layer (rlimits, network namespace, unprivileged uid) holds on its own where this OS provides it;
those second checks skip when ``SandboxResult.mechanisms`` says the layer is not available here."""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from envs.tasks.sandbox import run_python


def _mechanisms() -> tuple[str, ...]:
    return run_python("pass").mechanisms


MECH = _mechanisms()


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


@pytest.mark.parametrize(
    "audit",
    [
        True,
        pytest.param(
            False,
            marks=pytest.mark.skipif(
                "uid" not in MECH, reason="without a uid switch only the audit hook confines writes"
            ),
        ),
    ],
)
def test_write_outside_the_temp_dir_is_refused(tmp_path: Path, audit: bool) -> None:
    target = tmp_path / "escape.txt"
    r = run_python(f"open({str(target)!r}, 'w').write('pwned')\n", audit_hook=audit)
    assert not r.ok and "PermissionError" in r.stderr, r.stderr
    assert not target.exists()
    keep = tmp_path / "keep.txt"
    keep.write_text("mine")
    rm = run_python(f"import os\nos.remove({str(keep)!r})\n", audit_hook=audit)
    assert not rm.ok and "PermissionError" in rm.stderr and keep.read_text() == "mine"


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
    r = run_python(_connect_code(listener.getsockname()[1]), audit_hook=False)
    assert not r.ok and "connected" not in r.stdout and "Network is unreachable" in r.stderr, r.stderr
    assert not _accepted(listener)
