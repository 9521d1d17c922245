"""Evaluation of conductors on the same held-out tasks: per-conductor summaries with bootstrap CIs,
paired comparisons against the best rule-based scheduler, and a mode-collapse check.

Every conductor runs the same test-split tasks with the same per-episode seeds (paired design), per
task family, so two conductors' episodes pair up on ``(task.family, task.id, seed)`` and a
comparison can resample *tasks* (the unit that varies) instead of treating the two samples as
independent. Output (``write_report`` / ``evaluation_report``): ``results.csv``, ``results.md``
(main table, paired table, mode-collapse table), ``paired.csv``, ``collapse.csv``, ``success.png``
and ``cost.png`` in the run directory.

Intervals are 95% percentile-bootstrap intervals (Efron & Tibshirani 1993, "An Introduction to the
Bootstrap", ch. 13) with a fixed seed, so a report is reproducible to the digit. The Wilson score
interval of the success rate is kept in the CSV (it behaves better at 0% and 100%, where a
percentile bootstrap collapses to a point).
"""

from __future__ import annotations

import csv
import math
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np

from orchestra.report.plots import plot_cost, plot_success
from policies import RULE_BASED
from trajectories import Episode

N_RESAMPLES = 2000  # bootstrap resamples behind every interval of the report
CONFIDENCE = 0.95  # two-sided level of every interval
BEAT_MARGIN = 0.05  # "beats": mean success difference of at least +5 points ...
CHEAPER_FRACTION = 0.25  # "cheaper": turns or tokens at least 25% lower at no clear success change
COLLAPSE_SHARE = 0.9  # "collapsed": one action sequence covers at least 90% of the episodes

Stat = Callable[[np.ndarray], float]


def is_rule_based(conductor: str) -> bool:
    """A conductor name recorded by a rule-based scheduler (``policies.RULE_BASED``); learned ones
    are recorded as ``LABEL`` or ``LABEL:CHECKPOINT`` and never collide with those names."""
    return conductor in RULE_BASED


# ----------------------------------------------------------------------------- intervals


def wilson_ci(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion (good at small n and at 0% / 100%)."""
    if n == 0:
        return (0.0, 1.0)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


def bootstrap_ci(
    values: Sequence[float] | np.ndarray,
    stat: Stat = np.mean,
    n_resamples: int = N_RESAMPLES,
    seed: int = 0,
    confidence: float = CONFIDENCE,
) -> tuple[float, float]:
    """Percentile bootstrap interval of ``stat(values)``.

    Draw ``n_resamples`` samples of size n with replacement, ``θ*_b = stat(values[idx_b])``, and
    return the ``(1-confidence)/2`` and ``(1+confidence)/2`` quantiles of the θ*. Deterministic for
    a seed: the resample indices depend only on ``(seed, n, n_resamples)``, so columns of one paired
    sample bootstrapped with the same seed are resampled on the *same* tasks. Empty input gives
    ``(nan, nan)``.
    """
    x = np.asarray(values, dtype=np.float64)  # (n,)
    if x.size == 0:
        return (math.nan, math.nan)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, x.size, size=(n_resamples, x.size))  # (B, n)
    # (B,) θ* per resample; the mean (the common case) is vectorised
    thetas = x[idx].mean(axis=1) if stat is np.mean else np.array([stat(x[i]) for i in idx], dtype=np.float64)
    alpha = (1.0 - confidence) / 2.0
    lo, hi = np.quantile(thetas, [alpha, 1.0 - alpha])
    return (float(lo), float(hi))


# ----------------------------------------------------------------------------- per-conductor summary


@dataclass(frozen=True)
class ResultRow:
    """One (family, team, conductor): means over its episodes with 95% bootstrap intervals.

    ``ci_low``/``ci_high`` bound the success rate (bootstrap); ``wilson_*`` is the Wilson interval."""

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
    rule_based: bool
    wilson_low: float
    wilson_high: float
    return_ci_low: float
    return_ci_high: float
    turns_ci_low: float
    turns_ci_high: float
    tokens_ci_low: float
    tokens_ci_high: float


def _group(episodes: Iterable[Episode]) -> dict[tuple[str, str, str], list[Episode]]:
    groups: dict[tuple[str, str, str], list[Episode]] = defaultdict(list)
    for e in episodes:
        groups[(e.task.family, e.team.name, e.conductor.name)].append(e)
    return dict(sorted(groups.items()))


def summarize(episodes: Iterable[Episode], n_resamples: int = N_RESAMPLES, seed: int = 0) -> list[ResultRow]:
    """One row per (family, team, conductor), sorted, with bootstrap CIs of every mean."""
    rows = []
    for (family, team, conductor), eps in _group(episodes).items():
        success = np.array([e.success for e in eps], dtype=np.float64)
        ret = np.array([e.return_ for e in eps], dtype=np.float64)
        turns = np.array([e.worker_turns for e in eps], dtype=np.float64)
        tokens = np.array([e.total_tokens for e in eps], dtype=np.float64)
        k, n = int(success.sum()), len(eps)
        s_lo, s_hi = bootstrap_ci(success, n_resamples=n_resamples, seed=seed)
        w_lo, w_hi = wilson_ci(k, n)
        r_lo, r_hi = bootstrap_ci(ret, n_resamples=n_resamples, seed=seed)
        t_lo, t_hi = bootstrap_ci(turns, n_resamples=n_resamples, seed=seed)
        k_lo, k_hi = bootstrap_ci(tokens, n_resamples=n_resamples, seed=seed)
        rows.append(
            ResultRow(
                family=family,
                team=team,
                conductor=conductor,
                episodes=n,
                successes=k,
                success_rate=k / n,
                ci_low=s_lo,
                ci_high=s_hi,
                mean_return=float(ret.mean()),
                mean_turns=float(turns.mean()),
                mean_tokens=float(tokens.mean()),
                truncated_rate=float(np.mean([e.truncated for e in eps])),
                rule_based=is_rule_based(conductor),
                wilson_low=w_lo,
                wilson_high=w_hi,
                return_ci_low=r_lo,
                return_ci_high=r_hi,
                turns_ci_low=t_lo,
                turns_ci_high=t_hi,
                tokens_ci_low=k_lo,
                tokens_ci_high=k_hi,
            )
        )
    return rows


def format_table(rows: Sequence[ResultRow]) -> str:
    """A markdown table (readable on screen and in a README); intervals are 95% bootstrap CIs."""
    head = "| family | conductor | n | success | 95% CI | return | 95% CI | turns | 95% CI | tokens | 95% CI |"
    sep = "|---|---|---:|---:|---|---:|---|---:|---|---:|---|"
    lines = [head, sep]
    for r in rows:
        lines.append(
            f"| {r.family} | {r.conductor} | {r.episodes} | {100 * r.success_rate:.1f}% "
            f"| [{100 * r.ci_low:.1f}, {100 * r.ci_high:.1f}] "
            f"| {r.mean_return:.3f} | [{r.return_ci_low:.3f}, {r.return_ci_high:.3f}] "
            f"| {r.mean_turns:.2f} | [{r.turns_ci_low:.2f}, {r.turns_ci_high:.2f}] "
            f"| {r.mean_tokens:.1f} | [{r.tokens_ci_low:.1f}, {r.tokens_ci_high:.1f}] |"
        )
    return "\n".join(lines)


# ----------------------------------------------------------------------------- paired comparison


def best_rule_based(rows: Sequence[ResultRow]) -> dict[tuple[str, str], str]:
    """Per (family, team): the rule-based conductor with the highest success rate, ties broken by the
    higher mean return, then by name (so the choice never depends on input order)."""
    best: dict[tuple[str, str], ResultRow] = {}
    for r in rows:
        if not r.rule_based:
            continue
        key = (r.family, r.team)
        cur = best.get(key)
        if cur is None or (r.success_rate, r.mean_return, cur.conductor) > (
            cur.success_rate,
            cur.mean_return,
            r.conductor,
        ):
            best[key] = r
    return {k: r.conductor for k, r in sorted(best.items())}


@dataclass(frozen=True)
class PairedRow:
    """``conductor`` − ``baseline`` on the tasks both played (same task id and seed).

    ``*_diff`` is the mean per-task difference, ``*_lo``/``*_hi`` its 95% bootstrap CI over tasks;
    success is a fraction (×100 = points). ``turns_rel``/``tokens_rel`` are the relative change of
    the paired means, ``(mean_c − mean_b) / mean_b`` (nan when the baseline spends nothing)."""

    family: str
    team: str
    conductor: str
    baseline: str
    rule_based: bool
    n_pairs: int
    success: float
    baseline_success: float
    success_diff: float
    success_lo: float
    success_hi: float
    return_diff: float
    return_lo: float
    return_hi: float
    turns_diff: float
    turns_lo: float
    turns_hi: float
    tokens_diff: float
    tokens_lo: float
    tokens_hi: float
    turns_rel: float
    tokens_rel: float
    verdict: str


def verdict(success_diff: float, success_lo: float, success_hi: float, turns_rel: float, tokens_rel: float) -> str:
    """The acceptance rule of a conductor against the best rule-based one (success as fractions):

    * ``beats``: mean success difference ≥ +5 points and the 95% CI lower bound > 0;
    * ``worse``: the CI upper bound < 0;
    * ``cheaper``: the CI contains 0 and turns or tokens are ≥ 25% lower;
    * ``no clear difference`` otherwise.
    """
    if math.isnan(success_diff):
        return "no paired tasks"
    if success_diff >= BEAT_MARGIN - 1e-12 and success_lo > 0:
        return "beats"
    if success_hi < 0:
        return "worse"
    cheaper = any(not math.isnan(x) and x <= -CHEAPER_FRACTION + 1e-12 for x in (turns_rel, tokens_rel))
    if success_lo <= 0 <= success_hi and cheaper:
        return "cheaper"
    return "no clear difference"


def _pair_key(e: Episode) -> tuple[str, str, int]:
    return (e.task.family, e.task.id, e.seed)


def _rel(c: np.ndarray, b: np.ndarray) -> float:
    base = float(b.mean()) if b.size else 0.0
    return (float(c.mean()) - base) / base if base > 0 else math.nan


def paired_row(
    episodes: Sequence[Episode],
    baseline_episodes: Sequence[Episode],
    n_resamples: int = N_RESAMPLES,
    seed: int = 0,
) -> PairedRow:
    """Compare one conductor's episodes with one baseline's on their common ``(family, task, seed)``.

    A key recorded twice (a resumed run) counts once, its first episode."""
    if not episodes or not baseline_episodes:
        raise ValueError("paired_row: both conductors need episodes")
    mine: dict[tuple[str, str, int], Episode] = {}
    for e in episodes:
        mine.setdefault(_pair_key(e), e)
    base: dict[tuple[str, str, int], Episode] = {}
    for e in baseline_episodes:
        base.setdefault(_pair_key(e), e)
    keys = sorted(mine.keys() & base.keys())

    def cols(eps: list[Episode]) -> np.ndarray:  # (n_pairs, 4): success, return, turns, tokens
        return np.array([[e.success, e.return_, e.worker_turns, e.total_tokens] for e in eps], dtype=np.float64)

    c = cols([mine[k] for k in keys]).reshape(-1, 4)
    b = cols([base[k] for k in keys]).reshape(-1, 4)
    d = c - b  # (n_pairs, 4) per-task differences
    # the same seed resamples the same tasks for every column (see bootstrap_ci)
    cis = [bootstrap_ci(d[:, j], n_resamples=n_resamples, seed=seed) for j in range(4)]
    means = d.mean(axis=0) if len(keys) else np.full(4, math.nan)
    turns_rel, tokens_rel = _rel(c[:, 2], b[:, 2]), _rel(c[:, 3], b[:, 3])
    first = episodes[0]
    return PairedRow(
        family=first.task.family,
        team=first.team.name,
        conductor=first.conductor.name,
        baseline=baseline_episodes[0].conductor.name,
        rule_based=is_rule_based(first.conductor.name),
        n_pairs=len(keys),
        success=float(c[:, 0].mean()) if len(keys) else math.nan,
        baseline_success=float(b[:, 0].mean()) if len(keys) else math.nan,
        success_diff=float(means[0]),
        success_lo=cis[0][0],
        success_hi=cis[0][1],
        return_diff=float(means[1]),
        return_lo=cis[1][0],
        return_hi=cis[1][1],
        turns_diff=float(means[2]),
        turns_lo=cis[2][0],
        turns_hi=cis[2][1],
        tokens_diff=float(means[3]),
        tokens_lo=cis[3][0],
        tokens_hi=cis[3][1],
        turns_rel=turns_rel,
        tokens_rel=tokens_rel,
        verdict=verdict(float(means[0]), cis[0][0], cis[0][1], turns_rel, tokens_rel),
    )


def paired_comparison(
    episodes: Iterable[Episode],
    rows: Sequence[ResultRow] | None = None,
    n_resamples: int = N_RESAMPLES,
    seed: int = 0,
) -> list[PairedRow]:
    """Every conductor (learned first, then the other rule-based ones) against the best rule-based
    conductor of its (family, team). Families without a rule-based conductor get no rows."""
    groups = _group(episodes)
    rows = list(rows) if rows is not None else summarize([e for eps in groups.values() for e in eps], n_resamples, seed)
    out = []
    for (family, team), baseline in best_rule_based(rows).items():
        others = [c for (f, t, c) in groups if (f, t) == (family, team) and c != baseline]
        others.sort(key=lambda c: (is_rule_based(c), c))
        for c in others:
            out.append(paired_row(groups[(family, team, c)], groups[(family, team, baseline)], n_resamples, seed))
    return out


def _pct(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{100 * x:+.0f}%"


def format_paired_table(rows: Sequence[PairedRow]) -> str:
    """Markdown: differences vs the best rule-based conductor, with 95% bootstrap CIs over tasks."""
    head = (
        "| family | conductor | vs | pairs | Δ success (pts) | 95% CI | Δ return | 95% CI "
        "| Δ turns | Δ tokens | turns | tokens | verdict |"
    )
    sep = "|---|---|---|---:|---:|---|---:|---|---:|---:|---:|---:|---|"
    lines = [head, sep]
    for r in rows:
        lines.append(
            f"| {r.family} | {r.conductor} | {r.baseline} | {r.n_pairs} | {100 * r.success_diff:+.1f} "
            f"| [{100 * r.success_lo:+.1f}, {100 * r.success_hi:+.1f}] "
            f"| {r.return_diff:+.3f} | [{r.return_lo:+.3f}, {r.return_hi:+.3f}] "
            f"| {r.turns_diff:+.2f} | {r.tokens_diff:+.1f} | {_pct(r.turns_rel)} | {_pct(r.tokens_rel)} "
            f"| **{r.verdict}** |"
        )
    return "\n".join(lines)


# ----------------------------------------------------------------------------- mode collapse


def sequence_entropy(sequences: Sequence[tuple[str, ...]]) -> tuple[float, int, float, tuple[str, ...]]:
    """Shannon entropy ``H = −Σ_s p(s) log2 p(s)`` (bits) of the empirical distribution of action-label
    sequences, the number of distinct sequences, the share of the most common one and that sequence.

    One sequence → H = 0; k equally frequent ones → H = log2 k. Ties for the most common sequence
    go to the lexicographically smallest, so the report is stable."""
    if not sequences:
        return (0.0, 0, 0.0, ())
    counts = Counter(sequences)
    p = np.array(list(counts.values()), dtype=np.float64) / len(sequences)
    h = float(-(p * np.log2(p)).sum()) + 0.0  # + 0.0 turns -0.0 into 0.0
    top, top_n = min(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return (max(h, 0.0), len(counts), top_n / len(sequences), top)


@dataclass(frozen=True)
class CollapseRow:
    """How varied a conductor's schedules are over its episodes of one (family, team)."""

    family: str
    team: str
    conductor: str
    rule_based: bool
    episodes: int
    distinct: int
    entropy_bits: float
    top_share: float
    top_sequence: str
    collapsed: bool


def mode_collapse(episodes: Iterable[Episode], threshold: float = COLLAPSE_SHARE) -> list[CollapseRow]:
    """Per (family, team, conductor): entropy of the action-label sequences; ``collapsed`` when one
    sequence covers ≥ ``threshold`` of the episodes. A fixed pipeline is collapsed by design; the
    check matters for learned conductors that were meant to adapt to the task."""
    out = []
    for (family, team, conductor), eps in _group(episodes).items():
        seqs = [tuple(s.action.label for s in e.steps) for e in eps]
        h, k, share, top = sequence_entropy(seqs)
        out.append(
            CollapseRow(
                family=family,
                team=team,
                conductor=conductor,
                rule_based=is_rule_based(conductor),
                episodes=len(eps),
                distinct=k,
                entropy_bits=h,
                top_share=share,
                top_sequence=" → ".join(top),
                collapsed=share >= threshold - 1e-12,
            )
        )
    return out


def format_collapse_table(rows: Sequence[CollapseRow]) -> str:
    head = "| family | conductor | kind | n | distinct schedules | entropy (bits) | top share | most common schedule | collapsed |"
    sep = "|---|---|---|---:|---:|---:|---:|---|---|"
    lines = [head, sep]
    for r in rows:
        kind = "rule-based" if r.rule_based else "learned"
        flag = "**yes**" if r.collapsed else "no"
        lines.append(
            f"| {r.family} | {r.conductor} | {kind} | {r.episodes} | {r.distinct} | {r.entropy_bits:.2f} "
            f"| {100 * r.top_share:.0f}% | {r.top_sequence} | {flag} |"
        )
    return "\n".join(lines)


# ----------------------------------------------------------------------------- report files


def _write_csv(path: Path, cls: type, rows: Sequence[Any]) -> None:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=[fl.name for fl in fields(cls)])
        w.writeheader()
        for r in rows:
            w.writerow(asdict(r))


def _markdown(
    title: str, rows: Sequence[ResultRow], paired: Sequence[PairedRow], collapse: Sequence[CollapseRow]
) -> str:
    parts = [
        f"# {title}",
        "Intervals: 95% percentile bootstrap over episodes (fixed seed). "
        "Every conductor played the same tasks with the same seeds.",
        "## Conductors",
        format_table(rows),
        "![success](success.png)\n\n![success vs cost](cost.png)",
    ]
    if paired:
        parts += [
            "## Paired comparison against the best rule-based conductor",
            "Differences are conductor − baseline on the same tasks (task id and seed), CIs by resampling "
            "tasks. Verdict: **beats** if Δ success ≥ +5 points and its CI lower bound > 0; **worse** if the "
            "CI upper bound < 0; **cheaper** if the CI contains 0 and turns or tokens are ≥ 25% lower; "
            "otherwise **no clear difference**.",
            format_paired_table(paired),
        ]
    if collapse:
        parts += [
            "## Mode collapse",
            f"Entropy of the action-sequence distribution over episodes; **collapsed** when one schedule "
            f"covers ≥ {100 * COLLAPSE_SHARE:.0f}% of them (a fixed pipeline is collapsed by design).",
            format_collapse_table(collapse),
        ]
    return "\n\n".join(parts) + "\n"


def write_report(
    rows: Sequence[ResultRow],
    out_dir: Path,
    title: str = "Conductor evaluation",
    paired: Sequence[PairedRow] = (),
    collapse: Sequence[CollapseRow] = (),
) -> dict[str, Path]:
    """Write results.csv, results.md, paired.csv, collapse.csv, success.png and cost.png into
    ``out_dir``; returns their paths (keys csv, md, png, paired_csv, collapse_csv, cost_png)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {
        "csv": out_dir / "results.csv",
        "md": out_dir / "results.md",
        "png": out_dir / "success.png",
        "paired_csv": out_dir / "paired.csv",
        "collapse_csv": out_dir / "collapse.csv",
        "cost_png": out_dir / "cost.png",
    }
    _write_csv(paths["csv"], ResultRow, rows)
    _write_csv(paths["paired_csv"], PairedRow, paired)
    _write_csv(paths["collapse_csv"], CollapseRow, collapse)
    paths["md"].write_text(_markdown(title, rows, paired, collapse), encoding="utf-8")
    plot_success(rows, paths["png"], title)
    plot_cost(rows, paths["cost_png"], title)
    return paths


def evaluation_report(
    episodes: Iterable[Episode],
    out_dir: Path,
    title: str = "Conductor evaluation",
    n_resamples: int = N_RESAMPLES,
    seed: int = 0,
) -> tuple[list[ResultRow], list[PairedRow], dict[str, Path]]:
    """Summary, paired comparison and mode-collapse check of ``episodes``, written into ``out_dir``."""
    eps = list(episodes)
    rows = summarize(eps, n_resamples, seed)
    paired = paired_comparison(eps, rows, n_resamples, seed)
    paths = write_report(rows, Path(out_dir), title, paired, mode_collapse(eps))
    return rows, paired, paths


__all__ = [
    "BEAT_MARGIN",
    "CHEAPER_FRACTION",
    "COLLAPSE_SHARE",
    "N_RESAMPLES",
    "CollapseRow",
    "PairedRow",
    "ResultRow",
    "best_rule_based",
    "bootstrap_ci",
    "evaluation_report",
    "format_collapse_table",
    "format_paired_table",
    "format_table",
    "is_rule_based",
    "mode_collapse",
    "paired_comparison",
    "paired_row",
    "plot_cost",
    "plot_success",
    "sequence_entropy",
    "summarize",
    "verdict",
    "wilson_ci",
    "write_report",
]
