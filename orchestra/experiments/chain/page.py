"""The telephone chain's results page (docs/results/teamtr.md), written from committed run directories of
``orchestra experiment chain``: generated findings first (what the update mechanism did, the null check, the primary
family and the secondary comparisons that came out different, each number cited from a table below), the figures,
the page's hand-written notes (``--notes``: the reading of the tables and the caveats), then each run's report.

A run directory holds ``config.json``, ``runs.csv`` and what ``orchestra experiment chain`` derives from them
(``summary.md``, ``trust.csv``, ``seed_verdicts.csv`` …, the plots); re-running the run's command with ``--out`` on
the directory trains nothing when ``runs.csv`` is complete and rewrites the rest.
"""

from __future__ import annotations

import math
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from orchestra.experiments.chain.config import ChainExperimentConfig
from orchestra.experiments.chain.regime import chain_command
from orchestra.experiments.chain.report import accounting_text, diff_text
from orchestra.experiments.harness import cell, maybe_float, read_rows
from orchestra.experiments.verdicts import interval_rows, read_seed_tables, verdict_findings
from orchestra.report.findings import Cite, Finding, findings_section
from orchestra.report.plots import plot_intervals
from trajectories.rundir import CONFIG_FILE, read_config

TRUST_COLUMNS: dict[str, Callable[[str], Any]] = dict(
    scheme=str, agent_updates=int, steps=maybe_float, accepted=int, bound=int, kl_over=int, kl_max_ratio=maybe_float
)


def describe(cfg: ChainExperimentConfig) -> str:
    """A run's regime in a few words: warm start, batch, chain lengths."""
    warm = f"warm pass {cfg.warm_pass:g}" if cfg.warm_success is None else f"warm J0 {cfg.warm_success:g}"
    return f"{warm}, B = {cfg.trainer.batch_size}, n ∈ {{{', '.join(map(str, cfg.ns))}}}"


def mechanism_finding(name: str, trust: Sequence[dict[str, Any]]) -> Finding:
    """What the trust region did in a run, per scheme, and the range of optimizer steps per update, cited from its
    trust table (``summary.md``'s "Trust region")."""
    parts, cites, steps = [], [], []
    for r in trust:
        n = r["agent_updates"]
        if not n:
            continue
        share = f"{cell(100 * r['bound'] / n, 1)}%"
        keys = (str(r["scheme"]), str(n))
        parts.append(f"{share} of {r['scheme']}'s")
        cites.append(Cite(keys, share))
        if not math.isnan(r["steps"]):  # a run written before steps were counted has none
            steps.append((r["steps"] / n, keys))
    text = f"{name} run: the trust region acted (the full step broke δ and was cut back) in " + ", ".join(parts)
    text += " agent-updates"
    if steps:
        (lo, lo_keys), (hi, hi_keys) = min(steps), max(steps)
        text += f", which kept {cell(lo, 2)}–{cell(hi, 2)} optimizer steps per update on average"
        cites += [Cite(lo_keys, cell(lo, 2)), Cite(hi_keys, cell(hi, 2))]
    return Finding(text + ".", tuple(cites))


def _demoted(summary: str) -> list[str]:
    """A run's ``summary.md`` under the page's run heading: its title and header left out, headings two levels down."""
    lines = summary.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith("## ")), len(lines))
    return [("##" + ln if ln.startswith("#") else ln) for ln in lines[start:]]


def chain_page(
    runs: Sequence[tuple[str, str]], notes: str | None, page: str | Path, command: str
) -> tuple[str, list[Finding]]:
    """The page's text and its findings. ``runs``: (name, run directory) in the page's order; ``notes``: a markdown
    file placed after the findings and figures, before the runs' reports (its headings kept); the figures are copied
    beside ``page`` (``{stem}_curves_{name}.png``, ``{stem}_drift_{name}.png``) and the interval plot drawn there
    (``{stem}_verdicts.png``)."""
    here = Path(page).parent
    stem = Path(page).stem
    findings: list[Finding] = []
    blocks: list[str] = []
    intervals: list[tuple[str, float, float, float, bool, str]] = []
    table = ["| run | regime | command |", "|---|---|---|"]
    figures = []
    for name, run_dir in runs:
        d = Path(run_dir)
        cfg = ChainExperimentConfig.from_json(read_config(d / CONFIG_FILE))
        trust = read_rows(d / "trust.csv", TRUST_COLUMNS, optional=("steps",))
        seeds = read_seed_tables(d)
        n_max = max(cfg.ns)
        findings.append(mechanism_finding(name, trust))
        findings += verdict_findings(seeds, diff_text, accounting_text, prefix=f"{name} run, J at n = {n_max}: ")
        intervals += interval_rows(seeds, accounting_text, prefix=f"{name}, ")
        try:
            how = f"`{chain_command(cfg, run_dir)}`"
        except ValueError:  # a config the command's flags cannot write (e.g. the smoke preset)
            how = f"the config of `{Path(run_dir) / CONFIG_FILE}`"
        table.append(f"| {name} | {describe(cfg)} | {how} |")
        curves = f"{stem}_curves_{name}.png"
        shutil.copyfile(d / "learning_curves.png", here / curves)
        shutil.copyfile(d / "drift.png", here / f"{stem}_drift_{name}.png")  # the notes may link it
        figures.append(f"![{name}: exact J against sampled episodes, mean ± sd over seeds]({curves})")
        blocks += [f"## The {name} run: {describe(cfg)}", "", *_demoted((d / "summary.md").read_text())]
    verdicts = f"{stem}_verdicts.png"
    plot_intervals(
        intervals, here / verdicts, "teamtr − scheme in exact J at the largest n (95% t interval over seeds)"
    )
    text = [
        "# Phase 2 results: TeamTR on the telephone chain",
        "",
        f"Generated by `{command}` from the committed run directories (their `runs.csv`; every other table is derived "
        "from it by the run's command, which trains nothing when `runs.csv` is complete). Runs are paired: for a "
        "given (n, seed) every scheme starts from the same warm-started team and trainer seed.",
        "",
        *table,
        "",
        *findings_section(
            findings,
            "Generated from the tables below (a run is the unit; the declared primary family is teamtr − naive and "
            "teamtr − stale_indep, Holm-corrected; secondary comparisons are listed only where they came out "
            "different, uncorrected).",
        ),
        f"![paired differences over seeds, filled: the primary family]({verdicts})",
        "",
        *figures,
        "",
        *([Path(notes).read_text().rstrip("\n"), ""] if notes else []),
        *blocks,
    ]
    return "\n".join(text) + "\n", findings


def write_chain_page(runs: Sequence[tuple[str, str]], notes: str | None, page: str | Path, command: str) -> Path:
    """Write :func:`chain_page`'s text to ``page``; returns its path."""
    out = Path(page)
    out.parent.mkdir(parents=True, exist_ok=True)
    text, _ = chain_page(runs, notes, out, command)
    out.write_text(text)
    return out


__all__ = ["TRUST_COLUMNS", "chain_page", "describe", "mechanism_finding", "write_chain_page"]
