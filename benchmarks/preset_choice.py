"""The GPU preset's sampling temperature and group size, chosen on the VALIDATION split with the FROZEN team (issue 33
item 4): the team of ``orchestra/teamtr/configs/smollm2_gpu.yaml`` (arithmetic, pipeline solver:solve → critic:check
→ solver:revise, solver and critic sampled, 128 tokens per turn) with its LoRA adapters as initialised (zero: the
base model), so the choice favours no training scheme. Per temperature, every one of ``--tasks`` validation tasks is
played ``--samples`` times (8; different episode seeds, the same seeds at every temperature), in float32 on the CPU.

    python benchmarks/preset_choice.py --tasks 24 --out runs/preset-choice --report docs/results/gpu_preset.md
    python benchmarks/preset_choice.py --from docs/results/gpu_preset.csv --report docs/results/gpu_preset.md

Reported per temperature: success rate, mean return, and the share of GRPO groups whose reward is non-constant (the
groups that carry a learning signal) for G = 8 (a task's 8 samples) and G = 4 (its samples 0-3 and 4-7: two disjoint
groups), under reward = return and reward = success. The first command writes ``OUT/episodes-T{T}.csv`` (one row per
episode) chunk by chunk with a progress line and resumes from them; ``--report`` writes the markdown and, beside it,
the combined CSV it was computed from; ``--from`` rebuilds the markdown from such a CSV alone.

The rule (:data:`RULE`) was written down before any figure of this script was seen; it reads the success reward only:
the arithmetic team's return adds −0.02 per turn and −0.01 per 100 tokens to the success, so nearly every group's
return differs by length alone, a signal about brevity rather than the task.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import sys
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TEMPERATURES = (0.3, 0.5, 0.7, 1.0)
GROUP_SIZES = (4, 8)
REWARDS = ("return", "success")
COLUMNS = ("temperature", "task", "task_id", "difficulty", "sample", "seed", "success", "return", "tokens", "seconds")
RULE = (
    "Signal: the share s_G(T) of GRPO groups whose SUCCESS is non-constant (reward = success; the return is reported "
    "but not used, see the note). Temperature: the highest T of the grid with s_8(T) ≥ 50%; if there is none, the T "
    "with the largest s_8(T) (a tie goes to the higher T). Group size: G = 4 if s_4(T) ≥ 50% at that T (a batch of 64 "
    "episodes then holds 16 tasks instead of 8), else G = 8."
)
THRESHOLD = 0.5


# ----------------------------------------------------------------------------------------------------------------
# the figures (pure: tested on hand-made rows)


@dataclass(frozen=True)
class Summary:
    """One temperature's figures."""

    temperature: float
    tasks: int
    episodes: int
    success: float  # mean success over episodes
    mean_return: float
    mean_tokens: float  # sampled tokens (solver + critic) per episode
    seconds: float  # wall time of its episodes on the machine that ran them
    nonconstant: dict[tuple[int, str], float]  # (G, reward) → share of groups with a non-constant reward


def groups_of(rows: Sequence[dict[str, Any]], g: int) -> list[list[dict[str, Any]]]:
    """Disjoint GRPO groups of size ``g``: each task's samples in sample order, cut into consecutive runs of ``g``
    (samples 0..g−1, g..2g−1, …; an incomplete tail is dropped)."""
    by_task: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by_task[int(r["task"])].append(r)
    out = []
    for task in sorted(by_task):
        samples = sorted(by_task[task], key=lambda r: int(r["sample"]))
        out += [samples[i : i + g] for i in range(0, len(samples) - g + 1, g)]
    return out


def nonconstant_share(rows: Sequence[dict[str, Any]], g: int, reward: str) -> float:
    """The share of ``g``-groups whose ``reward`` column is not the same in every episode (|max − min| > 1e-9)."""
    groups = groups_of(rows, g)
    if not groups:
        return float("nan")
    varied = [max(float(r[reward]) for r in grp) - min(float(r[reward]) for r in grp) > 1e-9 for grp in groups]
    return sum(varied) / len(groups)


def balanced(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows of the tasks played with the same number of samples at every temperature (a stopped run's last
    round may be incomplete)."""
    count: dict[tuple[int, float], int] = defaultdict(int)
    for r in rows:
        count[int(r["task"]), float(r["temperature"])] += 1
    temps = {float(r["temperature"]) for r in rows}
    tasks = {t for t, _ in count}
    full = {t for t in tasks if len({count.get((t, x), 0) for x in temps}) == 1}
    return [r for r in rows if int(r["task"]) in full]


def summarise(rows: Sequence[dict[str, Any]]) -> list[Summary]:
    """One :class:`Summary` per temperature, by increasing temperature (tasks not played at every temperature
    left out)."""
    by_t: dict[float, list[dict[str, Any]]] = defaultdict(list)
    for r in balanced(rows):
        by_t[float(r["temperature"])].append(r)
    out = []
    for t in sorted(by_t):
        rs = by_t[t]
        n = len(rs)
        out.append(
            Summary(
                temperature=t,
                tasks=len({int(r["task"]) for r in rs}),
                episodes=n,
                success=sum(float(r["success"]) for r in rs) / n,
                mean_return=sum(float(r["return"]) for r in rs) / n,
                mean_tokens=sum(float(r["tokens"]) for r in rs) / n,
                seconds=sum(float(r["seconds"]) for r in rs),
                nonconstant={(g, w): nonconstant_share(rs, g, w) for g in GROUP_SIZES for w in REWARDS},
            )
        )
    return out


def s8_at(summaries: Sequence[Summary], t: float) -> float:
    """s_8 (reward = success) at temperature ``t``."""
    return next(s.nonconstant[8, "success"] for s in summaries if s.temperature == t)


def choose(summaries: Sequence[Summary]) -> tuple[float, int, str]:
    """(temperature, group size, one sentence saying which branch of :data:`RULE` decided)."""
    s8 = {s.temperature: s.nonconstant[8, "success"] for s in summaries}
    s4 = {s.temperature: s.nonconstant[4, "success"] for s in summaries}
    passing = [t for t, v in s8.items() if v >= THRESHOLD]
    if passing:
        t = max(passing)
        why = f"T = {t:g} is the highest temperature with s_8 ≥ {THRESHOLD:.0%} (s_8 = {s8[t]:.1%})"
    else:
        t = max(s8, key=lambda k: (s8[k], k))
        why = f"no temperature has s_8 ≥ {THRESHOLD:.0%}; T = {t:g} has the largest s_8 ({s8[t]:.1%})"
    g = 4 if s4[t] >= THRESHOLD else 8
    why += f"; at T = {t:g}, s_4 = {s4[t]:.1%} {'≥' if g == 4 else '<'} {THRESHOLD:.0%}, so G = {g}"
    return t, g, why


def markdown(rows: Sequence[dict[str, Any]], csv_name: str, machine: str, command: str = "") -> str:
    """The report: the setting, the rule, the table and the choice, every figure computed from ``rows``."""
    sums = summarise(rows)
    t, g, why = choose(sums)
    n_tasks = max(s.tasks for s in sums)
    samples = max(int(r["sample"]) for r in rows) + 1
    lines = [
        "# The GPU preset's temperature and group size, chosen on validation with the frozen team",
        "",
        f"Generated by `{command or 'python benchmarks/preset_choice.py'}` (issue 33 item 4) from "
        f"[{csv_name}]({csv_name}) (one row per episode); rebuild it with "
        f"`python benchmarks/preset_choice.py --from docs/results/{csv_name} --report docs/results/gpu_preset.md`.",
        "",
        f"The team of `orchestra/teamtr/configs/smollm2_gpu.yaml` (arithmetic, pipeline solver:solve → critic:check → "
        f"solver:revise, solver and critic sampled, 128 tokens per turn, mixed difficulty) with its LoRA adapters as "
        f"initialised, i.e. the base SmolLM2-135M: no training, so the choice favours no scheme. {n_tasks} tasks of "
        f"the VALIDATION split, each played {samples} times per temperature (the same tasks and episode seeds at every "
        f"temperature), float32 on {machine}.",
        "",
        "## The rule (written before the run)",
        "",
        RULE,
        "",
        "## The figures",
        "",
        "s_G: share of GRPO groups whose reward is non-constant (G = 8: a task's 8 samples; G = 4: samples 0-3 and "
        "4-7, two disjoint groups per task); in brackets, a 95% Wilson interval of s_8 over its groups (one per task). "
        f"CPU time: the wall time of that temperature's episodes ({sum(x.seconds for x in sums) / 60:.0f} min in "
        "all, model load excluded), on a machine shared with other jobs: it measures their load as much as the "
        "temperature.",
        "",
        "| temperature | tasks × samples | success | mean return | tokens / episode | s_8 success | s_4 success "
        "| s_8 return | s_4 return | CPU time |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    from orchestra.report.evaluation import wilson_ci

    for s in sums:
        nc = s.nonconstant
        lo, hi = wilson_ci(round(nc[8, "success"] * s.tasks), s.tasks)
        lines.append(
            f"| {s.temperature:g} | {s.tasks} × {s.episodes // max(s.tasks, 1)} | {s.success:.1%} | "
            f"{s.mean_return:.3f} | {s.mean_tokens:.0f} | {nc[8, 'success']:.1%} [{lo:.0%}, {hi:.0%}] | "
            f"{nc[4, 'success']:.1%} | "
            f"{nc[8, 'return']:.1%} | {nc[4, 'return']:.1%} | {s.seconds / 60:.1f} min |"
        )
    lines += [
        "",
        "## The choice",
        "",
        f"**temperature {t:g}, group size G = {g}**: {why}. `orchestra/teamtr/configs/smollm2_gpu.yaml` carries these "
        "values and trains on reward = success, the reward the rule reads (a test checks both). At the chosen "
        f"temperature {1 - s8_at(sums, t):.0%} of the groups still have a constant success and give no gradient "
        "(the grid holds no temperature below the lowest shown).",
        "",
        "## What it does not show",
        "",
        f"- {n_tasks} tasks: s_8 is a share of {n_tasks} groups, s_4 of {2 * n_tasks}, hence the wide intervals; the "
        "temperatures play the same tasks and seeds, so their differences are less noisy than the intervals suggest, "
        "but close shares are not told apart.",
        "- The return is non-constant in almost every group whatever the temperature: it subtracts 0.02 per turn and "
        "0.01 per 100 tokens, so groups whose success is constant still differ in length. That signal rewards "
        "brevity, not solving; the rule reads the success.",
        "- The frozen team only: as training moves the success rate, the share of informative groups moves too.",
        "- The CPU in float32, not the GPU in bfloat16: the sampled tokens differ in rounding, not in distribution.",
        "",
    ]
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------------------------
# I/O


def read_rows(paths: Iterable[Path]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for p in paths:
        with p.open(newline="", encoding="utf-8") as f:
            rows += list(csv.DictReader(f))
    return rows


def write_rows(path: Path, rows: Sequence[dict[str, Any]], *, append: bool = False) -> None:
    new = not (append and path.exists())
    with path.open("a" if append else "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        if new:
            w.writeheader()
        w.writerows([{k: r[k] for k in COLUMNS} for r in rows])


def machine_line() -> str:
    import torch

    from orchestra.backends.llamacpp_build import cpu_info

    cpu, _ = cpu_info()
    return f"{platform.system()} {platform.machine()}, {os.cpu_count()} cores ({cpu}), torch {torch.get_num_threads()} threads"


# ----------------------------------------------------------------------------------------------------------------
# playing the frozen team


def run(a: argparse.Namespace) -> list[Path]:
    """Play every temperature's missing tasks, ``--chunk`` tasks at a time at every temperature in turn (resumed
    from the CSVs already in ``--out``); returns the per-temperature CSVs."""
    from orchestra.cli.options import flatten, replace_paths
    from orchestra.jobs.finetune import GPU_CONFIG, FinetuneConfig, read_config_file
    from orchestra.runtime.rollout import EpisodeJob, episode_seed, require_no_faults
    from orchestra.teamtr.config import derive_seed
    from orchestra.teamtr.llm import LLMTeam

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    settings = {"tasks": a.tasks, "samples": a.samples, "seed": a.seed, "config": GPU_CONFIG.name}
    stored = out / "settings.json"
    if stored.exists():
        old = json.loads(stored.read_text(encoding="utf-8"))
        if {k: old.get(k) for k in settings} != settings:
            sys.exit(f"{out} holds a run with {old}; use another --out (asked for {settings})")
    stored.write_text(json.dumps({**settings, "machine": machine_line()}, indent=2) + "\n", encoding="utf-8")

    preset = replace_paths(FinetuneConfig(), flatten(read_config_file(GPU_CONFIG)), where=f"{GPU_CONFIG.name}: ")
    cfg = replace(preset.team, dtype="float32", device="cpu", eval_tasks=0, seed=a.seed)
    team = LLMTeam(cfg, log=print)
    tasks = team.family.generate("validation", a.tasks, derive_seed(a.seed, 33, bits=31), cfg.difficulty)
    paths = {temp: out / f"episodes-T{temp:g}.csv" for temp in a.temperatures}
    done = {
        temp: {int(r["task"]) for r in read_rows([path])} if path.exists() else set() for temp, path in paths.items()
    }
    # chunk-major: every round plays the same tasks at every temperature, so stopping between rounds (--minutes)
    # leaves a balanced design
    t_start, rounds = time.perf_counter(), 0
    for c in range(0, len(tasks), a.chunk):
        chunk = list(range(c, min(c + a.chunk, len(tasks))))
        elapsed = time.perf_counter() - t_start
        if a.minutes and rounds and elapsed + elapsed / rounds > a.minutes * 60:
            print(f"stopping before tasks {chunk[0]}-{chunk[-1]}: another round would pass --minutes {a.minutes:g}")
            break
        for temp in a.temperatures:
            todo = [i for i in chunk if i not in done[temp]]
            if not todo:
                continue
            for name in cfg.workers:  # the sampled workers at this temperature (the engine holds them by reference)
                team.workers[name].params = replace(team.workers[name].params, temperature=temp)
            jobs = {
                f"T{temp:g}-{i:04d}-{k}": (
                    i,
                    k,
                    EpisodeJob("", replace(tasks[i]), episode_seed(a.seed, i * a.samples + k)),
                )
                for i in todo
                for k in range(a.samples)
            }
            t0 = time.perf_counter()
            eps = require_no_faults(
                team.engine.run([replace(j, episode_id=e) for e, (_, _, j) in jobs.items()]), "a validation batch"
            )
            per = (time.perf_counter() - t0) / len(eps)
            rows = []
            for ep in sorted(eps, key=lambda e: jobs[e.episode_id][:2]):
                i, k, job = jobs[ep.episode_id]
                tokens = sum(int(v) for w, v in (ep.usage.get("tokens") or {}).items() if w in cfg.workers)
                rows.append(
                    dict(
                        temperature=temp,
                        task=i,
                        task_id=tasks[i].id,
                        difficulty=int(tasks[i].difficulty or 0),
                        sample=k,
                        seed=job.seed,
                        success=float(ep.success),
                        **{"return": round(float(ep.return_), 6)},
                        tokens=tokens,
                        seconds=round(per, 3),
                    )
                )
            write_rows(paths[temp], rows, append=True)
            done[temp] |= set(todo)
            have = read_rows([paths[temp]])
            print(
                f"T={temp:g}: {len(done[temp])}/{len(tasks)} tasks, "
                f"success {sum(float(r['success']) for r in have) / len(have):.1%}, "
                f"s_8 success {nonconstant_share(have, 8, 'success'):.0%}, {time.perf_counter() - t0:.0f} s, "
                f"{(time.perf_counter() - t_start) / 60:.1f} min in all",
                flush=True,
            )
        rounds += 1
    return list(paths.values())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", type=int, default=24, help="validation tasks (default: %(default)s)")
    p.add_argument("--samples", type=int, default=8, help="episodes per task and temperature (default: %(default)s)")
    p.add_argument("--temperatures", type=float, nargs="+", default=list(TEMPERATURES))
    p.add_argument("--chunk", type=int, default=8, help="tasks played at once (default: %(default)s: 64 episodes)")
    p.add_argument("--seed", type=int, default=0, help="tasks and episode seeds (default: %(default)s)")
    p.add_argument("--minutes", type=float, default=0, help="start no round of --chunk tasks that would end later")
    p.add_argument("--out", default="runs/preset-choice", help="per-temperature episode CSVs (resumed)")
    p.add_argument("--from", dest="source", default=None, help="a combined CSV: only rebuild the report from it")
    p.add_argument("--report", default=None, help="write the markdown here and the combined CSV beside it (.csv)")
    a = p.parse_args(argv)
    if a.samples % 8:
        p.error("--samples must be a multiple of 8 (groups of 4 and 8)")
    if a.source:
        rows = read_rows([Path(a.source)])
        machine, command = (rows[0].get("machine", ""), rows[0].get("command", "")) if rows else ("", "")
    else:
        rows = balanced(read_rows(run(a)))
        machine = json.loads((Path(a.out) / "settings.json").read_text(encoding="utf-8"))["machine"]
        command = " ".join(["python benchmarks/preset_choice.py", *(argv if argv is not None else sys.argv[1:])])
    for s in summarise(rows):
        nc = " ".join(f"s_{g} {w} {s.nonconstant[g, w]:.0%}" for g in GROUP_SIZES for w in REWARDS)
        print(f"T={s.temperature:g}: {s.tasks} tasks, success {s.success:.1%}, return {s.mean_return:.3f}, {nc}")
    t, g, why = choose(summarise(rows))
    print(f"choice: temperature {t:g}, G = {g} ({why})")
    if a.report:
        report = Path(a.report)
        csv_path = report.with_suffix(".csv")
        if not a.source or Path(a.source).resolve() != csv_path.resolve():
            with csv_path.open("w", newline="", encoding="utf-8") as f:
                w = csv.DictWriter(f, fieldnames=[*COLUMNS, "machine", "command"])
                w.writeheader()
                w.writerows([{**{k: r[k] for k in COLUMNS}, "machine": machine, "command": command} for r in rows])
        report.write_text(markdown(rows, csv_path.name, machine, command), encoding="utf-8")
        print(f"written: {report} {csv_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
