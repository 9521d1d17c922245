"""The cost of the sandbox's read confinement: ``run_python("pass")`` with and without Landlock, interleaved.

    python benchmarks/sandbox.py [--runs 100]

Prints, for each setting, the median wall time and the median CPU time of the child (``RUSAGE_CHILDREN``), then
the difference, labelled with the machine and the kernel's Landlock version. The runs alternate (on, off, on, ...)
so a busy machine slows both alike; the one-off search for the shared libraries the stdlib loads lazily
(``runtime_paths``) is done before the timing. Speed is never asserted in tests; this script is where it is measured.
"""

from __future__ import annotations

import argparse
import platform
import resource
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repo importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from envs.tasks.sandbox import run_python, runtime_paths  # noqa: E402


def _child_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run(runs: int = 100) -> dict[str, float]:
    runtime_paths(sys.executable)
    wall: dict[bool, list[float]] = {True: [], False: []}
    cpu: dict[bool, list[float]] = {True: [], False: []}
    mechanisms: tuple[str, ...] = ()
    for i in range(2 * runs):
        on = i % 2 == 0
        c0, t0 = _child_cpu(), time.perf_counter()
        r = run_python("pass", landlock=on)
        wall[on].append(time.perf_counter() - t0)
        cpu[on].append(_child_cpu() - c0)
        if not r.ok:
            raise RuntimeError(f"run_python('pass') failed: {r}")
        if on:
            mechanisms = tuple(r.mechanisms)
    ms = {
        f"{k}_{'on' if on else 'off'}_ms": 1000 * statistics.median(v[on])
        for k, v in (("wall", wall), ("cpu", cpu))
        for on in (True, False)
    }
    return {**ms, "landlock_applied": float("landlock" in mechanisms)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=100, help="runs per setting (interleaved)")
    a = ap.parse_args()
    f = run(a.runs)
    print(
        f"machine: {platform.machine()} {platform.processor() or platform.system()}, Linux {platform.release()}, "
        f"Python {platform.python_version()}; {a.runs} runs per setting; Landlock applied: {bool(f['landlock_applied'])}"
    )
    for on in ("off", "on"):
        print(
            f"landlock {on:3s}: wall median {f[f'wall_{on}_ms']:6.1f} ms | child CPU median {f[f'cpu_{on}_ms']:5.1f} ms"
        )
    print(
        f"landlock on − off: child CPU {f['cpu_on_ms'] - f['cpu_off_ms']:+.1f} ms "
        f"({100 * (f['cpu_on_ms'] / f['cpu_off_ms'] - 1):+.0f}%), wall {f['wall_on_ms'] - f['wall_off_ms']:+.1f} ms"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
