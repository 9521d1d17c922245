"""Calibrate task difficulty to the embedded model: single-shot success of each family's LLM per level.

For each built-in family, level and temperature, the team's answer-proposing LLM worker is asked once
(``<worker>:solve``, then submit) on ``--n`` *training* tasks of that level; the table gives the success
rate with its 95% Wilson interval. The default benchmark keeps levels where single-shot success is
roughly 10-60%: the LLM is necessary (no tool solves a task alone) and insufficient (orchestration has
room to help). Validation and test tasks are never touched.

    python benchmarks/calibrate.py --n 40 --temperatures 0 0.7 --out runs/calibrate
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from functools import partial
from pathlib import Path

from envs.tasks.registry import get_family
from orchestra.report.evaluation import wilson_ci
from orchestra.runtime.rollout import RolloutEngine, plan_jobs
from orchestra.runtime.team_file import load_team
from orchestra.runtime.workers import build_workers
from policies import PipelineConductor
from trajectories.rundir import write_config, write_table


def proposer(team) -> str:  # type: ignore[no-untyped-def]
    """The first LLM worker that proposes answers and has a ``solve`` instruction."""
    for w in team.env.workers:
        if team.workers[w.name].kind == "llm" and w.proposes_answer and "solve" in w.instructions:
            return str(w.name)
    raise SystemExit(f"{team.path}: no LLM worker with a 'solve' instruction proposes answers")


def with_temperature(team, temperature: float):  # type: ignore[no-untyped-def]
    workers = {
        k: dataclasses.replace(w, generation=dataclasses.replace(w.generation, temperature=temperature))
        if w.kind == "llm"
        else w
        for k, w in team.workers.items()
    }
    return dataclasses.replace(team, workers=workers)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--families", nargs="+", default=["arithmetic", "blocksworld", "logic_grid", "code_synthesis"])
    ap.add_argument("--levels", nargs="+", type=int, default=None, help="default: every level of each family")
    ap.add_argument("--n", type=int, default=40, help="training tasks per level")
    ap.add_argument("--temperatures", nargs="+", type=float, default=[0.0, 0.7])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cache", default=None, help="response cache (default: the user cache)")
    ap.add_argument("--out", default="runs/calibrate")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_config(out, vars(args))
    rows: list[dict[str, object]] = []
    for fam_name in args.families:
        base = load_team(fam_name)
        family = get_family(base.family)
        worker = proposer(base)
        for temp in args.temperatures:
            team = with_temperature(base, temp)
            workers = build_workers(team, family.tools(), cache_path=Path(args.cache) if args.cache else None)
            cfg = team.env
            steps = [f"{worker}:solve"]
            for level in args.levels or list(family.difficulties):
                if level not in family.difficulties:
                    continue
                tasks = family.generate("train", args.n, seed=args.seed, difficulty=level)
                engine = RolloutEngine(
                    team, family, workers, partial(PipelineConductor, cfg, steps), conductor_name="single_shot"
                )
                t0 = time.perf_counter()
                engine.progress = False
                eps = engine.run(plan_jobs(tasks, args.seed, f"cal-{fam_name}-{level}"))
                k = sum(e.success for e in eps)
                lo, hi = wilson_ci(k, len(eps))
                row = {
                    "family": fam_name,
                    "level": level,
                    "temperature": temp,
                    "n": len(eps),
                    "success": k / len(eps),
                    "ci_low": lo,
                    "ci_high": hi,
                    "wall_s": round(time.perf_counter() - t0, 1),
                }
                rows.append(row)
                print(
                    f"{fam_name:15s} level {level} T={temp:.1f}: {k}/{len(eps)} = {100 * k / len(eps):5.1f}% "
                    f"[{100 * lo:.1f}, {100 * hi:.1f}]  ({row['wall_s']} s)",
                    flush=True,
                )
    write_table(out / "calibration.csv", rows)
    print(f"written: {out / 'calibration.csv'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
