"""A short llama.cpp decode in a child process before the first real one: a native crash is one clear error.

A llama.cpp build whose kernels do not run on this CPU (the AMX crash :mod:`orchestra.backends.llamacpp_build` exists
to avoid, or a wheel compiled on another machine) does not raise: it kills the process at the first ``llama_decode``,
taking a recording, a training run or the whole test suite with it. So before orchestra loads a GGUF for the first
time with a given library on a given CPU, one child process (:mod:`orchestra.backends.llamacpp_probe_child`) loads the
same model and decodes a few tokens through the backend's own batched path
(:class:`~orchestra.backends.llamacpp.LlamaCppBackend`). If the child dies, :func:`require` raises
:class:`BackendError` with one line naming the CPU, what the library was built with and the command that rebuilds it;
if it lives, the success is remembered under ``~/.cache/orchestra/llamacpp-probe/``, keyed by the library's files, the
CPU's flags and the model, so later runs pay nothing (a rebuilt library, a moved disk or another model probes again).

``ORCHESTRA_LLAMACPP_PROBE=off`` skips the probe. ``ORCHESTRA_LLAMACPP_PROBE_SIMULATE=segfault|abort|hang|error``
makes the child die that way (tests use it: a real SIGSEGV in a real child). The test suite runs the probe once
before any test (tests/conftest.py): a failure is one failed check and fails every llama.cpp test at once with its
message.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import platform
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from orchestra.backends.base import BackendError
from orchestra.backends.llamacpp_build import cache_root, cpu_info, rebuild_command, system_features

ENV = "ORCHESTRA_LLAMACPP_PROBE"  # "off": skip; "child": this process is the probe
SIMULATE_ENV = "ORCHESTRA_LLAMACPP_PROBE_SIMULATE"
TIMEOUT_S = 300.0  # a 135M model loads and decodes in a few seconds; a stuck child is a failure too
# the child's lines (orchestra/backends/llamacpp_probe_child.py) that this process reads
INFO_LINE = "system_info: "
OK_LINE = "probe ok: "


@dataclass(frozen=True)
class ProbeResult:
    ok: bool
    model: str  # the GGUF decoded
    returncode: int | None  # None: timed out
    signal: str | None  # the signal that killed the child (SIGSEGV, SIGABRT, ...)
    system_info: str  # llama.cpp's system info, as the child printed it before decoding ("" if it died before)
    seconds: float
    detail: str  # the child's last line of output, or what went wrong

    def message(self) -> str:
        """One line: what happened, on which CPU, with which build, and the command that rebuilds."""
        if self.ok:
            return f"llama.cpp decoded {Path(self.model).name} in a child process in {self.seconds:.1f} s"
        if self.signal:
            what = f"crashed ({self.signal})"
        elif self.returncode is None:
            what = f"did not finish in {self.seconds:.0f} s"
        else:
            what = f"failed (exit {self.returncode}: {self.detail or 'no output'})"
        cpu, _ = cpu_info()
        features = system_features(self.system_info)
        built = " ".join(k for k, v in features.items() if v == "1") or "unknown features (it died before reporting)"
        amx = "; its AMX kernels are a known crash (ggml-org/llama.cpp#20824)" if "AMX_INT8" in features else ""
        return (
            f"llama.cpp {what} in a test decode of {Path(self.model).name} on this CPU ({cpu}, {platform.machine()}); "
            f"llama-cpp-python {_version()} was built with: {built}{amx}; rebuild it for this CPU with: "
            f"{rebuild_command()}"
        )


def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version("llama-cpp-python")
    except metadata.PackageNotFoundError:
        return "(not installed)"


def library_files() -> list[Path]:
    """The shared libraries of the installed llama-cpp-python (found without importing it)."""
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or spec.origin is None:
        return []
    folder = Path(spec.origin).parent
    return sorted(
        p for p in folder.rglob("*") if p.is_file() and (".so" in p.suffixes or p.suffix in (".dll", ".dylib"))
    )


def probe_key(model: Path) -> str:
    """What a probe result depends on: the library's bytes, this CPU's flags, the model file."""
    h = hashlib.sha256()
    h.update(f"{_version()}|{platform.machine()}|{sorted(cpu_info()[1] or ())}".encode())
    for lib in library_files():
        h.update(lib.name.encode())
        h.update(hashlib.sha256(lib.read_bytes()).digest())
    stat = model.stat()
    h.update(f"|{model.name}|{stat.st_size}".encode())
    return h.hexdigest()[:24]


def marker_path(key: str) -> Path:
    return cache_root() / "llamacpp-probe" / f"{key}.json"


def run_probe(model: Path, timeout_s: float = TIMEOUT_S) -> ProbeResult:
    """Load ``model`` and decode a few tokens in a child process; how it ended."""
    env = {**os.environ, ENV: "child"}
    cmd = [sys.executable, "-m", "orchestra.backends.llamacpp_probe_child", str(model)]
    t0 = time.monotonic()
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, errors="replace", timeout=timeout_s)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        return ProbeResult(False, str(model), None, None, _info_of(out), time.monotonic() - t0, "timed out")
    seconds = time.monotonic() - t0
    sig = None
    if proc.returncode < 0:
        try:
            sig = signal.Signals(-proc.returncode).name
        except ValueError:
            sig = f"signal {-proc.returncode}"
    ok = proc.returncode == 0 and OK_LINE in proc.stdout
    lines = [ln.strip() for ln in (proc.stderr + "\n" + proc.stdout).splitlines() if ln.strip()]
    errors = [ln for ln in lines if not ln.startswith((INFO_LINE, OK_LINE))]
    detail = (errors[-1] if errors else "") if not ok else next(ln for ln in lines if ln.startswith(OK_LINE))
    return ProbeResult(ok, str(model), proc.returncode, sig, _info_of(proc.stdout), seconds, detail[:300])


def _info_of(stdout: str) -> str:
    return next((ln[len(INFO_LINE) :].strip() for ln in stdout.splitlines() if ln.startswith(INFO_LINE)), "")


_RESULTS: dict[str, ProbeResult] = {}
_LOCK = threading.Lock()


def check(model: Path, force: bool = False) -> ProbeResult | None:
    """This process's verdict on ``model`` with this library on this CPU: remembered in memory, then on disk (only
    successes), else probed now. ``force`` probes again. None when the probe is switched off."""
    if os.environ.get(ENV) in ("off", "child"):
        return None
    simulated = bool(os.environ.get(SIMULATE_ENV))
    key = probe_key(model) + ("-simulated" if simulated else "")
    with _LOCK:
        if not force and key in _RESULTS:
            return _RESULTS[key]
        marker = marker_path(key)
        if not force and not simulated and marker.is_file():
            try:
                result = ProbeResult(**json.loads(marker.read_text(encoding="utf-8")))
            except (ValueError, TypeError, OSError):
                result = None  # a torn or foreign marker: probe again
            if result is not None and result.ok:
                _RESULTS[key] = result
                return result
        result = run_probe(model)
        _RESULTS[key] = result
        if result.ok and not simulated:
            _write_marker(marker, result)
        return result


def _write_marker(marker: Path, result: ProbeResult) -> None:
    try:
        marker.parent.mkdir(parents=True, exist_ok=True)
        tmp = marker.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(asdict(result), indent=2) + "\n", encoding="utf-8")
        tmp.replace(marker)
    except OSError:
        pass  # a read-only cache: the probe runs again next time, nothing is lost


def require(model: Path) -> None:
    """Raise :class:`BackendError` (one line) unless llama.cpp survives a decode of ``model`` here."""
    result = check(model)
    if result is not None and not result.ok:
        raise BackendError(result.message())


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m orchestra.backends.llamacpp_probe", description=__doc__)
    ap.add_argument("model", nargs="?", default=None, help="a .gguf file (default: the embedded SmolLM2)")
    a = ap.parse_args(argv)
    from orchestra.backends.models import smollm2_gguf_path

    result = run_probe(Path(a.model) if a.model else smollm2_gguf_path())
    print(result.message())
    return 0 if result.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
