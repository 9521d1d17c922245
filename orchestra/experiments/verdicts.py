"""Verdicts over seeds, the section both phase-2 reports share (issue 34 item 4; the statistics:
:mod:`orchestra.report.seeds`).

A run is the unit. Each experiment hands over its readings, ``accounting → configuration → seed → score`` (the chain:
exact J at the largest n; the LLM team: held-out success of each run), and gets three tables and one section:

* ``seed_iqm``: per (accounting, configuration) the mean and the IQM over seeds with a 95% stratified bootstrap
  interval;
* ``seed_verdicts``: teamtr − every other configuration, paired over seeds (t interval and paired t-test p), with the
  minimum detectable effect. The PRIMARY family is declared before the data: teamtr − naive and teamtr − stale_indep
  at every accounting the report reads, Holm-corrected as one family (a comparison whose two readings are those of
  one already in the family is the same test and counts once). Every other row is SECONDARY: its p is uncorrected
  and the table says so;
* ``null_check``: the same procedure on two configurations that are the same algorithm, on disjoint seeds: naive
  against joint_indep when both ran (docs/telephone-chain.md: naive ≡ joint_indep), else one scheme's seeds split in
  two halves, at every accounting, Holm over them. When it FAILS the verdicts are refused: the table prints
  "refused" and the section says why.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from orchestra.experiments.harness import Row, Tables, maybe_float, pval, read_rows
from orchestra.report.findings import Cite, Finding
from orchestra.report.seeds import SeedValues, holm, iqm_interval, null_check, paired_seeds
from orchestra.report.stats import ALPHA

REFERENCE = "teamtr"  # every verdict row is teamtr − another configuration
PRIMARY: tuple[tuple[str, str], ...] = (("teamtr", "naive"), ("teamtr", "stale_indep"))  # the declared family
NULL_PAIRS: tuple[tuple[str, str], ...] = (("naive", "joint_indep"),)  # the same algorithm under two names
SPLIT_PREFERENCE = ("naive", "joint_indep", "stale_indep", "teamtr")  # whose seeds are halved when no null pair ran
MIN_PSEUDO_PAIRS = 2  # a null check needs at least this many pseudo-pairs (4 seeds of one scheme)

Readings = Mapping[str, Mapping[str, SeedValues]]  # accounting → configuration → seed → score

# the columns of the three tables as written (``{name}.csv``), for reading a committed run back
_STAT = {k: maybe_float for k in ("diff", "lo", "hi", "sd", "mde", "p", "p_holm")}
COLUMNS: dict[str, dict[str, Callable[[str], Any]]] = {
    "seed_iqm": dict(
        accounting=str, configuration=str, seeds=int, mean=maybe_float, iqm=maybe_float, lo=maybe_float, hi=maybe_float
    ),
    "seed_verdicts": dict(
        accounting=str, family=str, scheme=str, vs=str, seeds=int, **_STAT, same_as=str, per_seed=str, verdict=str
    ),
    "null_check": dict(
        accounting=str, a=str, b=str, seeds_a=str, seeds_b=str, pairs=int, **_STAT, same_as=str, passes=str
    ),
}


def read_seed_tables(run_dir: Path) -> Tables:
    """The three tables of :func:`seed_tables` as a run directory holds them (``seed_iqm.csv`` …)."""
    return {name: read_rows(run_dir / f"{name}.csv", cols) for name, cols in COLUMNS.items()}


def _key(a: SeedValues, b: SeedValues) -> tuple[tuple[int, float, float], ...]:
    return tuple((s, a[s], b[s]) for s in sorted(set(a) & set(b)))


def null_pair(readings: Readings) -> tuple[str, str]:
    """The configurations of the null check: a :data:`NULL_PAIRS` pair both of which ran at every accounting, else
    the first of :data:`SPLIT_PREFERENCE` (then any configuration) with enough seeds, twice (its seeds halved)."""
    present = [set(by) for by in readings.values()]
    for a, b in NULL_PAIRS:
        if present and all({a, b} <= p for p in present):
            return a, b
    names = [c for by in readings.values() for c in by]
    order = [c for c in SPLIT_PREFERENCE if c in names] + [c for c in names if c not in SPLIT_PREFERENCE]
    for c in order:
        if all(len(by.get(c, {})) >= 2 * MIN_PSEUDO_PAIRS for by in readings.values()):
            return c, c
    return (order[0], order[0]) if order else ("", "")


def seed_tables(readings: Readings, alpha: float = ALPHA) -> Tables:
    """``seed_iqm``, ``seed_verdicts`` and ``null_check`` (module docstring) from the readings."""
    iqm_rows: list[Row] = []
    for accounting, by in readings.items():
        for config, values in by.items():
            scores = [values[s] for s in sorted(values)]
            ci = iqm_interval(scores, alpha=alpha)
            iqm_rows.append(
                dict(
                    accounting=accounting,
                    configuration=config,
                    seeds=len(scores),
                    mean=float(sum(scores) / len(scores)) if scores else math.nan,
                    iqm=ci.point,
                    lo=ci.lo,
                    hi=ci.hi,
                )
            )

    null_rows: list[Row] = []
    a_name, b_name = null_pair(readings)
    seen_null: dict[tuple[Any, ...], Row] = {}
    for accounting, by in readings.items():
        if a_name not in by or b_name not in by:
            continue
        check = null_check(by[a_name], by[b_name], alpha)
        res = check.result
        row = dict(
            accounting=accounting,
            a=a_name,
            b=b_name,
            seeds_a=" ".join(map(str, check.seeds_a)),
            seeds_b=" ".join(map(str, check.seeds_b)),
            pairs=len(res.diffs),
            diff=res.diff,
            lo=res.lo,
            hi=res.hi,
            sd=res.sd,
            mde=res.mde,
            p=res.p if len(res.diffs) >= MIN_PSEUDO_PAIRS else math.nan,
            same_as="",
        )
        key = (tuple(check.seeds_a), tuple(check.seeds_b), res.diffs)
        if key in seen_null:
            row["same_as"] = seen_null[key]["accounting"]
        else:
            seen_null[key] = row
        null_rows.append(row)
    counted = [r for r in null_rows if not r["same_as"]]
    for r, h in zip(counted, holm([r["p"] for r in counted], alpha), strict=True):
        r["p_holm"] = h
    for r in null_rows:
        if r["same_as"]:
            r["p_holm"] = next(c["p_holm"] for c in counted if c["accounting"] == r["same_as"])
        r["passes"] = "n/a" if math.isnan(r["p_holm"]) else str(bool(r["p_holm"] >= alpha))
    refused = null_status(null_rows) == "FAILS"

    verdict_rows: list[Row] = []
    seen: dict[tuple[Any, ...], Row] = {}
    for accounting, by in readings.items():
        if REFERENCE not in by:
            continue
        for other in by:
            if other == REFERENCE:
                continue
            d = paired_seeds(by[REFERENCE], by[other], alpha)
            primary = (REFERENCE, other) in PRIMARY
            row = dict(
                accounting=accounting,
                family="primary" if primary else "secondary",
                scheme=REFERENCE,
                vs=other,
                seeds=len(d.seeds),
                diff=d.diff,
                lo=d.lo,
                hi=d.hi,
                sd=d.sd,
                mde=d.mde,
                p=d.p,
                p_holm=math.nan,
                same_as="",
                per_seed=" ".join(f"{v:+.4f}" for v in d.diffs),
            )
            if primary:
                vkey = (other, _key(by[REFERENCE], by[other]))
                if vkey in seen:
                    row["same_as"] = seen[vkey]["accounting"]
                else:
                    seen[vkey] = row
            verdict_rows.append(row)
    family = [r for r in verdict_rows if r["family"] == "primary" and not r["same_as"]]
    for r, h in zip(family, holm([r["p"] for r in family], alpha), strict=True):
        r["p_holm"] = h
    for r in verdict_rows:
        if r["same_as"]:
            r["p_holm"] = next(f["p_holm"] for f in family if f["accounting"] == r["same_as"] and f["vs"] == r["vs"])
        r["verdict"] = _verdict(r, alpha, refused)
    return dict(seed_iqm=iqm_rows, seed_verdicts=verdict_rows, null_check=null_rows)


def _verdict(r: Row, alpha: float, refused: bool) -> str:
    if refused:
        return "refused"
    p = r["p_holm"] if r["family"] == "primary" else r["p"]
    if math.isnan(p):
        return "not testable"
    if p < alpha:
        return f"{r['scheme']} better" if r["diff"] > 0 else f"{r['scheme']} worse"
    return "no difference shown"


def null_status(rows: Sequence[Row]) -> str:
    """``passes`` (every runnable check passes), ``FAILS`` (one does not) or ``not run`` (none could be run)."""
    got = [r["passes"] for r in rows if r["passes"] != "n/a"]
    if not got:
        return "not run"
    return "passes" if all(v == "True" for v in got) else "FAILS"


def verdict_section(
    tables: Tables,
    fmt: Callable[[float], str],
    what: str,
    accounting_text: Callable[[str], str],
    level: Callable[[float], str] | None = None,
) -> list[str]:
    """The report's section "Verdicts over seeds" (null check, primary family, secondary comparisons, MDE, IQM).
    ``fmt`` writes a difference, ``level`` a score (default ``fmt``); ``what`` says what one run's score is;
    ``accounting_text`` names an accounting."""
    level = level or fmt
    nulls, rows, iqms = tables["null_check"], tables["seed_verdicts"], tables["seed_iqm"]
    status = null_status(nulls)
    lines = [
        "## Verdicts over seeds",
        "",
        f"A run is the unit: one score per (configuration, seed), {what}. Same seed = same initial team and trainer "
        "seed, so scheme comparisons are paired over seeds: Δ = mean of the per-seed differences, 95% t interval over "
        "seeds (per comparison, not adjusted for the family) and paired t-test p (scipy); MDE = the smallest true Δ that test detects with 80% power at α = 0.05 "
        "from the observed SD of the differences (statsmodels' TTestPower): a Δ inside ±MDE that the test misses is "
        "neither shown nor ruled out. Task-level figures elsewhere in this report are descriptive only.",
        "",
    ]
    if nulls:
        a, b = nulls[0]["a"], nulls[0]["b"]
        same = "one scheme run twice: its seeds split in two disjoint halves" if a == b else "the same algorithm"
        lines += [
            f"**Null check: {status}.** {a} against {b} ({same}), on disjoint seeds matched in order into "
            "pseudo-pairs, tested by the same procedure (Holm over the accountings). A procedure that calls them "
            "different is wrong and may not be used.",
            "",
            "| accounting | seeds of the first | seeds of the second | pairs | Δ | 95% CI | p | p (Holm) | MDE | passes |",
            "|---|---|---|---:|---:|---|---:|---:|---:|---|",
            *(
                f"| {accounting_text(r['accounting'])} | {r['seeds_a']} | {r['seeds_b']} | {r['pairs']} | "
                f"{fmt(r['diff'])} | [{fmt(r['lo'])}, {fmt(r['hi'])}] | {pval(r['p'])} | {pval(r['p_holm'])} | "
                f"{fmt(r['mde']).lstrip('+')} | {r['passes']}"
                + (f" (same reading as {accounting_text(r['same_as'])})" if r["same_as"] else "")
                + " |"
                for r in nulls
            ),
            "",
        ]
    else:
        lines += ["**Null check: not run** (no configuration with seeds to compare).", ""]
    if status == "FAILS":
        lines += [
            "**Verdicts refused: the null check FAILS.** The procedure calls two runs of the same algorithm "
            "different, so no verdict is drawn from it; the figures below are descriptive.",
            "",
        ]
    elif status == "not run":
        lines += [
            f"No null check at this seed count (it needs {2 * MIN_PSEUDO_PAIRS} seeds of one scheme, or naive and "
            "joint_indep): the verdicts below are unchecked.",
            "",
        ]

    def table(sub: Sequence[Row], p_label: str) -> list[str]:
        out = [
            f"| accounting | comparison | seeds | Δ | 95% CI | MDE | {p_label} | verdict | per seed |",
            "|---|---|---:|---:|---|---:|---|---|---|",
        ]
        for r in sub:
            p = (
                f"{pval(r['p'])} ({pval(r['p_holm'])})"
                + (f", same reading as {accounting_text(r['same_as'])}" if r["same_as"] else "")
                if r["family"] == "primary"
                else pval(r["p"])
            )
            per_seed = " ".join(fmt(float(v)) for v in r["per_seed"].split())
            out.append(
                f"| {accounting_text(r['accounting'])} | {r['scheme']} − {r['vs']} | {r['seeds']} | {fmt(r['diff'])} | "
                f"[{fmt(r['lo'])}, {fmt(r['hi'])}] | {fmt(r['mde']).lstrip('+')} | {p} | {r['verdict']} | {per_seed} |"
            )
        return out + [""]

    primary = [r for r in rows if r["family"] == "primary"]
    secondary = [r for r in rows if r["family"] == "secondary"]
    if primary:
        lines += [
            "**Primary family** (declared before the data: "
            + ", ".join(f"{x} − {y}" for x, y in PRIMARY)
            + f", at every accounting read; Holm over the {sum(not r['same_as'] for r in primary)} distinct tests):",
            "",
            *table(primary, "p (Holm)"),
        ]
    else:
        lines += ["**Primary family**: not in this run (it needs teamtr with naive or stale_indep).", ""]
    if secondary:
        lines += [
            "**Secondary comparisons** (exploratory: p uncorrected, no family-wise guarantee):",
            "",
            *table(secondary, "p (uncorrected)"),
        ]
    lines += [
        "Per configuration: mean and IQM over seeds (interquartile mean: the 25% trimmed mean; the mean below 4 seeds), "
        "with a 95% stratified bootstrap interval over runs (Agarwal et al. 2021; 2000 resamples):",
        "",
        "| accounting | configuration | seeds | mean | IQM | 95% CI |",
        "|---|---|---:|---:|---:|---|",
        *(
            f"| {accounting_text(r['accounting'])} | {r['configuration']} | {r['seeds']} | {level(r['mean'])} | "
            f"{level(r['iqm'])} | [{level(r['lo'])}, {level(r['hi'])}] |"
            for r in iqms
        ),
        "",
    ]
    return lines


def interval_rows(
    tables: Tables, accounting_text: Callable[[str], str], prefix: str = ""
) -> list[tuple[str, float, float, float, bool, str]]:
    """The rows of :func:`orchestra.report.plots.plot_intervals` for the verdicts (a repeated reading once)."""
    return [
        (
            f"{prefix}{accounting_text(r['accounting'])}: {r['scheme']} − {r['vs']}",
            r["diff"],
            r["lo"],
            r["hi"],
            r["family"] == "primary",
            r["vs"],
        )
        for r in tables["seed_verdicts"]
        if not r["same_as"]
    ]


def verdict_findings(
    tables: Tables, fmt: Callable[[float], str], accounting_text: Callable[[str], str], prefix: str = ""
) -> list[Finding]:
    """The findings the verdict section supports, each number cited from its tables (:func:`verdict_section` prints
    them with the same ``fmt`` and ``accounting_text``): the null check (its least favourable accounting), every
    distinct test of the primary family, and the secondary comparisons that came out different (uncorrected, so
    labelled exploratory). ``prefix`` opens every sentence (e.g. the run's name)."""
    out: list[Finding] = []
    nulls, rows = tables["null_check"], tables["seed_verdicts"]
    status = null_status(nulls)
    counted = [r for r in nulls if not r["same_as"] and r["passes"] != "n/a"]
    if counted:
        r = min(counted, key=lambda r: r["p_holm"])
        acc = accounting_text(r["accounting"])
        d, ci, mde = fmt(r["diff"]), f"[{fmt(r['lo'])}, {fmt(r['hi'])}]", fmt(r["mde"]).lstrip("+")
        keys = (acc, r["seeds_a"])
        same = "the same scheme on two disjoint halves of its seeds" if r["a"] == r["b"] else "the same algorithm"
        out.append(
            Finding(
                f"{prefix}the null check {status}: {r['a']} against {r['b']} ({same}) differ by {d} {ci} at "
                f"{acc} over {r['pairs']} pseudo-pairs (MDE {mde}), Holm p {pval(r['p_holm'])} over the accountings"
                + ("." if status == "passes" else ": the verdicts are refused."),
                (Cite(keys, d), Cite(keys, ci), Cite(keys, mde), Cite(keys, pval(r["p_holm"]))),
            )
        )
    else:
        out.append(
            Finding(
                f"{prefix}the null check could not be run (too few seeds of one scheme, or no spread between its "
                "halves): the verdicts are unchecked."
            )
        )
    untestable = [r for r in rows if not r["same_as"] and r["verdict"] == "not testable"]
    if untestable:
        # too few seeds (or no spread) for an interval: the differences as they are, in one sentence, no verdict
        seeds = sorted({int(r["seeds"]) for r in untestable})
        parts, cites = [], []
        for r in untestable:
            comparison, d = f"{r['scheme']} − {r['vs']}", fmt(r["diff"])
            parts.append(f"{comparison} {d} at {accounting_text(r['accounting'])}")
            cites.append(Cite((accounting_text(r["accounting"]), comparison), d))
        out.append(
            Finding(
                f"{prefix}not testable over {' or '.join(map(str, seeds))} seed{'s' if seeds != [1] else ''} (an "
                "interval and a test need at least 2 seeds with spread), so no verdict: " + "; ".join(parts) + ".",
                tuple(cites),
            )
        )
    for r in rows:
        if r["same_as"] or r["verdict"] == "not testable":
            continue
        if r["family"] == "secondary" and r["verdict"] == "no difference shown":
            continue
        acc = accounting_text(r["accounting"])
        comparison = f"{r['scheme']} − {r['vs']}"
        d, ci, mde = fmt(r["diff"]), f"[{fmt(r['lo'])}, {fmt(r['hi'])}]", fmt(r["mde"]).lstrip("+")
        keys = (acc, comparison)
        p = pval(r["p_holm"] if r["family"] == "primary" else r["p"])
        p_text = f"Holm p {p}" if r["family"] == "primary" else f"exploratory, uncorrected p {p}"
        out.append(
            Finding(
                f"{prefix}{acc}, {comparison}: {d} {ci} over {r['seeds']} seeds (MDE {mde}; {p_text}): {r['verdict']}.",
                (Cite(keys, d), Cite(keys, ci), Cite(keys, mde), Cite(keys, p), Cite(keys, r["verdict"])),
            )
        )
    return out


__all__ = [
    "COLUMNS",
    "MIN_PSEUDO_PAIRS",
    "NULL_PAIRS",
    "PRIMARY",
    "REFERENCE",
    "Readings",
    "null_pair",
    "interval_rows",
    "null_status",
    "read_seed_tables",
    "seed_tables",
    "verdict_findings",
    "verdict_section",
]
