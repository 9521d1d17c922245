"""The freshness experiment's statistics and report: pure functions from the rows of ``pairs.csv`` (one per replicate
pair, :mod:`~orchestra.experiments.freshness.run`) to the per-cell table and ``summary.md``.

A cell is (step size, n). Its unit is the replicate pair: the difference d = J_fresh − J_stale of one pair is exact
(no evaluation noise), so the only randomness is between pairs (team init, batches). Per cell: mean d with a 95%
t interval over pairs (scipy), the one-sample t-test p, Holm-adjusted across the cells (statsmodels), and the
minimum detectable effect: the |mean d| a two-sided t-test at α = 0.05 detects with 80% power given the pairs'
spread (statsmodels ``TTestPower``). The null check applies the same statistics to the difference of the two
independent stale arms, which is 0 in expectation by symmetry: it passes when no cell's Holm-adjusted p is < 0.05.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np

from orchestra.experiments.harness import Sections, Tables, cell, pval

ALPHA = 0.05  # two-sided level of every interval and test
POWER = 0.8  # power at which the minimum detectable effect is stated


def paired_summary(d: Sequence[float]) -> dict[str, float]:
    """Mean, SD, 95% t interval, one-sample t-test p and the minimum detectable effect (80% power, α 0.05) of
    per-pair differences ``d`` (NaN where undefined: fewer than 2 pairs, or all equal for p)."""
    from scipy import stats as sps
    from statsmodels.stats.power import TTestPower

    x = np.asarray(d, dtype=np.float64)
    m = len(x)
    mean = float(x.mean()) if m else math.nan
    if m < 2:
        return dict(mean=mean, sd=math.nan, ci_low=math.nan, ci_high=math.nan, p=math.nan, mde=math.nan)
    sd = float(x.std(ddof=1))
    half = float(sps.t.ppf(1 - ALPHA / 2, m - 1)) * sd / math.sqrt(m)
    p = float(sps.ttest_1samp(x, 0.0).pvalue) if sd > 0 else math.nan
    effect = float(TTestPower().solve_power(effect_size=None, nobs=m, alpha=ALPHA, power=POWER))  # Cohen's d
    return dict(mean=mean, sd=sd, ci_low=mean - half, ci_high=mean + half, p=p, mde=effect * sd)


def holm(ps: Sequence[float]) -> list[float]:
    """Holm-adjusted ``ps`` of one family of tests (statsmodels); a NaN p takes no part and stays NaN."""
    from statsmodels.stats.multitest import multipletests

    finite = [i for i, p in enumerate(ps) if math.isfinite(p)]
    out = [math.nan] * len(ps)
    if finite:
        for i, h in zip(finite, multipletests([ps[i] for i in finite], method="holm")[1], strict=True):
            out[i] = float(h)
    return out


def analyse(rows: Sequence[dict[str, Any]]) -> Tables:
    """``cells``: one row per (step size, n) in the order first seen: pairs, the team's J at start / branch /
    after each arm (means), fresh − stale and the null difference (:func:`paired_summary`, Holm across cells), the
    stale gap (means) and the realised steps (mean KL, share of updates where the trust region acted)."""
    groups: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        groups[r["step"], r["n"]].append(r)
    cells: list[dict[str, Any]] = []
    for (step, n), rs in groups.items():
        rs = sorted(rs, key=lambda r: r["pair"])
        main = paired_summary([r["diff"] for r in rs])
        null = paired_summary([r["null_diff"] for r in rs])
        indep = paired_summary([r["J_fresh"] - r["J_null_a"] for r in rs])  # secondary: S's reuse taken out

        def mean(key: str, rs: list[dict[str, Any]] = rs) -> float:
            return float(np.mean([r[key] for r in rs]))

        cells.append(
            dict(
                step=step,
                lr=rs[0]["lr"],
                delta=rs[0]["delta"],
                num_epochs=rs[0]["num_epochs"],
                batch_size=rs[0]["batch_size"],
                n=n,
                worker=rs[0]["worker"],
                pairs=len(rs),
                J_start=mean("J_start"),
                J_branch=mean("J_branch"),
                J_stale=mean("J_stale"),
                J_fresh=mean("J_fresh"),
                gain_stale=mean("J_stale") - mean("J_branch"),
                gain_fresh=mean("J_fresh") - mean("J_branch"),
                **{f"diff_{k}": v for k, v in main.items()},
                **{f"null_{k}": v for k, v in null.items()},
                **{f"indep_{k}": v for k, v in indep.items()},
                upstream_kl=mean("upstream_kl"),
                upstream_bound_share=float(np.sum([r["upstream_bound"] for r in rs]) / (len(rs) * (n - 1))),
                kl_stale=mean("kl_stale"),
                kl_fresh=mean("kl_fresh"),
                bound_stale_share=mean("bound_stale"),
                bound_fresh_share=mean("bound_fresh"),
                ctx_kl=mean("ctx_kl"),
                ctx_tv=mean("ctx_tv"),
                surrogate_gap=mean("surrogate_gap"),
                rows_changed=mean("rows_changed"),
                adv_gap=mean("adv_gap"),
                seconds=float(np.sum([r["seconds"] for r in rs])),
            )
        )
    for prefix in ("diff", "null", "indep"):
        for c, h in zip(cells, holm([c[f"{prefix}_p"] for c in cells]), strict=True):
            c[f"{prefix}_p_holm"] = h
    return {"cells": cells}


def null_check_passes(cells: Sequence[dict[str, Any]]) -> bool:
    """True iff no cell's null difference is significant after Holm (α = 0.05)."""
    return not any(c["null_p_holm"] < ALPHA for c in cells)


def verdict(c: dict[str, Any]) -> str:
    """One cell's reading, no further than its interval allows."""
    if math.isfinite(c["diff_p_holm"]) and c["diff_p_holm"] < ALPHA:
        return "fresh better" if c["diff_mean"] > 0 else "stale better"
    return f"no difference detected (an effect ≥ {c['diff_mde']:.4f} would be seen with 80% power)"


def _ci(c: dict[str, Any], prefix: str, digits: int = 4) -> str:
    return (
        f"{c[f'{prefix}_mean']:+.{digits}f} [{c[f'{prefix}_ci_low']:+.{digits}f}, {c[f'{prefix}_ci_high']:+.{digits}f}]"
    )


def summary_sections(
    rows: Sequence[dict[str, Any]], tables: Tables, *, seconds: float = math.nan, reused: int = 0
) -> Sections:
    """``summary.md``: what was run, the main table, the null check, the stale gap, the realised steps."""
    cells = tables["cells"]
    wall = float(np.sum([r["seconds"] for r in rows]))
    passes = null_check_passes(cells)
    s: Sections = {}
    s["title"] = [
        "# The paired freshness experiment on the telephone chain",
        "",
        f"{len(rows)} replicate pairs in {len(cells)} cells (step size × n); the pairs' own compute "
        f"{wall:.0f} s"
        + (f", this invocation {seconds:.0f} s" if math.isfinite(seconds) else "")
        + (f", {reused} pairs reused from an earlier invocation" if reused else "")
        + ".",
        "",
        "Per pair: a warm-started chain of n agents; workers 0..n−2 updated in order on one stale batch S (naive); "
        "from the state saved right after worker n−2's update, worker n−1 updated once on S (**stale**) and once "
        "on a batch F sampled from the updated team with S's random numbers (**fresh**), by the trainer's own "
        "update, everything else equal; both scored by the exact team success J. d = J_fresh − J_stale per pair; "
        "mean d with a 95% t interval over pairs, p of the one-sample t-test, Holm across the cells, and the "
        "minimum detectable effect (MDE: 80% power, α = 0.05, two-sided).",
        "",
    ]
    s["settings"] = [
        "## Settings",
        "",
        "| step size | lr | δ | epochs | B | n | pairs | J start | J at branch | upstream KL (Σ) | upstream TR acted |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
        *[
            f"| {c['step']} | {c['lr']:g} | {c['delta']:g} | {c['num_epochs']} | {c['batch_size']} | {c['n']} | "
            f"{c['pairs']} | {cell(c['J_start'])} | {cell(c['J_branch'])} | {cell(c['upstream_kl'], 4)} | "
            f"{c['upstream_bound_share']:.0%} |"
            for c in cells
        ],
        "",
        "upstream KL: the sum over workers 0..n−2 of their realised per-token KL(π_old ‖ π_new) on S (the trust "
        "region's own measure); upstream TR acted: the share of those updates the backtracking shortened or "
        "reverted.",
        "",
    ]
    s["result"] = [
        "## Fresh − stale",
        "",
        "| step size | n | pairs | J stale | J fresh | fresh − stale [95% CI] | SD | p | p (Holm) | MDE | reading |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
        *[
            f"| {c['step']} | {c['n']} | {c['pairs']} | {cell(c['J_stale'], 4)} | {cell(c['J_fresh'], 4)} | "
            f"{_ci(c, 'diff')} | {cell(c['diff_sd'], 4)} | {pval(c['diff_p'])} | {pval(c['diff_p_holm'])} | "
            f"{cell(c['diff_mde'], 4)} | {verdict(c)} |"
            for c in cells
        ],
        "",
        "Gains of the last worker's own step, J after it − J at the branch (means): "
        + "; ".join(
            f"{c['step']} n={c['n']}: stale {c['gain_stale']:+.4f}, fresh {c['gain_fresh']:+.4f}" for c in cells
        )
        + ".",
        "",
    ]
    s["secondary"] = [
        "Secondary (its own Holm family): fresh against a stale batch independent of S (the first null arm's), so "
        "the reuse of the batch the upstream workers were fitted to is taken out; no common random numbers. "
        + "; ".join(f"{c['step']} n={c['n']}: {_ci(c, 'indep')}, p (Holm) {pval(c['indep_p_holm'])}" for c in cells)
        + ".",
        "",
    ]
    s["null"] = [
        "## Null check",
        "",
        "Two stale arms that are the same procedure and differ only in the seed of their batch (each an independent "
        "batch of the stage-start team): their difference is 0 in expectation by symmetry, so the statistics must "
        f"not call it different from 0. **{'Passes' if passes else 'FAILS'}**: "
        + (
            "no cell's Holm-adjusted p is below 0.05."
            if passes
            else "some cell's Holm-adjusted p is below 0.05: the intervals above are not to be trusted."
        ),
        "",
        "| step size | n | pairs | stale₂ − stale₁ [95% CI] | SD | p | p (Holm) | SD of fresh − stale |",
        "|---|---|---|---|---|---|---|---|",
        *[
            f"| {c['step']} | {c['n']} | {c['pairs']} | {_ci(c, 'null')} | {cell(c['null_sd'], 4)} | "
            f"{pval(c['null_p'])} | {pval(c['null_p_holm'])} | {cell(c['diff_sd'], 4)} |"
            for c in cells
        ],
        "",
        "The null arms have no common random numbers; the last column shows how much smaller the spread of the "
        "CRN-paired fresh − stale difference is.",
        "",
    ]
    s["gap"] = [
        "## The stale gap (last worker)",
        "",
        "| step size | n | context KL | context TV | exact stale gap of its step | episodes whose context changed "
        "| mean abs(Â_S − Â_F) | its step KL, stale / fresh | TR acted, stale / fresh |",
        "|---|---|---|---|---|---|---|---|---|",
        *[
            f"| {c['step']} | {c['n']} | {cell(c['ctx_kl'], 5)} | {cell(c['ctx_tv'], 4)} | "
            f"{cell(c['surrogate_gap'], 5)} | {c['rows_changed']:.1%} | {cell(c['adv_gap'], 4)} | "
            f"{cell(c['kl_stale'], 4)} / {cell(c['kl_fresh'], 4)} | "
            f"{c['bound_stale_share']:.0%} / {c['bound_fresh_share']:.0%} |"
            for c in cells
        ],
        "",
        "context KL / TV: exact, between the last worker's (key, input) occupancy in the stage-start team (what S "
        "samples) and in the updated team (what F samples), KL(d_start ‖ d_branch). Exact stale gap: "
        "|L_start − L_branch| of the stale arm's own change, L its exact first-order surrogate in each team. "
        "Episodes whose context changed and mean abs(Â_S − Â_F): on the CRN-matched batches, episode by episode "
        "(GRPO advantages of the team return). The last worker's exact advantage function A(key, x, y) depends on "
        "its own and the downstream policies only, which the upstream updates leave unchanged: on the chain the "
        "whole stale gap is a shift of its contexts (and of the GRPO group baselines).",
        "",
    ]
    s["not_shown"] = [
        "## What it does not show",
        "",
        "- **One update, not a run.** Each pair measures one step of one worker. A one-step difference neither "
        "bounds nor predicts what freshness does over many stages, where gaps and gains compound, and it says "
        "nothing of TeamTR's price (n batches per stage instead of one): the chain experiment reads the schemes at "
        "equal episodes for that.",
        "- **The branch state is naive's.** The upstream workers were all updated on S, as naive does; TeamTR's own "
        "upstream workers would have trained on fresh batches. The stale arm also reuses the batch those upstream "
        "updates were fitted to, so fresh − stale mixes the context shift with that reuse; the null arms use "
        "batches independent of S.",
        "- **The chain only, one regime.** A warm-started chain (per-hop pass 0.85) with one-token messages, where "
        "the gap is a pure context shift; nothing here transfers to LLM workers, whose advantages and contexts "
        "also shift (the LLM-team version, `orchestra experiment freshness-llm`, has no result yet). Other "
        "starting points (far from the optimum, after training) are not sampled.",
        "- **Two step sizes, fixed in advance.** A no-difference reading holds for these step sizes and this batch "
        "size only, and only down to its MDE: it is not evidence that freshness never matters.",
        "",
    ]
    s["reproduce"] = [
        "## Reproduce",
        "",
        "```bash",
        "orchestra experiment freshness --out runs/freshness --report docs/results/freshness.md",
        "# the report alone, from the committed rows:",
        "orchestra experiment freshness --from-csv docs/results/freshness_chain.csv --report docs/results/freshness.md",
        "```",
        "",
    ]
    return s


__all__ = ["ALPHA", "POWER", "analyse", "holm", "null_check_passes", "paired_summary", "summary_sections", "verdict"]
