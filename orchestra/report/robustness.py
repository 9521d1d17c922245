"""The robustness table of ``orchestra evaluate --perturb``: each conductor's success under each perturbation
(:mod:`envs.perturb`), paired task by task with its unperturbed run on the same tasks and seeds.

Per (team, conductor, perturbation): the tasks both runs finished without a fault, success clean and perturbed, the
paired difference (perturbed − clean) with its 95% Agresti–Min interval, and the exact McNemar test. The McNemar
p-values are Holm-adjusted across the whole table. ``robustness.png`` plots success against perturbation, one line
per conductor and one panel per team.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from orchestra.report import stats
from trajectories import Episode


@dataclass(frozen=True)
class RobustnessRow:
    team: str
    conductor: str
    perturbation: str  # KIND=STRENGTH (envs.perturb)
    tasks: int  # paired tasks: finished without a fault in both runs
    clean_success: float
    perturbed_success: float
    diff: float  # perturbed − clean, fraction of tasks
    diff_lo: float
    diff_hi: float
    wins: int  # tasks solved only under perturbation
    losses: int  # tasks solved only without it
    p_mcnemar: float
    p_holm: float


def _key(e: Episode) -> tuple[str, str, str, int]:
    return (e.team.name, e.conductor.name, e.task.id, e.seed)


def robustness_rows(clean: Sequence[Episode], perturbed: Mapping[str, Sequence[Episode]]) -> list[RobustnessRow]:
    """One row per (team, conductor, perturbation) present in both ``clean`` and ``perturbed[spec]``."""
    base = {_key(e): e for e in clean if e.error is None}
    rows: list[RobustnessRow] = []
    for spec, eps in perturbed.items():
        groups: dict[tuple[str, str], list[tuple[bool, bool]]] = {}
        for e in eps:
            b = base.get(_key(e))
            if e.error is None and b is not None:
                groups.setdefault((e.team.name, e.conductor.name), []).append((b.success, e.success))
        for (team, conductor), pairs in sorted(groups.items()):
            c = np.array([p[0] for p in pairs])
            q = np.array([p[1] for p in pairs])
            ps = stats.paired_success(q, c)
            mc = stats.mcnemar_exact(q, c)
            rows.append(
                RobustnessRow(
                    team,
                    conductor,
                    spec,
                    len(pairs),
                    float(c.mean()),
                    float(q.mean()),
                    ps.diff,
                    ps.lo,
                    ps.hi,
                    mc.wins,
                    mc.losses,
                    mc.p,
                    math.nan,
                )
            )
    adjusted = stats.holm([r.p_mcnemar for r in rows])
    return [RobustnessRow(**{**asdict(r), "p_holm": p}) for r, p in zip(rows, adjusted, strict=True)]


def robustness_table_md(rows: Sequence[RobustnessRow]) -> str:
    lines = [
        "| team | conductor | perturbation | tasks | success clean | success perturbed | Δ (points, 95% CI) "
        "| only perturbed / only clean | McNemar p (Holm) |",
        "|---|---|---|---:|---:|---:|---|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r.team} | {r.conductor} | {r.perturbation} | {r.tasks} | {100 * r.clean_success:.1f}% | "
            f"{100 * r.perturbed_success:.1f}% | {100 * r.diff:+.1f} [{100 * r.diff_lo:+.1f}, {100 * r.diff_hi:+.1f}] "
            f"| {r.wins} / {r.losses} | {r.p_mcnemar:.3g} ({r.p_holm:.3g}) |"
        )
    return "\n".join(lines)


def plot_robustness(rows: Sequence[RobustnessRow], path: Path) -> None:
    """Success against perturbation (the clean run first), a line per conductor, a panel per team."""
    from orchestra.report.plots import _colours, _pyplot

    plt = _pyplot()
    teams = sorted({r.team for r in rows})
    fig, axes = plt.subplots(1, max(1, len(teams)), figsize=(max(7.0, 5.5 * len(teams)), 4.2), squeeze=False)
    colours = _colours(sorted({r.conductor for r in rows}))
    for ax, team in zip(axes[0], teams, strict=False):
        mine = [r for r in rows if r.team == team]
        specs = list(dict.fromkeys(r.perturbation for r in mine))
        for conductor in sorted({r.conductor for r in mine}):
            by = {r.perturbation: r for r in mine if r.conductor == conductor}
            first = next(iter(by.values()))
            xs = ["clean", *[s for s in specs if s in by]]
            ys = [100 * first.clean_success, *[100 * by[s].perturbed_success for s in specs if s in by]]
            ax.plot(xs, ys, marker="o", label=conductor, color=colours[conductor])
        ax.set_title(team)
        ax.set_ylabel("success (%)")
        ax.set_ylim(-2, 102)
        ax.tick_params(axis="x", rotation=20)
        ax.legend(fontsize=8)
    fig.suptitle("Success under perturbation (the same tasks and seeds as the clean run)", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_robustness(rows: Sequence[RobustnessRow], out: Path) -> dict[str, Path]:
    """``robustness.md``, ``robustness.csv`` and ``robustness.png`` in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    paths = {
        "robustness_md": out / "robustness.md",
        "robustness_csv": out / "robustness.csv",
        "robustness_png": out / "robustness.png",
    }
    head = "# Robustness: success under perturbed communication\n\n" + (__doc__ or "").split("\n\n")[1] + "\n\n"
    paths["robustness_md"].write_text(head + robustness_table_md(rows) + "\n", encoding="utf-8")
    with paths["robustness_csv"].open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(RobustnessRow.__dataclass_fields__))
        w.writeheader()
        w.writerows(asdict(r) for r in rows)
    plot_robustness(rows, paths["robustness_png"])
    return paths


__all__ = ["RobustnessRow", "plot_robustness", "robustness_rows", "robustness_table_md", "write_robustness"]
