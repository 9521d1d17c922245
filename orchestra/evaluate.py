"""Evaluation of conductors on the same held-out tasks: success with 95% CI, return, turns, tokens.

Every conductor runs the same test-split tasks with the same per-episode seeds (paired design), per
task family. Output: a table on screen, ``results.csv``, ``results.md`` and ``success.png`` in the run
directory.
"""

from __future__ import annotations

import csv
import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from trajectories import Episode


def wilson_ci(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion (good at small n and at 0% / 100%)."""
    if n == 0:
        return (0.0, 1.0)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


@dataclass(frozen=True)
class ResultRow:
    family: str
    team: str
    conductor: str
    episodes: int
    successes: int
    success_rate: float
    ci_low: float
    ci_high: float
    mean_return: float
    mean_turns: float
    mean_tokens: float
    truncated_rate: float


def summarize(episodes: Iterable[Episode]) -> list[ResultRow]:
    """One row per (family, team, conductor), sorted."""
    groups: dict[tuple[str, str, str], list[Episode]] = defaultdict(list)
    for e in episodes:
        groups[(e.task.family, e.team.name, e.conductor.name)].append(e)
    rows = []
    for (family, team, conductor), eps in sorted(groups.items()):
        k, n = sum(e.success for e in eps), len(eps)
        lo, hi = wilson_ci(k, n)
        rows.append(
            ResultRow(
                family=family,
                team=team,
                conductor=conductor,
                episodes=n,
                successes=k,
                success_rate=k / n,
                ci_low=lo,
                ci_high=hi,
                mean_return=float(np.mean([e.return_ for e in eps])),
                mean_turns=float(np.mean([e.worker_turns for e in eps])),
                mean_tokens=float(np.mean([e.total_tokens for e in eps])),
                truncated_rate=float(np.mean([e.truncated for e in eps])),
            )
        )
    return rows


def format_table(rows: Sequence[ResultRow]) -> str:
    """A markdown table (readable on screen and in a README)."""
    head = "| family | conductor | n | success | 95% CI | return | turns | tokens |"
    sep = "|---|---|---:|---:|---|---:|---:|---:|"
    lines = [head, sep]
    for r in rows:
        lines.append(
            f"| {r.family} | {r.conductor} | {r.episodes} | {100 * r.success_rate:.1f}% | "
            f"[{100 * r.ci_low:.1f}, {100 * r.ci_high:.1f}] | {r.mean_return:.3f} | {r.mean_turns:.2f} | {r.mean_tokens:.1f} |"
        )
    return "\n".join(lines)


def write_report(rows: Sequence[ResultRow], out_dir: Path, title: str = "Conductor evaluation") -> dict[str, Path]:
    """Write results.csv, results.md and success.png into ``out_dir``; returns their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"csv": out_dir / "results.csv", "md": out_dir / "results.md", "png": out_dir / "success.png"}
    with paths["csv"].open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(ResultRow.__dataclass_fields__))
        w.writeheader()
        for r in rows:
            w.writerow(asdict(r))
    paths["md"].write_text(f"# {title}\n\n{format_table(rows)}\n", encoding="utf-8")
    plot_success(rows, paths["png"], title)
    return paths


def plot_success(rows: Sequence[ResultRow], path: Path, title: str) -> None:
    """Grouped bars: success rate per conductor within each family, with 95% CI error bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    families = sorted({r.family for r in rows})
    conductors = sorted({r.conductor for r in rows})
    by = {(r.family, r.conductor): r for r in rows}
    width = 0.8 / max(len(conductors), 1)
    fig, ax = plt.subplots(figsize=(max(5.0, 1.8 * len(families) + 2), 3.8))
    x = np.arange(len(families))
    for j, c in enumerate(conductors):
        vals, lo, hi = [], [], []
        for fam in families:
            r = by.get((fam, c))
            v = r.success_rate if r else 0.0
            vals.append(100 * v)
            lo.append(100 * (v - r.ci_low) if r else 0.0)
            hi.append(100 * (r.ci_high - v) if r else 0.0)
        ax.bar(x + (j - (len(conductors) - 1) / 2) * width, vals, width, yerr=[lo, hi], capsize=3, label=c)
    ax.set_xticks(x, families)
    ax.set_ylabel("success rate (%)")
    ax.set_ylim(0, 100)
    ax.set_title(title)
    ax.legend(fontsize=8, ncols=min(len(conductors), 3))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
