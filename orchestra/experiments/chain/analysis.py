"""Analysis of the telephone-chain experiment: pure functions from the ``runs.csv`` rows to the tables (final J under
both accountings, regressions, drift, fitted exponents α, trust-region accounting) and the acceptance checks.

Accounting (docs/telephone-chain.md §2):

* equal stages: every scheme read at stage ``num_stages``;
* equal sampled episodes: the non-teamtr schemes run ``n × num_stages`` stages (``extend_for_episodes``), and each
  (n, scheme, seed) run is read at the FIRST stage whose cumulative episodes reach teamtr's final count at the same
  (n, seed); if none does, the stage whose count is nearest (:func:`equal_episode_stage`).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np

from orchestra.experiments.chain.config import ChainExperimentConfig
from orchestra.experiments.verdicts import seed_tables

REGRESSION_THRESHOLDS = (0.01, 0.001)  # a stage "regresses" when exact J falls by more than this


def fit_alpha(ns: Sequence[float], drifts: Sequence[float]) -> float:
    """α = OLS slope of log drift vs log n. Points with a non-positive or non-finite drift are dropped; NaN if fewer
    than two distinct n remain."""
    x = np.asarray(ns, dtype=np.float64)
    y = np.asarray(drifts, dtype=np.float64)
    keep = np.isfinite(y) & (y > 0) & (x > 0)
    x, y = np.log(x[keep]), np.log(y[keep])
    if len(np.unique(x)) < 2:
        return math.nan
    return float(np.polyfit(x, y, 1)[0])


def drift_terms(scheme: str, n: int) -> int:
    """How many one-update shifts drift (b) sums over a stage of n sequential updates in a fixed order: teamtr n − 1
    (each fresh batch is one update behind; agent 0's input never moves), every stale scheme n(n − 1)/2 (update m's
    batch is m updates behind). The drift gap between the two is built into this count; α against it asks whether
    each shift is larger, too."""
    return n - 1 if scheme == "teamtr" else n * (n - 1) // 2


def certificate_table(rows: Sequence[dict[str, Any]], schemes: Sequence[str]) -> list[dict[str, Any]]:
    """Per scheme, over every (run, stage ≥ 1): the certificate proxy Ĉ_s against the realised exact ΔJ_s =
    J_s − J_{s−1} — Spearman and Pearson correlation (scipy) and the share of stages where Ĉ_s ≤ ΔJ_s (the bound's
    direction, docs/algorithms.md §2.3)."""
    from scipy import stats as sps

    out: list[dict[str, Any]] = []
    curves = run_curves(rows)
    for scheme in schemes:
        c_hat: list[float] = []
        d_j: list[float] = []
        for (_, sch, _), curve in curves.items():
            if sch != scheme:
                continue
            for prev, cur in zip(curve, curve[1:], strict=False):
                cert = cur.get("certificate", math.nan)
                if math.isfinite(cert):
                    c_hat.append(cert)
                    d_j.append(cur["J"] - prev["J"])
        x, y = np.asarray(c_hat), np.asarray(d_j)
        enough = len(x) >= 3 and np.ptp(x) > 0 and np.ptp(y) > 0
        out.append(
            dict(
                scheme=scheme,
                stages=len(x),
                spearman=float(sps.spearmanr(x, y).statistic) if enough else math.nan,
                pearson=float(sps.pearsonr(x, y).statistic) if enough else math.nan,
                below=float(np.mean(x <= y)) if len(x) else math.nan,
                certificate_mean=float(x.mean()) if len(x) else math.nan,
                delta_j_mean=float(y.mean()) if len(y) else math.nan,
            )
        )
    return out


def paired_tests(picks: dict[str, dict[str, dict[int, float]]], n: int) -> list[dict[str, Any]]:
    """At chain length ``n``, per accounting: teamtr − each other scheme, paired over seeds (``picks``: accounting →
    scheme → seed → the J that run is read at, as in the ``final`` table): mean, SE, paired t-test p (scipy) and
    Holm-adjusted p across the other schemes (statsmodels)."""
    from scipy import stats as sps
    from statsmodels.stats.multitest import multipletests

    out: list[dict[str, Any]] = []
    for accounting, picked in picks.items():
        if not picked.get("teamtr"):
            continue
        others = [sc for sc in picked if sc != "teamtr" and picked[sc]]
        rows_acc: list[dict[str, Any]] = []
        for other in others:
            seeds = sorted(set(picked["teamtr"]) & set(picked[other]))
            d = np.asarray([picked["teamtr"][s] - picked[other][s] for s in seeds])
            p = (
                float(sps.ttest_rel([picked["teamtr"][s] for s in seeds], [picked[other][s] for s in seeds]).pvalue)
                if len(d) > 1 and d.std() > 0
                else math.nan
            )
            rows_acc.append(
                dict(
                    accounting=accounting,
                    n=n,
                    vs=other,
                    seeds=len(d),
                    diff_mean=float(d.mean()),
                    diff_se=float(d.std(ddof=1) / math.sqrt(len(d))) if len(d) > 1 else math.nan,
                    p=p,
                )
            )
        finite = [r for r in rows_acc if math.isfinite(r["p"])]
        adjusted = multipletests([r["p"] for r in finite], method="holm")[1] if finite else []
        for r, h in zip(finite, adjusted, strict=True):
            r["p_holm"] = float(h)
        for r in rows_acc:
            r.setdefault("p_holm", math.nan)
        out += rows_acc
    return out


def equal_episode_stage(episodes: Sequence[float], target: float) -> int:
    """Index of the first stage whose cumulative episodes reach ``target``; if none does, the nearest one (ties: the
    earliest). ``episodes`` is non-decreasing, one entry per stage (index 0 = before training)."""
    eps = np.asarray(episodes, dtype=np.float64)
    if eps.size == 0:
        raise ValueError("need at least one stage")
    reached = np.flatnonzero(eps >= target)
    return int(reached[0]) if reached.size else int(np.argmin(np.abs(eps - target)))


def regression_fraction(success: Sequence[float], threshold: float) -> float:
    """Fraction of stages where the exact J fell by more than ``threshold``: #{s ≥ 1: J_s < J_{s−1} − thr} / S.
    ``success`` holds J before training (index 0) and after each of the S stages."""
    j = np.asarray(success, dtype=np.float64)
    if j.size < 2:
        return math.nan
    return float(np.mean(np.diff(j) < -threshold))


def _mean_sd(values: Sequence[float]) -> tuple[float, float]:
    v = np.asarray([x for x in values if math.isfinite(x)], dtype=np.float64)
    if v.size == 0:
        return math.nan, math.nan
    return float(v.mean()), float(v.std(ddof=1)) if v.size > 1 else 0.0


Key = tuple[int, str, int]  # (n, scheme, seed)


def run_curves(rows: Sequence[dict[str, Any]]) -> dict[Key, list[dict[str, Any]]]:
    runs: dict[Key, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        runs[(r["n"], r["scheme"], r["seed"])].append(r)
    for v in runs.values():
        v.sort(key=lambda r: r["stage"])
    return runs


def analyse(cfg: ChainExperimentConfig, rows: Sequence[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Tables from the ``runs.csv`` rows: ``final`` (both accountings), ``regressions``, ``drift``, ``alpha``, ``trust``,
    ``certificate``, ``paired`` and the verdicts over seeds at the largest n (``seed_iqm``, ``seed_verdicts``,
    ``null_check``: :func:`~orchestra.experiments.verdicts.seed_tables`)."""
    runs = run_curves(rows)
    seeds = range(cfg.seeds)
    final: list[dict[str, Any]] = []
    regressions: list[dict[str, Any]] = []
    drift: list[dict[str, Any]] = []
    picks: dict[str, dict[str, dict[int, float]]] = {}  # at the largest n: accounting → scheme → seed → J read
    for accounting in ("equal_stages", "equal_episodes"):
        if accounting == "equal_episodes" and "teamtr" not in cfg.schemes:
            continue
        for n in cfg.ns:
            picked: dict[str, dict[int, dict[str, Any]]] = {}
            for scheme in cfg.schemes:
                picked[scheme] = {}
                for s in seeds:
                    curve = runs.get((n, scheme, s))
                    if not curve:
                        continue
                    if accounting == "equal_stages":
                        idx = min(cfg.num_stages, len(curve) - 1)
                    else:
                        ref = runs.get((n, "teamtr", s))
                        if not ref:
                            continue
                        target = ref[min(cfg.num_stages, len(ref) - 1)]["episodes"]
                        idx = equal_episode_stage([r["episodes"] for r in curve], target)
                    picked[scheme][s] = curve[idx]
            if n == max(cfg.ns):
                picks[accounting] = {sc: {s: r["J"] for s, r in got.items()} for sc, got in picked.items()}
            for scheme in cfg.schemes:
                got = picked[scheme]
                j_mean, j_sd = _mean_sd([r["J"] for r in got.values()])
                diffs = [got[s]["J"] - picked["teamtr"][s]["J"] for s in got if s in picked.get("teamtr", {})]
                d_mean, d_sd = _mean_sd(diffs)
                final.append(
                    dict(
                        accounting=accounting,
                        n=n,
                        scheme=scheme,
                        seeds=len(got),
                        stage_mean=_mean_sd([r["stage"] for r in got.values()])[0],
                        episodes_mean=_mean_sd([r["episodes"] for r in got.values()])[0],
                        J_mean=j_mean,
                        J_sd=j_sd,
                        diff_vs_teamtr_mean=d_mean,
                        diff_vs_teamtr_se=d_sd / math.sqrt(len(diffs)) if len(diffs) > 1 else math.nan,
                    )
                )
    for n in cfg.ns:
        for scheme in cfg.schemes:
            curves = [runs[(n, scheme, s)][: cfg.num_stages + 1] for s in seeds if (n, scheme, s) in runs]
            reg = {
                f"regress_{thr:g}": _mean_sd([regression_fraction([r["J"] for r in c], thr) for c in curves])[0]
                for thr in REGRESSION_THRESHOLDS
            }
            regressions.append(dict(n=n, scheme=scheme, seeds=len(curves), **reg))
            per_run = {
                kind: [
                    float(np.nanmean([r.get(kind, math.nan) for r in c[1 : cfg.drift_stages + 1]]))
                    for c in curves
                    if len(c) > 1
                ]
                for kind in ("drift_b", "drift_d", "stale_gap")
            }
            b_mean, b_sd = _mean_sd(per_run["drift_b"])
            d_mean, d_sd = _mean_sd(per_run["drift_d"])
            g_mean, g_sd = _mean_sd(per_run["stale_gap"])
            drift.append(
                dict(
                    n=n,
                    scheme=scheme,
                    drift_b=b_mean,
                    drift_b_sd=b_sd,
                    drift_d=d_mean,
                    drift_d_sd=d_sd,
                    stale_gap=g_mean,
                    stale_gap_sd=g_sd,
                )
            )
    alpha: list[dict[str, Any]] = []
    n_max = max(cfg.ns)
    by = {(r["n"], r["scheme"]): r for r in drift}
    big = [n for n in cfg.ns if n > 2]
    for scheme in cfg.schemes:
        row: dict[str, Any] = {"scheme": scheme}
        for kind in ("drift_b", "drift_d"):
            row[f"alpha_{kind[-1]}"] = fit_alpha(cfg.ns, [by[(n, scheme)][kind] for n in cfg.ns])
            row[f"alpha_{kind[-1]}_without_n2"] = fit_alpha(big, [by[(n, scheme)][kind] for n in big])
            num, den = by[(n_max, scheme)][kind], by.get((n_max, "teamtr"), {}).get(kind, math.nan)
            row[f"ratio_{kind[-1]}_vs_teamtr_at_n{n_max}"] = num / den if den and math.isfinite(den) else math.nan
        # (b) per summed shift: the slope against the number of terms, and the per-term drift at the largest n
        with_terms = [n for n in cfg.ns if drift_terms(scheme, n) > 0]
        row["alpha_b_vs_terms"] = fit_alpha(
            [drift_terms(scheme, n) for n in with_terms], [by[(n, scheme)]["drift_b"] for n in with_terms]
        )
        terms = drift_terms(scheme, n_max)
        row[f"per_term_b_at_n{n_max}"] = by[(n_max, scheme)]["drift_b"] / terms if terms else math.nan
        alpha.append(row)
    key = f"per_term_b_at_n{n_max}"
    den = next((r[key] for r in alpha if r["scheme"] == "teamtr"), math.nan)
    for row in alpha:
        row[f"per_term_ratio_vs_teamtr_at_n{n_max}"] = row[key] / den if den and math.isfinite(den) else math.nan
    trust: list[dict[str, Any]] = []
    for scheme in cfg.schemes:
        sel = [r for r in rows if r["scheme"] == scheme and r["stage"] > 0]
        tot = {k: sum(r[k] for r in sel) for k in ("agent_updates", "steps", "accepted", "bound", "kl_over")}
        ratios = [r["kl_max_ratio"] for r in sel if r["accepted"] and math.isfinite(r["kl_max_ratio"])]
        trust.append(dict(scheme=scheme, **tot, kl_max_ratio=max(ratios, default=math.nan)))
    tables = {
        "final": final,
        "regressions": regressions,
        "drift": drift,
        "alpha": alpha,
        "trust": trust,
        "certificate": certificate_table(rows, cfg.schemes),
        "paired": paired_tests(picks, max(cfg.ns)),
        **seed_tables(picks),  # the verdicts over seeds, at the largest n (orchestra/experiments/verdicts.py)
    }
    tables["checks"] = acceptance_checks(cfg, tables)
    return tables


def acceptance_checks(cfg: ChainExperimentConfig, tables: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The acceptance criteria of the experiment (docs/telephone-chain.md §5) evaluated on these tables: one row per criterion with the measured value and
    whether it holds ("n/a" when this config cannot decide it, e.g. a scheme or an n was not run)."""
    checks: list[dict[str, Any]] = []

    def add(criterion: str, value: float | None, ok: bool | None, need: str) -> None:
        shown = "n/a" if value is None or not math.isfinite(value) else f"{value:.3f}"
        checks.append(dict(criterion=criterion, need=need, value=shown, ok="n/a" if ok is None else str(ok)))

    for r in tables["trust"]:
        acc = r["accepted"]
        add(
            f"{r['scheme']}: accepted updates with KL ≤ δ",
            1 - r["kl_over"] / acc if acc else None,
            r["kl_over"] == 0 if acc else None,
            "= 1",
        )
        bound = r["bound"] / r["agent_updates"] if r["agent_updates"] else None
        add(
            f"{r['scheme']}: fraction of updates where the trust region bound",
            bound,
            bound > 0 if bound is not None else None,
            "> 0",
        )
    alpha = {r["scheme"]: r for r in tables["alpha"]}
    n_max = max(cfg.ns)
    if "teamtr" in alpha and "naive" in alpha:
        a_n, a_t = alpha["naive"]["alpha_b"], alpha["teamtr"]["alpha_b"]
        ratio = alpha["naive"][f"ratio_b_vs_teamtr_at_n{n_max}"]
        # the drift criteria need: fixed order, ≥ 8 seeds, a warm-started (reliable, pass ≥ 0.8) chain, and
        # enough chain lengths to fit α (docs/telephone-chain.md §1: the claim needs reliable agents)
        drift_ok = (
            cfg.seeds >= 8
            and cfg.trainer.order == "fixed"
            and min(map(cfg.warm_pass_for, cfg.ns)) >= 0.8
            and len(set(cfg.ns)) >= 3
        )

        def decide(ok: bool) -> bool | None:
            return ok if drift_ok else None

        add("α (b) naive", a_n, decide(a_n >= 1.6), "≥ 1.6 (†)")
        add("α (b) teamtr", a_t, decide(a_t <= 1.5), "≤ 1.5 (†)")
        add("α (b) gap naive − teamtr", a_n - a_t, decide(a_n - a_t >= 0.5), "≥ 0.5 (†)")
        add(
            f"drift (b) naive / teamtr at n = {n_max}",
            ratio,
            decide(ratio >= 2.0) if n_max == 8 else None,
            "≥ 2 at n = 8 (†)",
        )
        a_d = alpha["teamtr"]["alpha_d"]
        add("α (d) teamtr (own-step measure)", a_d, decide(0.8 <= a_d <= 1.2), "∈ [0.8, 1.2] (†)")
    final = {(r["n"], r["scheme"]): r for r in tables["final"] if r["accounting"] == "equal_stages"}
    delta = cfg.trainer.delta
    largest_delta = max(delta) if isinstance(delta, tuple) else delta
    success_ok = largest_delta <= 0.03 and cfg.seeds >= 12  # the success criteria need δ ≤ 0.03 and ≥ 12 seeds
    for scheme, bar in (("naive", 0.0), ("joint", -0.03)):
        got = final.get((8, scheme))
        if got is not None:
            d = -got["diff_vs_teamtr_mean"]
            add(
                f"n = 8, equal stages: mean J(teamtr) − J({scheme})",
                d,
                d >= bar if success_ok else None,
                f"≥ {bar:g} (δ ≤ 0.03, ≥ 12 seeds)",
            )
    got = final.get((4, "teamtr"))
    if got is not None:
        add(
            "n = 4, equal stages: mean J(teamtr)",
            got["J_mean"],
            got["J_mean"] >= 0.98 if success_ok else None,
            "≥ 0.98 (≥ 12 seeds)",
        )
    return checks


__all__ = [
    "REGRESSION_THRESHOLDS",
    "acceptance_checks",
    "analyse",
    "certificate_table",
    "paired_tests",
    "drift_terms",
    "run_curves",
    "equal_episode_stage",
    "fit_alpha",
    "regression_fraction",
]
