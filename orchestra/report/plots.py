"""PNG figures of an evaluation report (matplotlib, Agg backend, no display needed).

* ``success.png`` — success rate per conductor within each family, 95% bootstrap CI error bars;
* ``cost.png`` — success vs cost: one panel per family, x = mean tokens per episode, y = success
  rate, one marker per conductor (circles rule-based, diamonds learned), CI error bars on both axes;
* ``cost_quality.png`` (phase-1 benchmark) — the cost–quality plane of RouterBench (Hu et al. 2024): the
  menu's schedules, the learners (mean over seeds), the oracle router, and the hull of the menu (its
  Pareto frontier: no schedule is both cheaper and more successful than a point on it);
* ``verdicts.png`` (phase-2 experiments) — the paired differences over seeds with their intervals, one row per
  comparison (:func:`plot_intervals`, the interval plot rliable popularised).

Phase 2's schemes keep one colour in every figure of every report (:func:`scheme_colour`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from orchestra.report.rows import ResultRow


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


# one colour per trainer scheme (tab10 order), the same in every phase-2 figure and report
SCHEME_COLOURS = {
    "teamtr": "tab:red",
    "naive": "tab:blue",
    "joint": "tab:green",
    "joint_indep": "tab:cyan",
    "happo": "tab:purple",
    "stale_indep": "tab:orange",
    "naive_bigB": "tab:brown",
    "frozen": "tab:gray",
}
_SPARE = ("tab:pink", "tab:olive", "black", "gold")


def scheme_colour(scheme: str) -> str:
    """The colour of a trainer scheme (:data:`SCHEME_COLOURS`; another name gets a spare colour from its letters)."""
    return SCHEME_COLOURS.get(scheme) or _SPARE[sum(map(ord, scheme)) % len(_SPARE)]


def plot_intervals(
    rows: Sequence[tuple[str, float, float, float, bool, str]], path: Path, xlabel: str, title: str = ""
) -> None:
    """The paired differences as an interval plot: one row per (label, Δ, lo, hi, primary, scheme), top to bottom, a
    point with its interval in the scheme's colour and a line at 0; filled points for the declared primary family,
    hollow for the rest."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 0.9 + 0.32 * max(len(rows), 1)))
    for i, (_label, d, lo, hi, primary, scheme) in enumerate(rows):
        y = len(rows) - 1 - i
        colour = scheme_colour(scheme)
        ax.plot([lo, hi], [y, y], "-", color=colour, lw=2.2, alpha=0.8)
        ax.plot(d, y, "o", color=colour, markerfacecolor=colour if primary else "white", markersize=6)
    ax.axvline(0.0, color="black", lw=0.8)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([r[0] for r in reversed(rows)], fontsize=8)
    ax.set_xlabel(xlabel)
    ax.grid(axis="x", alpha=0.3)
    if title:
        ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _colours(conductors: Sequence[str]) -> dict[str, Any]:
    """One stable colour per conductor across every figure of a report."""
    plt = _pyplot()
    cmap = plt.get_cmap("tab10" if len(conductors) <= 10 else "tab20")
    return {c: cmap(i % cmap.N) for i, c in enumerate(conductors)}


def _err(centre: float, lo: float, hi: float, scale: float = 1.0) -> tuple[float, float]:
    """Asymmetric error-bar lengths; a percentile interval need not contain the point estimate, and
    matplotlib refuses negative lengths, hence the clip."""
    if np.isnan(lo) or np.isnan(hi):
        return (0.0, 0.0)
    return (max(0.0, scale * (centre - lo)), max(0.0, scale * (hi - centre)))


def plot_success(rows: Sequence[ResultRow], path: Path, title: str) -> None:
    """Grouped bars: success rate per conductor within each family, with 95% bootstrap CI error bars."""
    plt = _pyplot()
    families = sorted({r.family for r in rows})
    conductors = sorted({r.conductor for r in rows})
    colours = _colours(conductors)
    by = {(r.family, r.conductor): r for r in rows}
    width = 0.8 / max(len(conductors), 1)
    fig, ax = plt.subplots(figsize=(max(5.0, 1.8 * len(families) + 2), 3.8))
    x = np.arange(len(families))
    for j, c in enumerate(conductors):
        vals, lo, hi = [], [], []
        for fam in families:
            r = by.get((fam, c))
            v = r.success_rate if r else float("nan")  # a conductor absent from a family: no bar
            e = _err(v, r.ci_low, r.ci_high, 100.0) if r else (0.0, 0.0)
            vals.append(100 * v)
            lo.append(e[0])
            hi.append(e[1])
        ax.bar(
            x + (j - (len(conductors) - 1) / 2) * width,
            vals,
            width,
            yerr=[lo, hi],
            capsize=3,
            label=c,
            color=colours[c],
        )
    ax.set_xticks(x, families)
    ax.set_ylabel("success rate (%)")
    ax.set_ylim(0, 118)  # headroom for the legend above 100%
    ax.set_title(title)
    ax.legend(fontsize=8, ncols=min(len(conductors), 4), loc="upper center")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_cost(rows: Sequence[ResultRow], path: Path, title: str) -> None:
    """Success vs cost: a panel per family, mean tokens per episode against success rate (95% CIs)."""
    plt = _pyplot()
    families = sorted({r.family for r in rows}) or ["(no episodes)"]
    conductors = sorted({r.conductor for r in rows})
    colours = _colours(conductors)
    fig, axes = plt.subplots(1, len(families), figsize=(4.2 * len(families) + 1.2, 3.8), squeeze=False)
    for ax, fam in zip(axes[0], families, strict=True):
        for r in (r for r in rows if r.family == fam):
            ax.errorbar(
                r.mean_tokens,
                100 * r.success_rate,
                xerr=np.array(_err(r.mean_tokens, r.tokens_ci_low, r.tokens_ci_high)).reshape(2, 1),
                yerr=np.array(_err(r.success_rate, r.ci_low, r.ci_high, 100.0)).reshape(2, 1),
                fmt="o" if r.rule_based else "D",
                markersize=7,
                capsize=3,
                color=colours[r.conductor],
                label=r.conductor,
            )
            ax.annotate(
                r.conductor,
                (r.mean_tokens, 100 * r.success_rate),
                fontsize=7,
                xytext=(4, 4),
                textcoords="offset points",
            )
        ax.set_title(fam)
        ax.set_xlabel("mean tokens per episode")
        ax.set_ylim(-2, 105)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("success rate (%)")
    handles, labels = [], []
    for ax in axes[0]:  # one legend entry per conductor, whichever panel it appears in
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    if handles:
        fig.legend(handles, labels, fontsize=8, loc="center right")
    fig.suptitle(f"{title}: success vs cost (circles rule-based, diamonds learned)", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1 - 1.2 / fig.get_figwidth() if handles else 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)


def pareto_hull(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """The non-dominated points (cost, quality), cheapest first: each is more successful than every
    cheaper one."""
    out: list[tuple[float, float]] = []
    for c, q in sorted(points, key=lambda p: (p[0], -p[1])):
        if not out or q > out[-1][1]:
            out.append((c, q))
    return out


def plot_cost_quality(
    panels: dict[str, list[tuple[str, float, float, str]]],
    path: Path,
    title: str,
    xlabel: str | Mapping[str, str] = "mean tokens per episode",
) -> None:
    """One panel per family; ``panels[family]`` lists (label, cost, success in [0, 1], kind) with kind
    ``rule`` (a menu schedule), ``learned``, ``oracle``, ``replicate`` (the oracle picked on a replicate run, an open
    star) or ``other``. The menu's hull is drawn as a step line.
    ``xlabel``: the cost axis's label, one for every panel or one per family (a priced team's cost is its price)."""
    plt = _pyplot()
    fams = sorted(panels) or ["(no data)"]
    fig, axes = plt.subplots(1, len(fams), figsize=(4.4 * len(fams) + 0.6, 4.0), squeeze=False)
    style = {
        "rule": ("o", "tab:blue"),
        "learned": ("D", "tab:red"),
        "oracle": ("*", "tab:green"),
        "replicate": ("*", "tab:green"),  # drawn open: the oracle picked on a replicate run
        "other": ("x", "grey"),
    }
    for ax, fam in zip(axes[0], fams, strict=True):
        pts = panels.get(fam, [])
        hull = pareto_hull([(c, q) for _, c, q, k in pts if k == "rule"])
        if hull:
            xs = [hull[0][0]] + [p[0] for p in hull[1:] for _ in (0, 1)]
            ys = [p[1] for p in hull for _ in (0, 1)][:-1]
            ax.plot(xs, [100 * y for y in ys], "-", color="tab:blue", alpha=0.4, label="menu hull")
        placed: dict[tuple[float, float], int] = {}  # labels already at a point: the next one goes below them
        for label, c, q, kind in pts:
            marker, colour = style.get(kind, style["other"])
            big = kind in ("oracle", "replicate")
            face = "none" if kind == "replicate" else colour
            ax.plot(c, 100 * q, marker, color=colour, markerfacecolor=face, markersize=11 if big else 7)
            k = placed[(round(c, 9), round(q, 9))] = placed.get((round(c, 9), round(q, 9)), -1) + 1
            ax.annotate(label, (c, 100 * q), fontsize=7, xytext=(4, 3 - 9 * k), textcoords="offset points")
        ax.set_title(fam)
        ax.set_xlabel(xlabel if isinstance(xlabel, str) else xlabel.get(fam, "mean tokens per episode"))
        ax.set_ylim(-2, 105)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("success rate on test (%)")
    stars = (
        "stars oracle router (open: picked on a replicate run)"
        if any(k == "replicate" for pts in panels.values() for *_, k in pts)
        else "star oracle router"
    )
    sep = "\n" if len(fams) == 1 else " "  # one panel is too narrow for the legend on one line
    fig.suptitle(f"{title}: circles menu schedules, diamonds learned (mean over seeds),{sep}{stars}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


__all__ = [
    "SCHEME_COLOURS",
    "pareto_hull",
    "plot_cost",
    "plot_cost_quality",
    "plot_intervals",
    "plot_success",
    "scheme_colour",
]
