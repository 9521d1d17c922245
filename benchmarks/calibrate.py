"""Calibrate task difficulty to the embedded model: single-shot success of each family's LLM per level.

For each built-in family, level and temperature, the team's answer-proposing LLM worker is asked once
(``<worker>:solve``, then submit) on ``--n`` *training* tasks of that level; the table gives the success
rate with its 95% Wilson interval. The default benchmark keeps levels where single-shot success is
roughly 10-60%: the LLM is necessary (no tool solves a task alone) and insufficient (orchestration has
room to help). Validation and test tasks are never touched by default.

With ``--team`` and ``--rules`` it measures the named schedules of one team instead (a priced team's single-shot
schedule per worker, for example), with their mean price, on ``--split`` (the issue-35 protocol measures each
worker on validation before choosing the task mix):

    python benchmarks/calibrate.py --n 40 --temperatures 0 0.7 --out runs/calibrate
    python benchmarks/calibrate.py --team arithmetic_priced --rules coder specialist single_shot \
        --split validation --n 60 --temperatures 0 --out runs/calibrate-priced
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
from orchestra.runtime.conductors import conductor_factory, team_rules
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
    ap.add_argument("--team", default=None, help="one team (built-in name or file) instead of the families' own")
    ap.add_argument("--rules", nargs="+", default=None, help="named rules of --team's menu to measure")
    ap.add_argument("--split", choices=["train", "validation"], default="train")
    ap.add_argument("--levels", nargs="+", type=int, default=None, help="default: every level of each family")
    ap.add_argument("--n", type=int, default=40, help="training tasks per level")
    ap.add_argument("--temperatures", nargs="+", type=float, default=[0.0, 0.7])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cache", default=None, help="response cache (default: the user cache)")
    ap.add_argument("--out", default="runs/calibrate")
    ap.add_argument("--markdown", default=None, help="also write the tables as markdown to this file")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_config(out, vars(args))
    if args.rules and not args.team:
        ap.error("--rules names rules of one team's menu: give --team too")
    rows: list[dict[str, object]] = []
    outcomes: list[dict[str, object]] = []  # one row per episode: what the per-task oracle and the markdown read
    for fam_name in [args.team] if args.team else args.families:
        base = load_team(fam_name)
        family = get_family(base.family)
        if args.rules:
            unknown = sorted(set(args.rules) - set(team_rules(base)))
            if unknown:
                ap.error(f"--rules: {base.path} has no rule {unknown[0]!r} (its menu: {', '.join(team_rules(base))})")
        for temp in args.temperatures:
            team = with_temperature(base, temp)
            workers = build_workers(team, family.tools(), cache_path=Path(args.cache) if args.cache else None)
            schedules = (
                {rule: conductor_factory(rule, team, seed=args.seed) for rule in args.rules}
                if args.rules
                else {"single_shot": partial(PipelineConductor, team.env, [f"{proposer(base)}:solve"])}
            )
            for rule, factory in schedules.items():
                for level in args.levels or list(family.difficulties):
                    if level not in family.difficulties:
                        continue
                    tasks = family.generate(args.split, args.n, seed=args.seed, difficulty=level)
                    engine = RolloutEngine(team, family, workers, factory, conductor_name=rule, progress=False)
                    t0 = time.perf_counter()
                    eps = engine.run(plan_jobs(tasks, args.seed, f"cal-{fam_name}-{level}"))
                    k = sum(e.success for e in eps)
                    lo, hi = wilson_ci(k, len(eps))
                    row = {
                        "team": base.name,
                        "family": base.family,
                        "rule": rule,
                        "split": args.split,
                        "level": level,
                        "temperature": temp,
                        "n": len(eps),
                        "success": k / len(eps),
                        "ci_low": lo,
                        "ci_high": hi,
                        "mean_price": sum(e.price for e in eps) / len(eps),
                        "mean_tokens": sum(e.total_tokens for e in eps) / len(eps),
                        "wall_s": round(time.perf_counter() - t0, 1),
                    }
                    rows.append(row)
                    outcomes += [
                        {
                            "rule": rule,
                            "temperature": temp,
                            "level": level,
                            "task": e.task.id,
                            "success": int(e.success),
                            "price": e.price,
                        }
                        for e in eps
                    ]
                    print(
                        f"{base.name:15s} {rule:15s} level {level} T={temp:.1f}: {k}/{len(eps)} = "
                        f"{100 * k / len(eps):5.1f}% [{100 * lo:.1f}, {100 * hi:.1f}], price "
                        f"{row['mean_price']:.3f}  ({row['wall_s']} s)",
                        flush=True,
                    )
    write_table(out / "calibration.csv", rows)
    write_table(out / "outcomes.csv", outcomes)
    print(f"written: {out / 'calibration.csv'}, {out / 'outcomes.csv'}")
    if args.markdown:
        Path(args.markdown).write_text(
            markdown(
                rows, outcomes, " ".join(["python benchmarks/calibrate.py", *(sys.argv[1:] if argv is None else argv)])
            )
        )
        print(f"written: {args.markdown}")
    return 0


def markdown(rows: list[dict[str, object]], outcomes: list[dict[str, object]], command: str) -> str:
    """Success (95% Wilson interval) and mean price per rule and level, then per level the best rule and the per-task
    oracle over the rules (a task counts when any rule solved it): the headroom a router over these rules could aim
    at on these very tasks. With greedy workers it holds no sampling luck (each rule's outcome on a task is fixed),
    but it is still a best-of on the tasks it is scored on."""
    import platform
    from collections import defaultdict

    teams = sorted({str(r["team"]) for r in rows})
    splits = sorted({str(r["split"]) for r in rows})
    lines = [
        f"# Calibration: success and price per rule and level ({', '.join(teams)}, {', '.join(splits)} split)",
        "",
        f"Produced by `{command}` ({platform.machine()}, {platform.processor() or 'cpu'}); greedy decoding repeats on",
        "one machine, and another CPU may round a few replies differently.",
        "",
        "Each rule is one fixed schedule of the team's menu played once per task; price is the team file's declared",
        "worker prices summed over the episode. The second table's oracle counts a task solved when any rule solved",
        "it: a best-of on the very tasks it is scored on, so its headroom is an upper bound a router could aim at,",
        "not one it can reach.",
        "",
        "| rule | T | level | tasks | success | 95% CI | mean price |",
        "|---|---:|---:|---:|---:|---|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['rule']} | {r['temperature']:g} | {r['level']} | {r['n']} | {100 * float(r['success']):.1f}% | "  # type: ignore[arg-type]
            f"[{100 * float(r['ci_low']):.1f}, {100 * float(r['ci_high']):.1f}] | {float(r['mean_price']):.3f} |"  # type: ignore[arg-type]
        )
    by: dict[tuple[float, int], dict[str, dict[str, int]]] = defaultdict(lambda: defaultdict(dict))
    for o in outcomes:
        by[(float(o["temperature"]), int(o["level"]))][str(o["rule"])][str(o["task"])] = int(o["success"])  # type: ignore[arg-type]
    lines += [
        "",
        "| T | level | tasks | best rule | its success | per-task oracle over the rules | headroom (pts) |",
        "|---:|---:|---:|---|---:|---:|---:|",
    ]
    for (temp, level), per_rule in sorted(by.items()):
        tasks = sorted(set.intersection(*(set(v) for v in per_rule.values())))
        rate = {rule: sum(v[t] for t in tasks) / len(tasks) for rule, v in per_rule.items()}
        best = max(rate, key=lambda k: rate[k])
        oracle = sum(max(v[t] for v in per_rule.values()) for t in tasks) / len(tasks)
        lines.append(
            f"| {temp:g} | {level} | {len(tasks)} | {best} | {100 * rate[best]:.1f}% | {100 * oracle:.1f}% | "
            f"{100 * (oracle - rate[best]):+.1f} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
