"""Kill soak of the two long training commands: ``orchestra train`` (phase 1, d3rlpy) and ``orchestra finetune``
(phase 2, TeamTR on the embedded SmolLM2), each SIGKILLed at random moments and resumed until it finishes, then
compared with the same command run once without interruption.

    python benchmarks/kill_soak.py [--kills 6] [--seed 0] [--out runs/kill-soak] [--parts train finetune]
                                   [--train-steps 6000] [--stages 3] [--model smollm2] [--continue]

- **train**: a dataset recorded with the embedded SmolLM2 (``orchestra record``, the arithmetic team, ``random``
  and ``pipeline`` conductors, 24 episodes each) is built once (``orchestra dataset build``); ``orchestra train
  --algo cql`` runs straight into one folder, and into another as a subprocess that gets SIGKILL after a random
  delay, ``--kills`` times, each relaunch with ``--resume``, then once more to the end.
- **finetune**: ``orchestra finetune`` (solver and critic trained, a fixed pipeline conductor, ``--stages`` stages)
  the same way: the killed run is relaunched with ``--resume`` every time.

Each launch is killed after a delay drawn from ``--seed``, uniformly between 15% and 50% (train) or 10% and 40%
(finetune) of the straight run's wall time, so kills land in start-up and model loading, mid-epoch or mid-stage,
and in checkpoint writes alike, and every launch but the last is cut short. The script prints, per part: kills sent, relaunches, the
resumed run's epochs/stages, whether every weight tensor is bit-identical (model.pt / the adapters' safetensors),
whether every metric row is identical (wall-clock columns aside: d3rlpy's ``losses/time_*``, TeamTR's
``*_seconds``), and the wall-time overhead of the kills. It exits non-zero if either part is not bit-identical.
Results go to ``OUT/kill_soak.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repo importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ROOT = Path(__file__).resolve().parents[1]
ORCHESTRA = [sys.executable, "-m", "orchestra"]


def _run(args: list[str], log: Path) -> tuple[int, float]:
    t0 = time.perf_counter()
    with log.open("ab") as f:
        rc = subprocess.call([*ORCHESTRA, *args], cwd=ROOT, stdout=f, stderr=subprocess.STDOUT)
    return rc, time.perf_counter() - t0


def _killed_run(args: list[str], log: Path, delays: list[float], book: Path) -> dict[str, Any]:
    """Launch ``args`` (which must resume), SIGKILL it after each delay in turn, then let the last launch finish.
    Every launch is appended to ``book`` (JSONL), so a soak that is itself restarted (``--continue``) carries on
    the same killed run and counts all its kills."""
    t0 = time.perf_counter()
    for delay in [*delays, None]:
        with log.open("ab") as f:
            f.write(f"\n=== launch (kill after {delay}s) ===\n".encode())
            f.flush()
            p = subprocess.Popen([*ORCHESTRA, *args], cwd=ROOT, stdout=f, stderr=subprocess.STDOUT)
            try:
                rc, killed = p.wait(timeout=delay), False
            except subprocess.TimeoutExpired:
                p.send_signal(signal.SIGKILL)
                p.wait()
                rc, killed = -9, True
        with book.open("a", encoding="utf-8") as b:
            b.write(
                json.dumps({"delay_s": delay, "killed": killed, "rc": rc, "wall_s": time.perf_counter() - t0}) + "\n"
            )
            t0 = time.perf_counter()
        if not killed and rc != 0:
            raise SystemExit(f"a launch exited {rc}: see {log}")
        if not killed:  # finished (before its kill, if it had one): done
            break
    launches = [json.loads(line) for line in book.read_text(encoding="utf-8").splitlines() if line.strip()]
    return {
        "kills": sum(x["killed"] for x in launches),
        "launches": len(launches),
        "kill_delays_s": [round(x["delay_s"], 1) for x in launches if x["killed"]],
        "wall_s": sum(x["wall_s"] for x in launches),
    }


def _straight(args: list[str], folder: Path, log: Path, again: bool) -> float:
    """Run ``args`` once into ``folder`` uninterrupted (or, with ``again``, reuse the one there); its wall time."""
    stamp = folder / "straight_wall.json"
    if again and stamp.exists():
        return float(json.loads(stamp.read_text(encoding="utf-8"))["wall_s"])
    shutil.rmtree(folder, ignore_errors=True)
    rc, wall = _run([*args, "--out", str(folder)], log)
    if rc:
        raise SystemExit(f"the straight run failed: see {log}")
    stamp.write_text(json.dumps({"wall_s": wall}), encoding="utf-8")
    return wall


def _fresh_killed(folder: Path, book: Path, again: bool) -> None:
    if not again:
        shutil.rmtree(folder, ignore_errors=True)
        book.unlink(missing_ok=True)


def _tensors(files: list[Path]) -> dict[str, Any]:
    """Every tensor (and number) in the files, flattened to ``file/key/...`` paths: safetensors, or torch state
    dicts (d3rlpy's modules, Adam states) read with ``weights_only=True``."""
    import torch
    from safetensors.torch import load_file

    out: dict[str, Any] = {}

    def walk(prefix: str, v: Any) -> None:
        if isinstance(v, dict):
            for k, x in v.items():
                walk(f"{prefix}/{k}", x)
        elif isinstance(v, (list, tuple)):
            for i, x in enumerate(v):
                walk(f"{prefix}/{i}", x)
        else:
            out[prefix] = v

    for f in files:
        walk(f.name, load_file(str(f)) if f.suffix == ".safetensors" else torch.load(f, weights_only=True))
    return out


def _same_tensors(a: list[Path], b: list[Path]) -> tuple[bool, int]:
    import torch

    ta, tb = _tensors(a), _tensors(b)

    def eq(x: Any, y: Any) -> bool:
        return torch.equal(x, y) if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) else bool(x == y)

    same = ta.keys() == tb.keys() and all(eq(ta[k], tb[k]) for k in ta)
    return same, sum(isinstance(v, torch.Tensor) for v in ta.values())


def _rows(path: Path, wall: tuple[str, ...]) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [{k: v for k, v in r.items() if not any(w in k for w in wall)} for r in rows]


def _same_rows(a: Path, b: Path, wall: tuple[str, ...]) -> tuple[bool, int]:
    ra, rb = _rows(a, wall), _rows(b, wall)
    return json.dumps(ra, sort_keys=True) == json.dumps(rb, sort_keys=True), len(ra)


def train_part(out: Path, kills: int, seed: int, steps: int, rng: random.Random, again: bool) -> dict[str, Any]:
    log = out / "train.log"
    data = out / "data"
    if not (data / "dataset.npz").exists():
        for conductor in ("random", "pipeline"):
            rc, _ = _run(
                [
                    "record",
                    "--team",
                    "arithmetic",
                    "--conductor",
                    conductor,
                    "--episodes",
                    "24",
                    "--seed",
                    str(seed),
                    "--out",
                    str(data / "traj" / f"{conductor}.jsonl"),
                    "--quiet",
                ],
                log,
            )
            if rc:
                raise SystemExit(f"recording failed: see {log}")
        rc, _ = _run(
            [
                "dataset",
                "build",
                "--input",
                str(data / "traj"),
                "--team",
                "arithmetic",
                "--out",
                str(data / "dataset.npz"),
            ],
            log,
        )
        if rc:
            raise SystemExit(f"dataset build failed: see {log}")
    args = [
        "train",
        "--algo",
        "cql",
        "--dataset",
        str(data / "dataset.npz"),
        "--team",
        "arithmetic",
        "--steps",
        str(steps),
        "--steps-per-epoch",
        "500",
        "--critics",
        "2",
        "--seed",
        str(seed),
        "--quiet",
    ]
    straight, killed, book = out / "train-straight", out / "train-killed", out / "train-launches.jsonl"
    wall = _straight(args, straight, log, again)
    _fresh_killed(killed, book, again)
    delays = [rng.uniform(0.15, 0.5) * wall for _ in range(kills)]
    run = _killed_run([*args, "--out", str(killed), "--resume"], log, delays, book)
    same_w, n_t = _same_tensors([straight / "model.pt"], [killed / "model.pt"])
    same_m, n_r = _same_rows(straight / "metrics.jsonl", killed / "metrics.jsonl", ("losses/time_",))
    return {
        "straight_wall_s": wall,
        **run,
        "tensors": n_t,
        "weights_identical": same_w,
        "metric_rows": n_r,
        "metrics_identical": same_m,
    }


def finetune_part(
    out: Path, kills: int, seed: int, stages: int, model: str, rng: random.Random, again: bool
) -> dict[str, Any]:
    log = out / "finetune.log"
    args = [
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
        str(stages),
        "--batch-size",
        "4",
        "--group-size",
        "2",
        "--max-tokens",
        "16",
        "--embedder",
        "hash",
        "--model",
        model,
        "--seed",
        str(seed),
        "--quiet",
    ]
    straight, killed, book = out / "finetune-straight", out / "finetune-killed", out / "finetune-launches.jsonl"
    wall = _straight(args, straight, log, again)
    _fresh_killed(killed, book, again)
    delays = [rng.uniform(0.1, 0.4) * wall for _ in range(kills)]
    run = _killed_run([*args, "--out", str(killed), "--resume"], log, delays, book)

    def weights(d: Path) -> list[Path]:  # the final adapters and the last checkpoint (adapters, Adam moments)
        stage = sorted(p for p in (d / "checkpoints").glob("stage-*") if p.is_dir())[-1]
        return (
            sorted((d / "adapters").rglob("*.safetensors"))
            + sorted(stage.rglob("*.safetensors"))
            + sorted((stage / "optimizers").glob("*.pt"))
        )

    same_w, n_t = _same_tensors(weights(straight), weights(killed))
    same_u, n_u = _same_rows(straight / "updates.jsonl", killed / "updates.jsonl", ("_seconds",))
    same_s, n_s = _same_rows(straight / "stages.jsonl", killed / "stages.jsonl", ("_seconds",))
    return {
        "straight_wall_s": wall,
        **run,
        "tensors": n_t,
        "weights_identical": same_w,
        "update_rows": n_u,
        "stage_rows": n_s,
        "metrics_identical": same_u and same_s,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kills", type=int, default=6, help="SIGKILLs sent to each killed run")
    ap.add_argument("--seed", type=int, default=0, help="run seed and the kill delays' seed")
    ap.add_argument("--out", type=Path, default=Path("runs/kill-soak"), help="run directory")
    ap.add_argument("--parts", nargs="+", default=["train", "finetune"], choices=["train", "finetune"])
    ap.add_argument("--train-steps", type=int, default=6000, help="orchestra train --steps")
    ap.add_argument("--stages", type=int, default=3, help="orchestra finetune --stages")
    ap.add_argument("--model", default="smollm2", help="orchestra finetune --model (smollm2 or tiny)")
    ap.add_argument(
        "--continue",
        dest="again",
        action="store_true",
        help="a restarted soak: reuse the straight runs and carry on the killed ones (their kills are counted)",
    )
    a = ap.parse_args()
    out = a.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(a.seed)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    res: dict[str, Any] = {
        "machine": f"{platform.machine()} | {os.cpu_count()} cpus | python {platform.python_version()}"
    }
    if a.again and (out / "kill_soak.json").exists():  # keep the parts this restart does not rerun
        res = {**json.loads((out / "kill_soak.json").read_text(encoding="utf-8")), **res}
    if "train" in a.parts:
        res["train"] = train_part(out, a.kills, a.seed, a.train_steps, rng, a.again)
        print("train:", json.dumps(res["train"]), flush=True)
    if "finetune" in a.parts:
        res["finetune"] = finetune_part(out, a.kills, a.seed, a.stages, a.model, rng, a.again)
        print("finetune:", json.dumps(res["finetune"]), flush=True)
    (out / "kill_soak.json").write_text(json.dumps(res, indent=2), encoding="utf-8")
    ok = all(r["weights_identical"] and r["metrics_identical"] for k, r in res.items() if k != "machine")
    for k in ("train", "finetune"):
        if k not in res:
            continue
        r = res[k]
        print(
            f"{k}: {r['kills']} SIGKILLs, {r['launches']} launches; {r['tensors']} tensors "
            f"{'bit-identical' if r['weights_identical'] else 'DIFFER'}, metrics "
            f"{'identical' if r['metrics_identical'] else 'DIFFER'}; straight {r['straight_wall_s']:.0f} s, "
            f"killed+resumed {r['wall_s']:.0f} s"
        )
    print(f"machine: {res['machine']}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
