"""orchestra's llama.cpp build against llama-cpp-python's default (-march=native) build, on the same recording work.

    python benchmarks/llama_build.py [--rounds 2] [--native-wheel PATH] [--seed 0] [record.py options ...]

``make install`` builds llama-cpp-python with the instruction sets named one by one and AMX off
(orchestra/backends/llamacpp_build.py, docs/llamacpp-build.md). This script measures what that costs against the build
pip makes when left to itself (``GGML_NATIVE=ON``): each wheel is unpacked into its own folder and
``benchmarks/record.py`` runs in a child process against it, the two builds alternating, ``--rounds`` times each (so a
slow spell of a shared machine falls on both). It prints, per build, the median over rounds of each path's episodes/s
and decode and prefill tokens/s and the 512-token compute ceiling, the ratio orchestra's / native, what each library
reported it was built with, and whether the two builds generated the same token ids (greedy and sampled turns alike:
the recording is seeded).

A recording moves by about ±10% from run to run on a shared 2-core machine, more than the builds differ, so
``--micro N`` adds N alternating pairs of short runs of the two kernels that bound a recording (one 512-token
forward, compute-bound; 128 one-token decode steps after a 64-token prompt), each in a fresh child, and prints the
median of the per-pair ratios with a Wilcoxon signed-rank test over the pairs (scipy).

The native wheel is compiled once (5-10 minutes on 2 cores) into ``~/.cache/orchestra/llama-cpp-python/native-<version>/``
unless ``--native-wheel`` names one. On a CPU that reports AMX the native build holds the kernels that crash
(ggml-org/llama.cpp#20824): there this script measures a build that may die, and says so if it does.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.record import agreement  # noqa: E402
from orchestra.backends.llamacpp_build import (  # noqa: E402
    PACKAGE,
    Plan,
    cache_root,
    cpu_info,
    find_wheel,
    system_features,
)

FIGURES = (
    ("serial/episodes_per_s", "serial episodes/s"),
    ("batched/episodes_per_s", "batched episodes/s"),
    ("serial/decode_tok_s", "serial decode tok/s"),
    ("batched/decode_tok_s", "batched decode tok/s"),
    ("batched/prefill_tok_s", "batched prefill tok/s"),
    ("ceiling_tok_s", "512-token forward tok/s"),
)


def native_wheel(version: str) -> Path:
    """llama-cpp-python ``version`` as pip builds it with no options (-march=native), compiled once and cached."""
    folder = cache_root() / "llama-cpp-python" / f"native-{version}"
    wheel = find_wheel(folder, version)
    if wheel is not None:
        return wheel
    print(f"compiling {PACKAGE} {version} with its default options (-march=native), once: 5-10 minutes", flush=True)
    env = {k: v for k, v in os.environ.items() if k not in ("CMAKE_ARGS", "FORCE_CMAKE")}
    cmd = [sys.executable, "-m", "pip", "wheel", "-q", "--no-cache-dir", "--no-deps", "--no-binary", PACKAGE]
    subprocess.run([*cmd, "-w", str(folder), f"{PACKAGE}=={version}"], env=env, check=True)
    found = find_wheel(folder, version)
    if found is None:
        raise SystemExit(f"error: pip left no {PACKAGE} wheel in {folder}")
    return found


def one_run(site: Path, label: str, record_args: list[str], tmp: Path, i: int) -> dict[str, Any]:
    """benchmarks/record.py in a child whose llama_cpp is the one unpacked in ``site``; its figures and system info."""
    out = tmp / f"{label}-{i}.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}
    info_cmd = [sys.executable, "-c", "import llama_cpp; print(llama_cpp.llama_print_system_info().decode())"]
    info = subprocess.run(info_cmd, env=env, capture_output=True, text=True, check=True).stdout.strip()
    print(f"[{label} round {i + 1}] llama_cpp from {site}", flush=True)
    cmd = [sys.executable, str(ROOT / "benchmarks" / "record.py"), *record_args, "--json", str(out)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise SystemExit(f"error: record.py with the {label} build ended with {proc.returncode}: {' | '.join(tail)}")
    m: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
    m["system_info"] = info
    return m


def micro() -> tuple[float, float]:
    """In this process's llama_cpp: best-of-2 tokens/s of a 512-token forward, best-of-3 of 128 one-token decodes."""
    import llama_cpp

    from benchmarks.record import compute_ceiling
    from orchestra.backends.llamacpp import physical_cores
    from orchestra.backends.models import smollm2_gguf_path

    threads = physical_cores()
    forward = max(compute_ceiling(threads) for _ in range(2))
    llm = llama_cpp.Llama(
        model_path=str(smollm2_gguf_path()), n_ctx=512, n_threads=threads, n_threads_batch=threads, verbose=False
    )
    decode = 0.0
    for _ in range(3):
        llm.reset()
        llm.eval(list(range(100, 164)))
        t0 = time.perf_counter()
        for i in range(128):
            llm.eval([200 + i])
        decode = max(decode, 128 / (time.perf_counter() - t0))
    return forward, decode


def one_micro(site: Path) -> tuple[float, float]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child-micro"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(
            f"error: the micro benchmark against {site} ended with {proc.returncode}: {proc.stderr[-300:]}"
        )
    forward, decode = map(float, proc.stdout.split()[-2:])
    return forward, decode


def run_micro(sites: dict[str, Path], pairs: int) -> dict[str, list[tuple[float, float]]]:
    got: dict[str, list[tuple[float, float]]] = {"orchestra": [], "native": []}
    for i in range(pairs):
        for label in ("orchestra", "native") if i % 2 == 0 else ("native", "orchestra"):
            print(f"[micro pair {i + 1}] {label}", flush=True)
            got[label].append(one_micro(sites[label]))
    return got


def report_micro(got: dict[str, list[tuple[float, float]]]) -> None:
    from scipy.stats import wilcoxon

    pairs = len(got["orchestra"])
    print(f"\nkernels, {pairs} alternating pairs (a fresh child each): median tok/s, median of the per-pair ratios")
    print(f"{'kernel':26s} {'orchestra':>10s} {'native':>10s} {'ratio':>7s}")
    for k, name in ((0, "512-token forward"), (1, "one-token decode")):
        o = [r[k] for r in got["orchestra"]]
        n = [r[k] for r in got["native"]]
        ratio = statistics.median(a / b for a, b in zip(o, n, strict=True))
        p = wilcoxon(o, n).pvalue
        print(
            f"{name:26s} {statistics.median(o):10.2f} {statistics.median(n):10.2f} {ratio:6.3f}×   "
            f"Wilcoxon signed-rank p = {p:.3f}"
        )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--rounds", type=int, default=2, help="runs of each build, alternating")
    ap.add_argument("--native-wheel", type=Path, default=None, help="the -march=native wheel (default: build it once)")
    ap.add_argument("--orchestra-wheel", type=Path, default=None, help="orchestra's wheel (default: make install's)")
    ap.add_argument("--seed", type=int, default=0, help="run seed of the recordings")
    ap.add_argument("--micro", type=int, default=0, help="also N alternating pairs of the kernel micro benchmark")
    ap.add_argument("--child-micro", action="store_true", help=argparse.SUPPRESS)
    a, record_args = ap.parse_known_args(argv)
    if a.child_micro:
        os.environ["ORCHESTRA_LLAMACPP_PROBE"] = "off"  # the parent's recordings already probed both builds
        print(*(f"{x:.2f}" for x in micro()))
        return
    plan = Plan()
    ours = a.orchestra_wheel or find_wheel(plan.folder, plan.version)
    if ours is None:
        raise SystemExit(f"error: no orchestra build of {PACKAGE} {plan.version} in {plan.folder}: run `make install`")
    native = a.native_wheel or native_wheel(plan.version)
    record_args = [*record_args, "--seed", str(a.seed)]
    runs: dict[str, list[dict[str, Any]]] = {"orchestra": [], "native": []}
    got: dict[str, list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        sites = {}
        for label, wheel in (("orchestra", ours), ("native", native)):
            sites[label] = tmp / f"site-{label}"
            with zipfile.ZipFile(wheel) as z:
                z.extractall(sites[label])
            print(f"{label}: {wheel}")
        for i in range(a.rounds):
            for label in ("orchestra", "native") if i % 2 == 0 else ("native", "orchestra"):
                runs[label].append(one_run(sites[label], label, record_args, tmp, i))
        if a.micro:
            got = run_micro(sites, a.micro)
    cpu = cpu_info()[0]
    print(
        f"\nmachine: {platform.system()} {platform.machine()} | {cpu} | {os.cpu_count()} cpus | {PACKAGE} {plan.version}"
    )
    if got:
        report_micro(got)
    if not a.rounds:
        return
    print(f"\nrecordings (benchmarks/record.py {' '.join(record_args)}): {a.rounds} rounds each, alternating; medians")
    for label in runs:
        built = [k for k, v in system_features(runs[label][0]["system_info"]).items() if v == "1"]
        print(f"  {label} build: {' '.join(built)}")
    print(f"\n{'figure':26s} {'orchestra':>10s} {'native':>10s} {'ratio':>7s}")
    for key, name in FIGURES:
        o = statistics.median(r[key] for r in runs["orchestra"])
        n = statistics.median(r[key] for r in runs["native"])
        spread = [f"{r[key]:.2f}" for r in runs["orchestra"]] + ["|"] + [f"{r[key]:.2f}" for r in runs["native"]]
        print(f"{name:26s} {o:10.2f} {n:10.2f} {o / n:6.2f}×   runs: {' '.join(spread)}")
    for path in ("serial", "batched"):
        ep, turn, turns = agreement(runs["native"][0][f"{path}/token_ids"], runs["orchestra"][0][f"{path}/token_ids"])
        print(f"{path} path, same token ids in both builds: {ep:.1%} of episodes, {turn:.1%} of {turns} LLM turns")


if __name__ == "__main__":
    main()
