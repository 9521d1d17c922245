"""One stage of the CPU ``orchestra finetune`` command of docs/finetuning.md, at an earlier commit and at this checkout, back to back.

    python benchmarks/stage_vs_commit.py [--commit 91da808] [--seed 0] [--out runs/stage-vs-commit] [--repeats 1]

``benchmarks/finetune.py --compare`` turns the levers of the current code off one by one; it cannot measure what
the code was before other changes (the thread setting, batching, the trainer's bookkeeping). This script measures
that directly: it checks the earlier commit out into a git worktree (default: 91da808, the last commit before the
phase-2 speed work of issue 13, whose ``teamtr/llm.py`` quoted "~19 s per 4 sampled episodes, ~55 s per 8-turn
update"), runs the same command line with the same seed under both trees with this interpreter (each tree's own
packages first on ``PYTHONPATH``), and reads each run's own per-stage and per-update timings:

    orchestra finetune --team arithmetic --conductor pipeline --pipeline solver:solve critic:check solver:revise
        --workers solver critic --stages 1 --batch-size 4 --group-size 2 --max-tokens 24 --embedder hash
        --eval-tasks 0 --seed S

(held-out evaluation off, so a stage is sampling and updating). Each tree runs with its own defaults (threads,
batching, trainer options): that is what "the default CPU config" meant at each commit. Printed: both stages' wall
time (``perf/stage_seconds``), the sampling and update seconds inside them, the ratio, and the machine. Nothing
else should run meanwhile: the two runs are sequential, so a load that comes and goes biases the ratio.
"""

from __future__ import annotations

import argparse
import csv
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
COMMAND = [
    "finetune",
    "--team",
    "arithmetic",
    "--conductor",
    "pipeline",
    "--pipeline",
    "solver:solve",
    "critic:check",
    "solver:revise",
    "--workers",
    "solver",
    "critic",
    "--stages",
    "1",
    "--batch-size",
    "4",
    "--group-size",
    "2",
    "--max-tokens",
    "24",
    "--embedder",
    "hash",
    "--eval-tasks",
    "0",
]


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def run_tree(tree: Path, out: Path, seed: int) -> dict[str, Any]:
    """One stage under ``tree``'s code; its timings from its own metrics files."""
    shutil.rmtree(out, ignore_errors=True)
    env = {**os.environ, "PYTHONPATH": str(tree)}
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "orchestra", *COMMAND, "--seed", str(seed), "--out", str(out)],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - t0
    (out.parent / f"{out.name}.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise SystemExit(f"{tree}: orchestra finetune exited {proc.returncode}; see {out.parent / (out.name + '.log')}")
    stages, updates = _rows(out / "stages.csv"), _rows(out / "updates.csv")
    return {
        "stage_seconds": float(stages[-1]["perf/stage_seconds"]),
        "sample_seconds": sum(float(u["perf/sample_seconds"]) for u in updates),
        "update_seconds": sum(float(u["perf/update_seconds"]) for u in updates),
        "updates": len(updates),
        "process_seconds": wall,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--commit", default="91da808", help="the earlier commit (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="seed of both runs (default: %(default)s)")
    p.add_argument("--out", default="runs/stage-vs-commit", help="run directories and logs (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=1, help="runs of each tree, alternating (default: %(default)s)")
    a = p.parse_args(argv)
    out = Path(a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="stage-vs-commit-") as tmp:
        old = Path(tmp) / "tree"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(old), a.commit], check=True)
        try:
            figures: dict[str, list[dict[str, Any]]] = {"then": [], "now": []}
            for r in range(a.repeats):
                for name, tree in (("then", old), ("now", ROOT)):
                    figures[name].append(run_tree(tree, out / f"{name}-{r}", a.seed))
                    print(f"{name} (run {r + 1}): stage {figures[name][-1]['stage_seconds']:.1f} s", flush=True)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(old)], check=False)
    cpu = platform.processor() or platform.machine()
    print(f"\nmachine: {cpu}, {os.cpu_count()} CPUs, Python {platform.python_version()}; seed {a.seed}")
    print("| tree | stage (s) | sampling (s) | updates (s) | updates | process incl. model load (s) |")
    print("|---|---:|---:|---:|---:|---:|")
    best = {}
    for name, label in (("then", a.commit), ("now", "this checkout")):
        rows = figures[name]
        best[name] = min(rows, key=lambda f: f["stage_seconds"])
        f = best[name]
        print(
            f"| {label} | {f['stage_seconds']:.1f} | {f['sample_seconds']:.1f} | {f['update_seconds']:.1f} | "
            f"{f['updates']} | {f['process_seconds']:.1f} |"
        )
    print(
        f"\nspeedup of one stage (fastest of {a.repeats} each): "
        f"{best['then']['stage_seconds'] / best['now']['stage_seconds']:.2f}×"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
