"""Run untrusted Python (LLM-written code) in a limited subprocess.

Containment, in layers (``SandboxResult.mechanisms`` lists what was actually applied on this run):

1. **Process**: ``python -I -S`` (isolated mode, no ``site``: stdlib only, no ``PYTHON*`` variables,
   no user site-packages) in a new session (own process group), started with a *scrubbed environment*
   (``PATH=/usr/bin:/bin``, ``HOME``/``TMPDIR`` = the work dir, ``LANG``) and a *fresh empty temp
   working dir* that is deleted afterwards. The code arrives on stdin, never as a file.
2. **OS limits** (``resource``, set by the bootstrap before the code runs): ``RLIMIT_CPU`` (soft =
   ``cpu_seconds`` → SIGXCPU, hard one second later → SIGKILL), ``RLIMIT_AS`` (``memory_mb``),
   ``RLIMIT_FSIZE``, ``RLIMIT_NOFILE``, ``RLIMIT_CORE = 0``, ``RLIMIT_NPROC = max_processes``
   (default 1: no fork at all). The parent enforces the wall clock and always SIGKILLs the whole
   process group at the end.
3. **Network namespace** (Linux): the bootstrap calls ``unshare(CLONE_NEWNET)`` (as root, or via a
   new user namespace when unprivileged user namespaces are allowed), leaving only a down loopback:
   any connection fails with "Network is unreachable". ``"netns"`` in ``mechanisms`` when it worked.
4. **Unprivileged uid** (when the parent runs as root, which is when ``RLIMIT_NPROC`` would not
   apply): the bootstrap switches to a fresh random uid (>= 1,000,000, owner of the work dir), keeping
   only ``CAP_DAC_READ_SEARCH`` so it can still read the interpreter's stdlib under ``/root``; it sets
   ``no_new_privs``. Writes outside the work dir (and world-writable dirs) then fail with EACCES,
   kill() of other processes fails, and the parent SIGKILLs every process of that uid afterwards
   (fork bombs cannot escape by ``setsid``). Reads are *not* confined.
5. **Audit hook** (``sys.addaudithook``, PEP 578), installed last, refuses: opening a file for writing
   outside the work dir, creating/removing/renaming/linking paths outside it, symlinks/hard links,
   sockets (creation, connect, bind, DNS), ``os.system``/``exec*``/``spawn*``/``fork``/``posix_spawn``,
   ``subprocess.Popen``, ``os.kill``, ``ctypes`` and importing ``_posixsubprocess``/``ctypes``. The
   hook is a first line against *accidents* of honest code, not a security boundary (CPython's own
   docs say audit hooks cannot sandbox); layers 2–4 are the OS backstop.

Measured on this machine (Linux 6.x, Python 3.11): as root all five layers apply; as an unprivileged
user (``setpriv --reuid=65534``) layers 1, 2, 3 (through a user namespace) and 5 apply, and
``RLIMIT_NPROC`` still stops fork bombs. Without user namespaces layer 3 is skipped too (writes and
network are then refused by the hook only); on macOS only layers 1, 2 and 5 apply.

Not isolated: reading files, ``/tmp``-style world-writable dirs when the hook is bypassed, total CPU
or memory across many concurrent runs (use a cgroup or a container for hard multi-tenant isolation).
Hidden tests run in the same process as the candidate code, so a deliberately adversarial candidate
could fake results; this guards against accidents and weak models, not attackers.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

_BOOTSTRAP = r"""
import json, os, resource, sys
_cfg = json.loads(sys.argv[1])
sys.argv = ["<sandbox>"]
_code = sys.stdin.buffer.read().decode("utf-8", "replace")
_applied = []
_info = open(_cfg["info"], "w")
_libc = None
if sys.platform.startswith("linux") and (_cfg["net"] or _cfg["uid"] is not None):
    try:
        import ctypes
        _libc = ctypes.CDLL(None, use_errno=True)
    except Exception:
        _libc = None
if _cfg["net"] and _libc is not None:
    if _libc.unshare(0x40000000) == 0:  # CLONE_NEWNET
        _applied.append("netns")
    elif os.geteuid() != 0 and _libc.unshare(0x10000000 | 0x40000000) == 0:  # CLONE_NEWUSER|NEWNET
        _applied.append("netns")
def _limit(res, soft, hard=None):
    try:
        cur_soft, cur_hard = resource.getrlimit(res)
        hard = soft if hard is None else hard
        if cur_hard != resource.RLIM_INFINITY:
            soft, hard = min(soft, cur_hard), min(hard, cur_hard)
        resource.setrlimit(res, (soft, hard))
        return True
    except (ValueError, OSError):
        return False
_ok = all([
    _limit(resource.RLIMIT_CPU, _cfg["cpu"], _cfg["cpu"] + 1),
    _limit(resource.RLIMIT_AS, _cfg["mem"]),
    _limit(resource.RLIMIT_FSIZE, _cfg["fsize"]),
    _limit(resource.RLIMIT_NOFILE, _cfg["nofile"]),
    _limit(resource.RLIMIT_CORE, 0),
])
if _ok:
    _applied.append("rlimits")
_nproc = _limit(resource.RLIMIT_NPROC, _cfg["nproc"])
if _cfg["uid"] is not None and _libc is not None and os.geteuid() == 0:
    import ctypes
    class _Hdr(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]
    class _Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]
    try:
        _libc.prctl(8, 1, 0, 0, 0)  # PR_SET_KEEPCAPS: keep permitted caps across setuid
        os.setgroups([])
        os.setgid(_cfg["uid"])
        os.setuid(_cfg["uid"])
        _d = (_Data * 2)()
        _d[0].effective = _d[0].permitted = 1 << 2  # CAP_DAC_READ_SEARCH only: read the stdlib under /root
        if _libc.capset(ctypes.byref(_Hdr(0x20080522, 0)), _d) == 0:
            _applied.append("uid")
    except OSError:  # e.g. the uid is not mapped in this user namespace: run on without the switch
        pass
if _nproc and os.geteuid() != 0:  # RLIMIT_NPROC does not bind root
    _applied.append("nproc")
if _libc is not None:
    _libc.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS
def _make_hook(root):
    realpath, join, getcwd, fsdecode = os.path.realpath, os.path.join, os.getcwd, os.fsdecode
    writing = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
    blocked = frozenset((
        "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty", "os.kill",
        "os.killpg", "subprocess.Popen", "pty.spawn", "os.symlink", "os.link", "os.startfile",
        "socket.__new__", "socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg",
        "socket.getaddrinfo", "socket.gethostbyname", "socket.gethostbyname_ex", "socket.gethostbyaddr",
        "socket.getnameinfo", "socket.sethostname", "resource.setrlimit", "resource.prlimit",
        "signal.pthread_kill", "webbrowser.open", "urllib.Request", "sys.remote_exec",
    ))
    path_events = {"os.remove": 1, "os.rmdir": 1, "os.mkdir": 1, "os.rename": 2, "os.replace": 2,
                   "os.chmod": 1, "os.chown": 1, "os.utime": 1, "os.truncate": 1, "os.chflags": 1,
                   "os.setxattr": 1, "os.removexattr": 1, "shutil.rmtree": 1, "shutil.copyfile": 2}
    no_import = frozenset(("_posixsubprocess", "ctypes", "_ctypes"))
    def inside(p):
        if isinstance(p, int):
            return True
        try:
            full = realpath(join(getcwd(), fsdecode(p)))
        except Exception:
            return False
        return full == root or full.startswith(root + "/") or full == "/dev/null"
    def hook(event, args):
        if event == "open":
            path, mode, flags = args
            w = (isinstance(flags, int) and flags & writing) or (isinstance(mode, str) and any(c in mode for c in "wax+"))
            if w and not inside(path):
                raise PermissionError(f"sandbox: writing {path!r} is not allowed (only inside the working directory)")
        elif event in blocked or event.startswith("ctypes."):
            raise PermissionError(f"sandbox: {event} is not allowed")
        elif event in path_events:
            for p in args[: path_events[event]]:
                if not inside(p):
                    raise PermissionError(f"sandbox: {event} on {p!r} is not allowed (outside the working directory)")
        elif event == "import" and args[0] in no_import:
            raise PermissionError(f"sandbox: importing {args[0]} is not allowed")
    return hook
if _cfg["audit"]:
    _applied.append("audit")
_info.write(json.dumps(_applied))
_info.close()
for _m in ("ctypes", "ctypes._endian", "_ctypes"):
    sys.modules.pop(_m, None)
if _cfg["audit"]:
    sys.addaudithook(_make_hook(os.path.realpath(os.getcwd())))
_g = {"__name__": "__main__", "__builtins__": __builtins__}
_c = compile(_code, "<sandbox>", "exec")
for _n in ("ctypes", "_Hdr", "_Data", "_d", "_cfg", "_info", "_libc", "_applied", "_limit", "_make_hook", "_ok", "_m", "_code", "_nproc"):
    globals().pop(_n, None)
exec(_c, _g)
"""


@dataclass(frozen=True)
class SandboxResult:
    """Outcome of one sandboxed run. ``ok``: exited 0 within its limits. ``killed_reason``: which limit
    stopped it (``"wall-clock limit"``, ``"CPU time limit"``, ``"memory limit"``, ``"file size
    limit"``, ``"signal SIGSEGV"``…) or None. ``mechanisms``: containment layers actually applied
    (``rlimits``, ``nproc``, ``netns``, ``uid``, ``audit``; see the module docstring)."""

    ok: bool
    returncode: int | None
    stdout: str
    stderr: str
    timed_out: bool
    killed_reason: str | None
    mechanisms: tuple[str, ...] = ()
    duration_s: float = 0.0


def _kill_uid(uid: int) -> None:
    """SIGKILL every process owned by ``uid`` (a fresh uid used by one run only), until none is left."""
    for _ in range(100):
        victims = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/status") as f:
                    fields = dict(line.split(":", 1) for line in f if ":" in line)
            except OSError:
                continue
            zombie = fields.get("State", "").strip().startswith("Z")  # dead, waiting to be reaped
            if int(fields.get("Uid", "-1 0").split()[0]) == uid and not zombie:
                victims.append(int(entry))
        if not victims:
            return
        for pid in victims:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.01)


def _read(path: str, limit: int) -> str:
    with open(path, "rb") as f:
        data = f.read(limit + 1)
    text = data[:limit].decode("utf-8", "replace")
    return text + "\n[output truncated]" if len(data) > limit else text


def run_python(
    code: str,
    *,
    cpu_seconds: float = 2,
    memory_mb: int = 256,
    wall_seconds: float = 5,
    max_output_bytes: int = 64_000,
    file_size_mb: int = 16,
    max_processes: int = 1,
    open_files: int = 64,
    isolate_network: bool = True,
    drop_privileges: bool = True,
    audit_hook: bool = True,
    python: str | None = None,
) -> SandboxResult:
    """Run ``code`` (stdlib-only Python) in the sandbox and return its outcome (never raises for
    anything the code does). ``audit_hook``/``isolate_network``/``drop_privileges`` exist so tests can
    show each OS layer holds on its own; keep them on in production."""
    work = tempfile.mkdtemp(prefix="orchestra-sbx-")
    out = tempfile.mkdtemp(prefix="orchestra-sbx-io-")
    uid = None
    if drop_privileges and sys.platform.startswith("linux") and os.geteuid() == 0:
        uid = 1_000_000 + secrets.randbelow(1_000_000_000)
        try:
            os.chown(work, uid, uid)
        except OSError:  # e.g. a user namespace without that uid: no switch
            uid = None
    os.chmod(work, 0o700)
    cpu = max(1, math.ceil(cpu_seconds))
    info = os.path.join(out, "info.json")
    cfg = {
        "cpu": cpu,
        "mem": int(memory_mb) * 1024 * 1024,
        "fsize": int(max(file_size_mb * 1024 * 1024, max_output_bytes + 4096)),
        "nofile": open_files,
        "nproc": max_processes,
        "net": isolate_network,
        "uid": uid,
        "audit": audit_hook,
        "info": info,
    }
    env = {"PATH": "/usr/bin:/bin", "HOME": work, "TMPDIR": work, "LANG": "C.UTF-8"}
    cmd = [python or sys.executable, "-I", "-S", "-c", _BOOTSTRAP, json.dumps(cfg)]
    start = time.monotonic()
    timed_out = False
    try:
        with open(os.path.join(out, "stdout"), "wb") as so, open(os.path.join(out, "stderr"), "wb") as se:
            proc = subprocess.Popen(
                cmd, stdin=subprocess.PIPE, stdout=so, stderr=se, cwd=work, env=env, start_new_session=True
            )
            try:
                proc.communicate(code.encode("utf-8"), timeout=wall_seconds)
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                with contextlib.suppress(OSError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                if uid is not None:
                    _kill_uid(uid)
        duration = time.monotonic() - start
        stdout = _read(os.path.join(out, "stdout"), max_output_bytes)
        stderr = _read(os.path.join(out, "stderr"), max_output_bytes)
        try:
            with open(info) as f:
                mechanisms = tuple(json.load(f))
        except (OSError, ValueError):
            mechanisms = ()
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(out, ignore_errors=True)
    rc = proc.returncode
    reason = None
    if timed_out:
        reason = "wall-clock limit"
    elif rc == -signal.SIGXCPU or (rc == -signal.SIGKILL and duration >= cpu):
        reason = "CPU time limit"
    elif rc is not None and rc < 0:
        reason = f"signal {signal.Signals(-rc).name}" if -rc in signal.valid_signals() else f"signal {-rc}"
    elif "MemoryError" in stderr[-2000:]:
        reason = "memory limit"
    elif "File too large" in stderr[-2000:]:
        reason = "file size limit"
    return SandboxResult(
        ok=rc == 0 and not timed_out,
        returncode=None if timed_out else rc,
        stdout=stdout,
        stderr=stderr,
        timed_out=timed_out,
        killed_reason=reason,
        mechanisms=mechanisms,
        duration_s=duration,
    )
