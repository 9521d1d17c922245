"""The frozen team of ``orchestra experiment llm`` on held-out tasks of one split and difficulty: its success overall
and per level, as the experiment's evaluations play it (greedy, the same task and episode seeds).

    python benchmarks/frozen_team.py --split validation --tasks 80 --difficulty mixed [--seed 0]

Used to choose the experiment's difficulty on validation: the comparison needs a frozen team inside 20-60%. Never
point it at the test split while choosing.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

from orchestra.experiments.llm.config import LLM_EXPERIMENT_TEAM, LLMExperimentConfig
from orchestra.experiments.llm.run import evaluate, held_out_tasks
from orchestra.report.evaluation import wilson_ci
from orchestra.teamtr.llm import LLMTeam


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--split", choices=("validation", "test"), default="validation")
    p.add_argument("--tasks", type=int, default=80, help="held-out tasks (default: %(default)s)")
    p.add_argument("--difficulty", default="1", help="a level of the family, or 'mixed' (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="the experiment's root seed (default: %(default)s)")
    a = p.parse_args(argv)
    level = None if a.difficulty == "mixed" else int(a.difficulty)
    cfg = LLMExperimentConfig(
        team=replace(LLM_EXPERIMENT_TEAM, difficulty=level), eval_split=a.split, eval_tasks=a.tasks, seed=a.seed
    )
    tasks = held_out_tasks(cfg)
    team = LLMTeam(cfg.team_config(0))
    t0 = time.perf_counter()
    rows = evaluate(team, tasks, cfg)
    print(f"frozen team, {len(rows)} {a.split} tasks, difficulty {a.difficulty}, {time.perf_counter() - t0:.0f} s")
    groups = {"all": rows} | {
        f"level {k}": [r for r in rows if r["difficulty"] == k] for k in sorted({r["difficulty"] for r in rows})
    }
    for name, rs in groups.items():
        wins = int(sum(r["success"] for r in rs))
        lo, hi = wilson_ci(wins, len(rs))
        print(f"  {name}: {wins}/{len(rs)} = {wins / len(rs):.1%} [{lo:.1%}, {hi:.1%}]")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
