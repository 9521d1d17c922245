"""The telephone chain in a regime that does not saturate (issue 34 item 3): the rule that picks the training budget
on validation runs, the per-seed readings of a run at both accountings, teamtr's paired seed-level differences with
each other scheme, the trust region's binding share, and the results page built from them (``orchestra experiment
chain-regime``). Everything here reads the ``runs.csv`` rows of ``orchestra experiment chain``; nothing trains.

The rule (:class:`BudgetRule`), fixed before any validation run. On a validation run (a few seeds, a seed root
disjoint from the main run's), the budget is the LARGEST number of stages S ≥ ``min_stages`` such that

* ceiling: every reading of J at budget S (every n, scheme and seed, at equal updates and at equal sampled episodes)
  stays below ``ceiling``;
* teamtr learns: its mean J over the seeds rises by at least ``min_rise`` over the warm start at the smallest n, and by
  ``min_rise_largest_n`` at the largest n.

Stage s of a run is stage s of any longer run with the same config (the trainer has no schedule that depends on
``num_stages``), so one validation run of S_max stages decides every budget S ≤ S_max. Candidates (one trainer
setting shared by every scheme) are tried in the order they were run; the first with a budget is the regime.

Accountings (as :mod:`~orchestra.experiments.chain.analysis` picks them): ``equal_updates`` reads every run at stage S
(every agent updated S times: analysis's "equal stages"); ``equal_episodes`` at the first stage whose cumulative
episodes reach teamtr's at stage S of the same (n, seed) (:func:`~orchestra.experiments.chain.analysis.
equal_episode_stage`). The full-volume schemes (teamtr, stale_indep, naive_bigB) are read at stage S by both.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from orchestra.experiments.chain.analysis import equal_episode_stage, run_curves
from orchestra.experiments.chain.config import ChainExperimentConfig
from orchestra.experiments.chain.run import RUN_COLUMNS, RUN_OPTIONAL
from orchestra.experiments.harness import cell, read_rows, write_rows
from orchestra.report.stats import paired_mean
from orchestra.teamtr.config import CHAIN_TRAINER
from trajectories.rundir import CONFIG_FILE, read_config

ACCOUNTINGS: tuple[str, ...] = ("equal_updates", "equal_episodes")
BASE = "teamtr"  # the scheme every paired difference starts from: teamtr − other


@dataclass(frozen=True)
class BudgetRule:
    """The rule that picks the budget (stages) of the unsaturated regime on validation runs (module docstring)."""

    ceiling: float = 0.8  # every reading of J at the budget (each n, scheme, seed, accounting) must stay below this
    min_rise: float = 0.05  # teamtr's mean J rise over the warm start at the smallest n must reach this
    min_rise_largest_n: float = 0.02  # … and at the largest n this (0: not required)
    min_stages: int = 5  # the smallest budget considered (each agent updated this many times)
    ceiling_on: tuple[str, ...] = ACCOUNTINGS  # the readings the ceiling applies to (see FALLBACK)

    def __post_init__(self) -> None:
        if not 0.0 < self.ceiling <= 1.0 or self.min_rise < 0 or self.min_rise_largest_n < 0 or self.min_stages < 1:
            raise ValueError(f"need 0 < ceiling ≤ 1, rises ≥ 0 and min_stages ≥ 1, got {self}")
        if not self.ceiling_on or any(a not in ACCOUNTINGS for a in self.ceiling_on):
            raise ValueError(f"ceiling_on: some of {ACCOUNTINGS}, got {self.ceiling_on}")

    @property
    def fallback(self) -> BudgetRule:
        """The rule applied when this one picks no candidate: the ceiling at equal updates only (at equal episodes
        naive has made n × teamtr's updates, and on the validation runs that reading reached the ceiling first)."""
        return replace(self, ceiling_on=("equal_updates",))


# ----------------------------------------------------------------------------------------------------------------
# per-seed readings and what is computed from them


def seed_readings(rows: Sequence[dict[str, Any]], budget: int) -> list[dict[str, Any]]:
    """One row per (accounting, n, scheme, seed): the stage read at ``budget`` stages (module docstring), its
    cumulative episodes, agent-updates, updates where the trust region bound and accepted updates with KL > δ up to
    that stage, the warm-start J0 and the J read.

    Raises:
        ValueError: a run ends before ``budget`` stages (or teamtr's run of the same (n, seed) does).
    """
    curves = run_curves(rows)
    out: list[dict[str, Any]] = []
    for accounting in ACCOUNTINGS:
        for (n, scheme, seed), curve in sorted(curves.items()):
            if accounting == "equal_updates":
                idx = budget
            else:
                ref = curves.get((n, BASE, seed))
                if ref is None:
                    continue
                if len(ref) <= budget:
                    raise ValueError(f"teamtr's run n={n} seed={seed} ends at stage {len(ref) - 1} < {budget}")
                idx = equal_episode_stage([r["episodes"] for r in curve], ref[budget]["episodes"])
            if len(curve) <= idx or curve[idx]["stage"] != idx:
                raise ValueError(f"run n={n} {scheme} seed={seed} has no stage {idx} (budget {budget})")
            done = curve[1 : idx + 1]
            out.append(
                dict(
                    accounting=accounting,
                    n=n,
                    scheme=scheme,
                    seed=seed,
                    stage=idx,
                    episodes=curve[idx]["episodes"],
                    agent_updates=sum(r["agent_updates"] for r in done),
                    steps=sum(r["steps"] for r in done),  # NaN for a runs.csv older than the column
                    bound=sum(r["bound"] for r in done),
                    kl_over=sum(r["kl_over"] for r in done),
                    J0=curve[0]["J"],
                    J=curve[idx]["J"],
                )
            )
    return out


def paired_differences(readings: Sequence[dict[str, Any]], base: str = BASE) -> list[dict[str, Any]]:
    """Per (accounting, n, other scheme): J(base) − J(other) paired over the seeds both ran — mean, 95% t interval
    over seeds (:func:`~orchestra.report.stats.paired_mean`), sd, and the seeds where base is ahead / behind.
    ``ci_excludes_0`` is per row, not corrected for the rows of the table."""
    by = {(r["accounting"], r["n"], r["scheme"], r["seed"]): r["J"] for r in readings}
    cells = sorted({(r["accounting"], r["n"], r["scheme"]) for r in readings if r["scheme"] != base}, key=_order)
    out: list[dict[str, Any]] = []
    for accounting, n, other in cells:
        seeds = sorted(s for (a, m, sc, s) in by if (a, m, sc) == (accounting, n, other) and (a, m, base, s) in by)
        ours = np.array([by[(accounting, n, base, s)] for s in seeds])
        theirs = np.array([by[(accounting, n, other, s)] for s in seeds])
        mean, lo, hi = paired_mean(ours, theirs)
        d = ours - theirs
        out.append(
            dict(
                accounting=accounting,
                n=n,
                base=base,
                vs=other,
                seeds=len(seeds),
                diff_mean=mean,
                ci_low=lo,
                ci_high=hi,
                diff_sd=float(d.std(ddof=1)) if d.size > 1 else math.nan,
                ahead=int((d > 0).sum()),
                behind=int((d < 0).sum()),
                ci_excludes_0=bool(lo > 0 or hi < 0),
            )
        )
    return out


def cell_summary(readings: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (accounting, n, scheme): seeds, mean warm-start J0, J mean / sd / max over seeds, mean stage and episodes
    read, and the trust region's binding share over every agent-update up to the stage read (bound / agent-updates,
    the optimizer steps kept per agent-update, NaN for runs older than that column, and accepted updates with
    KL > δ, which must be 0)."""
    groups: dict[tuple[str, int, str], list[dict[str, Any]]] = {}
    for r in readings:
        groups.setdefault((r["accounting"], r["n"], r["scheme"]), []).append(r)
    out: list[dict[str, Any]] = []
    for (accounting, n, scheme), got in sorted(groups.items(), key=lambda kv: _order(kv[0])):
        j = np.array([r["J"] for r in got])
        updates, bound = sum(r["agent_updates"] for r in got), sum(r["bound"] for r in got)
        out.append(
            dict(
                accounting=accounting,
                n=n,
                scheme=scheme,
                seeds=len(got),
                J0_mean=float(np.mean([r["J0"] for r in got])),
                J_mean=float(j.mean()),
                J_sd=float(j.std(ddof=1)) if j.size > 1 else math.nan,
                J_max=float(j.max()),
                stage_mean=float(np.mean([r["stage"] for r in got])),
                episodes_mean=float(np.mean([r["episodes"] for r in got])),
                agent_updates=updates,
                bound=bound,
                bound_share=bound / updates if updates else math.nan,
                steps_per_update=sum(r["steps"] for r in got) / updates if updates else math.nan,
                kl_over=sum(r["kl_over"] for r in got),
            )
        )
    return out


def _order(key: tuple[str, int, str]) -> tuple[int, int, int, str]:
    """Table order: accounting as in ACCOUNTINGS, then n, then teamtr, naive, stale_indep, naive_bigB, the rest."""
    accounting, n, scheme = key
    known = (BASE, "naive", "stale_indep", "naive_bigB")
    return ACCOUNTINGS.index(accounting), n, known.index(scheme) if scheme in known else len(known), scheme


# ----------------------------------------------------------------------------------------------------------------
# the budget rule


def budget_table(rows: Sequence[dict[str, Any]], rule: BudgetRule, max_stages: int) -> list[dict[str, Any]]:
    """Per budget S = 1…``max_stages`` of a validation run: the largest reading of J (and where), teamtr's mean rise
    over the warm start at each n, and whether the rule holds (``ok``)."""
    out: list[dict[str, Any]] = []
    for budget in range(1, max_stages + 1):
        got = seed_readings(rows, budget)
        top = max((r for r in got if r["accounting"] in rule.ceiling_on), key=lambda r: r["J"])
        ns = sorted({r["n"] for r in got})
        rise = {
            n: float(
                np.mean(
                    [
                        r["J"] - r["J0"]
                        for r in got
                        if (r["accounting"], r["n"], r["scheme"]) == (ACCOUNTINGS[0], n, BASE)
                    ]
                )
            )
            for n in ns
        }
        ceiling_ok = top["J"] < rule.ceiling
        rise_ok = rise[ns[0]] >= rule.min_rise and rise[ns[-1]] >= rule.min_rise_largest_n
        out.append(
            dict(
                stages=budget,
                max_J=top["J"],
                max_at=f"n={top['n']} {top['scheme']} seed {top['seed']} {top['accounting']}",
                **{f"teamtr_rise_n{n}": rise[n] for n in ns},
                ceiling_ok=ceiling_ok,
                rise_ok=rise_ok,
                ok=ceiling_ok and rise_ok and budget >= rule.min_stages,
            )
        )
    return out


def choose_budget(table: Sequence[dict[str, Any]]) -> int | None:
    """The largest budget of a :func:`budget_table` at which the rule holds; None if it holds at none."""
    return max((r["stages"] for r in table if r["ok"]), default=None)


# ----------------------------------------------------------------------------------------------------------------
# run directories, commands, wall times


def load_run(run_dir: str | Path) -> tuple[ChainExperimentConfig, list[dict[str, Any]]]:
    """The config and ``runs.csv`` rows of an ``orchestra experiment chain`` run directory."""
    path = Path(run_dir)
    return ChainExperimentConfig.from_json(read_config(path / CONFIG_FILE)), read_rows(
        path / "runs.csv", RUN_COLUMNS, RUN_OPTIONAL
    )


def chain_command(cfg: ChainExperimentConfig, out: str | Path) -> str:
    """The ``orchestra experiment chain`` command line that runs ``cfg`` into ``out``.

    Raises:
        ValueError: ``cfg`` differs from the command's defaults in a field these flags do not set.
    """
    t = cfg.trainer
    flags = ChainExperimentConfig(
        ns=cfg.ns,
        schemes=cfg.schemes,
        seeds=cfg.seeds,
        warm_pass=cfg.warm_pass,
        warm_success=cfg.warm_success,
        seed=cfg.seed,
        trainer=replace(CHAIN_TRAINER, num_stages=t.num_stages, batch_size=t.batch_size, lr=t.lr, delta=t.delta),
    )
    if flags != cfg:
        raise ValueError("the config sets fields that chain_command does not write as flags")
    delta = t.delta if isinstance(t.delta, float | int) else t.delta[0]
    return (
        f"orchestra experiment chain --ns {' '.join(map(str, cfg.ns))} --seeds {cfg.seeds} "
        f"--schemes {' '.join(cfg.schemes)} --stages {t.num_stages} --batch-size {t.batch_size} --lr {t.lr:g} "
        f"--delta {delta:g} --warm-pass {cfg.warm_pass:g} "
        + (f"--warm-success {cfg.warm_success:g} " if cfg.warm_success is not None else "")
        + f"--seed {cfg.seed} --out {out}"
    )


_WALL = re.compile(r"^wall (\d+(?:\.\d+)?) s$")
_RUN = re.compile(r"^chain n=\d+ \S+ seed=\d+: .*, (\d+(?:\.\d+)?) s\)$")


def log_seconds(run_dir: str | Path) -> tuple[float, float, int]:
    """From ``log.txt`` of a run directory (the progress lines of ``orchestra experiment chain`` with a ``wall N s``
    line per invocation): the invocations' summed wall time, the runs' summed training time and how many runs were
    logged (zeros when there is no log)."""
    path = Path(run_dir) / "log.txt"
    wall = train = 0.0
    runs = 0
    for line in path.read_text().splitlines() if path.exists() else []:
        if m := _WALL.match(line.strip()):
            wall += float(m.group(1))
        elif m := _RUN.match(line.strip()):
            train += float(m.group(1))
            runs += 1
    return wall, train, runs


def _minutes(seconds: float) -> str:
    return f"{int(seconds // 60)} min {int(seconds % 60)} s"


# ----------------------------------------------------------------------------------------------------------------
# the page


def regime_page(
    validation: Sequence[tuple[str, ChainExperimentConfig, list[dict[str, Any]]]],
    main: tuple[str, ChainExperimentConfig, list[dict[str, Any]]],
    rule: BudgetRule,
    command: str,
    page_dir: str | Path = ".",
) -> tuple[str, dict[str, list[dict[str, Any]]]]:
    """The page (markdown) and its tables: ``budgets`` (every validation candidate's :func:`budget_table`),
    ``seeds`` (the main run's :func:`seed_readings` at its budget), ``cells`` (:func:`cell_summary`) and
    ``differences`` (:func:`paired_differences`). ``validation`` and ``main``: (directory, config, rows);
    ``page_dir``: where the page goes (its links to the main run's files are relative to it)."""
    main_dir, cfg, rows = main
    budget = cfg.num_stages
    lines = [
        "# Phase 2: TeamTR on the telephone chain in a regime that does not saturate",
        "",
        f"Generated by `{command}` from the committed per-seed tables (issue 34 item 3). In the reliable and the study "
        "regimes of [teamtr.md](teamtr.md) every scheme reaches J = 1.000 up to 4 agents, so the chain could not "
        "tell the schemes apart there. Here the trainer setting and the budget are chosen on validation seeds, by a "
        f"rule fixed before the validation runs (and a fallback, below), so that J stays below {rule.ceiling:g}.",
        "",
        "Schemes: teamtr (one fresh batch per agent, sampled after the previous agent's update); naive (one batch "
        "per stage, every agent updated on it); `stale_indep` (one batch per agent, as teamtr, but every one "
        "sampled at the stage start: teamtr's data volume without its freshness); `naive_bigB` (naive with n × the "
        "batch: teamtr's episodes per stage, all stale). One trainer setting for every scheme (same lr, δ, epochs, "
        "batch, budget). Runs are paired: for a given (n, seed) every scheme starts from the same warm-started team "
        "and trainer seed.",
        "",
        "Two readings: **equal updates**: every run at stage S (every agent updated S times; naive has then sampled "
        "1/n of teamtr's episodes); **equal episodes**: each run at the first stage whose sampled episodes reach "
        "teamtr's at stage S (naive at stage n·S). stale_indep and naive_bigB sample teamtr's episodes per stage, so "
        "both readings take them at stage S.",
        "",
        "## Choosing the regime on validation seeds",
        "",
        f"The rule, written before the validation runs: for a candidate setting, the budget is the largest S ≥ "
        f"{rule.min_stages} stages such that (a) every reading of J at S (every n, scheme and validation seed, both "
        f"readings) stays below {rule.ceiling:g}, and (b) teamtr learns: its mean J rises over the warm start by "
        f"≥ {rule.min_rise:g} at the smallest n and by ≥ {rule.min_rise_largest_n:g} at the largest n. One "
        "validation run of S_max stages decides every S ≤ S_max (a run's first stages do not depend on its length). "
        "Candidates were tried in the order below; the first with a budget is the regime. The validation runs use "
        "their own seed root, so their seeds are disjoint from the main run's.",
        "",
    ]
    fallback = rule.fallback
    strict = [budget_table(vrows, rule, vcfg.num_stages) for _, vcfg, vrows in validation]
    relaxed = [budget_table(vrows, fallback, vcfg.num_stages) for _, vcfg, vrows in validation]
    tables: dict[str, list[dict[str, Any]]] = {
        "budgets": [
            {"candidate": k, "rule": name, **r}
            for name, per in (("rule", strict), ("fallback", relaxed))
            for k, table in enumerate(per, start=1)
            for r in table
        ]
    }
    chosen: tuple[int, int, str] | None = None  # (candidate, budget, "rule" | "fallback")
    for name, per in (("rule", strict), ("fallback", relaxed)):
        for k, table in enumerate(per, start=1):
            got = choose_budget(table)
            if got is not None and chosen is None:
                chosen = (k, got, name)
    lines += [
        f"Fallback, added when the rule had picked none of the candidates below (after the validation runs, before "
        f"the main run): the same rule with (a) checked at the equal-updates reading only. At equal episodes naive "
        f"has made n × teamtr's updates, and on these candidates that reading was the one to reach {rule.ceiling:g} "
        "first (the `where` column of `budgets.csv`). Under the fallback, naive's equal-episodes reading may "
        "saturate; the tables below say where.",
        "",
        "| candidate | warm start | lr | δ | largest S meeting (a) | budget | largest S meeting (a) at equal updates "
        "| budget (fallback) | wall |",
        "|---:|---|---:|---:|---:|---|---:|---|---:|",
    ]

    def largest(table: Sequence[dict[str, Any]]) -> str:
        below = [r["stages"] for r in table if r["ceiling_ok"]]
        return str(below[-1]) if below else "none"

    def budget_cell(table: Sequence[dict[str, Any]]) -> str:
        got = choose_budget(table)
        return f"S = {got}" if got is not None else "none"

    for k, (vdir, vcfg, _) in enumerate(validation, start=1):
        lines.append(
            f"| {k} | {_warm(vcfg)} | {vcfg.trainer.lr:g} | {_delta(vcfg)} | {largest(strict[k - 1])} | "
            f"{budget_cell(strict[k - 1])} | {largest(relaxed[k - 1])} | {budget_cell(relaxed[k - 1])} | "
            f"{_minutes(log_seconds(vdir)[0])} |"
        )
    lines += [
        "",
        "(a) is checked at every S from 1 to the candidate's S_max; the columns give the largest S at which it holds. "
        "Every candidate ran n ∈ {"
        + ", ".join(map(str, validation[0][1].ns) if validation else [])
        + "}, B = "
        + ", ".join(sorted({str(v[1].batch_size) for v in validation}))
        + ", the four schemes and 3 seeds; the commands:",
        "",
        *(f"{k}. `{chain_command(vcfg, vdir)}`" for k, (vdir, vcfg, _) in enumerate(validation, start=1)),
        "",
        "Per candidate, rule and budget S, the largest reading, teamtr's rise and the verdict: `chain_hard/budgets.csv`.",
        "",
    ]
    if chosen is not None:
        k, got, name = chosen
        table, ns = (strict if name == "rule" else relaxed)[k - 1], sorted(validation[k - 1][1].ns)
        lines += [
            f"The chosen candidate {k} per budget S, under the {name} ((a) at "
            + (" and ".join(a.replace("_", " ") for a in (rule if name == "rule" else fallback).ceiling_on))
            + "):",
            "",
            "| S | largest J read | where | " + " | ".join(f"teamtr rise n={n}" for n in ns) + " | (a) | (b) | rule |",
            "|---:|---:|---|" + "---:|" * len(ns) + "---|---|---|",
            *(
                f"| {r['stages']} | {cell(r['max_J'])} | {r['max_at']} | "
                + " | ".join(cell(r[f"teamtr_rise_n{n}"]) for n in ns)
                + f" | {_yes(r['ceiling_ok'])} | {_yes(r['rise_ok'])} | {_yes(r['ok'])} |"
                for r in table
            ),
            "",
        ]
    if chosen is None:
        lines += ["**No candidate has a budget, under the rule or the fallback: no regime was picked.**", ""]
    else:
        k, got, name = chosen
        vcfg = validation[k - 1][1]
        same = replace(vcfg, seeds=cfg.seeds, seed=cfg.seed, ns=cfg.ns, trainer=replace(vcfg.trainer, num_stages=got))
        lines += [
            f"**The regime: candidate {k} at S = {got} stages, "
            + ("by the rule" if name == "rule" else "by the fallback (the rule itself picked none)")
            + ".** The main run "
            + (
                "uses exactly that setting"
                if same == cfg and cfg.seed != vcfg.seed
                else "does NOT use exactly that setting (or shares the validation seed root): read it with care"
            )
            + f" (seed root {cfg.seed} against {vcfg.seed} for validation).",
            "",
        ]
    readings = seed_readings(rows, budget)
    cells = cell_summary(readings)
    diffs = paired_differences(readings)
    tables |= {"seeds": readings, "cells": cells, "differences": diffs}
    wall, train, runs = log_seconds(main_dir)
    link = Path(os.path.relpath(main_dir, page_dir)).as_posix()
    lines += _main_sections(cfg, main_dir, cells, diffs, rule, wall, train, runs, link)
    return "\n".join(lines), tables


def _main_sections(
    cfg: ChainExperimentConfig,
    main_dir: str,
    cells: Sequence[dict[str, Any]],
    diffs: Sequence[dict[str, Any]],
    rule: BudgetRule,
    wall: float,
    train: float,
    runs: int,
    link: str,
) -> list[str]:
    budget = cfg.num_stages
    by = {(r["accounting"], r["n"], r["scheme"]): r for r in cells}
    schemes = [s for s in (BASE, "naive", "stale_indep", "naive_bigB") if s in cfg.schemes] + [
        s for s in cfg.schemes if s not in (BASE, "naive", "stale_indep", "naive_bigB")
    ]
    lines = [
        "## The main run",
        "",
        f"`{chain_command(cfg, main_dir)}`: n ∈ {{{', '.join(map(str, cfg.ns))}}}, {cfg.seeds} seeds per (n, scheme), "
        f"budget S = {budget} stages, {_warm(cfg)}, B = {cfg.batch_size}, lr {cfg.trainer.lr:g}, "
        f"δ = {_delta(cfg)} (exact KL over the vocabulary, backtracking), {cfg.trainer.num_epochs} epochs of "
        f"{cfg.trainer.num_minibatches} minibatch, fixed order, one Adam per agent kept across its updates"
        + (f"; {runs} runs, wall {_minutes(wall)} (training {_minutes(train)})" if wall else "")
        + ". Per-seed tables: `runs.csv` (one row per (n, scheme, seed, stage)) and `seeds.csv` (one row per "
        "(accounting, n, scheme, seed): the stage read, its episodes, agent-updates and binding updates so far, J0 "
        "and J), beside `cells.csv` and `differences.csv`.",
        "",
        "### Does it saturate?",
        "",
    ]
    for accounting in ACCOUNTINGS:
        mine = [r for r in cells if r["accounting"] == accounting]
        top = max(mine, key=lambda r: r["J_mean"])
        top_seed = max(mine, key=lambda r: r["J_max"])
        over = [r for r in mine if r["J_mean"] >= rule.ceiling]
        lines.append(
            f"- At {accounting.replace('_', ' ')}: the largest mean J is {cell(top['J_mean'])} ({top['scheme']}, "
            f"n = {top['n']}), the largest single seed's {cell(top_seed['J_max'])} ({top_seed['scheme']}, "
            f"n = {top_seed['n']}). "
            + (
                f"Every cell's mean stays below {rule.ceiling:g}."
                if not over
                else f"Mean J reaches {rule.ceiling:g} in "
                + ", ".join(f"{r['scheme']} at n = {r['n']} ({cell(r['J_mean'])})" for r in over)
                + ": the regime saturates there."
            )
        )
    lines.append("")
    for accounting in ACCOUNTINGS:
        label = accounting.replace("_", " ")
        lines += [
            f"### Exact J at {label} (mean ± sd over seeds; warm start J0 = the mean before training)",
            "",
            "| n | J0 | " + " | ".join(schemes) + " |",
            "|---:|---:|" + "---:|" * len(schemes) + "",
        ]
        for n in cfg.ns:
            j0 = by[(accounting, n, BASE)]["J0_mean"] if (accounting, n, BASE) in by else math.nan
            row = [
                f"{cell(by[k]['J_mean'])} ± {cell(by[k]['J_sd'])} (stage {cell(by[k]['stage_mean'], 0)})"
                if (k := (accounting, n, s)) in by
                else "—"
                for s in schemes
            ]
            lines.append(f"| {n} | {cell(j0)} | " + " | ".join(row) + " |")
        lines.append("")
    lines += [
        "### Paired seed-level differences: J(teamtr) − J(other), mean and 95% t interval over seeds",
        "",
        "Each seed is one paired difference (same warm start, same trainer seed). The intervals are per row, not "
        "corrected for the rows of this table; ahead / behind: the seeds where teamtr's J is higher / lower.",
        "",
        "| reading | n | vs | seeds | teamtr − it | 95% CI | ahead / behind | CI excludes 0 |",
        "|---|---:|---|---:|---:|---|---|---|",
        *(
            f"| {r['accounting'].replace('_', ' ')} | {r['n']} | {r['vs']} | {r['seeds']} | "
            f"{_signed(r['diff_mean'])} | [{_signed(r['ci_low'])}, {_signed(r['ci_high'])}] | "
            f"{r['ahead']} / {r['behind']} | {_yes(r['ci_excludes_0'])} |"
            for r in diffs
        ),
        "",
    ]
    excl = [r for r in diffs if r["ci_excludes_0"]]
    lines += [
        f"{len(excl)} of {len(diffs)} intervals exclude 0"
        + (
            ": "
            + "; ".join(
                f"{r['vs']} at n = {r['n']} ({r['accounting'].replace('_', ' ')}, teamtr "
                f"{'ahead' if r['diff_mean'] > 0 else 'behind'} by {abs(r['diff_mean']):.3f})"
                for r in excl
            )
            if excl
            else ". No difference between teamtr and any other scheme is detectable at this number of seeds."
        ),
        "",
        "### The trust region: share of agent-updates in which it bound (the full step broke δ)",
        "",
        "Over every agent-update of every seed up to the stage read; accepted updates with KL > δ must be 0.",
        "",
        "| reading | n | " + " | ".join(schemes) + " |",
        "|---|---:|" + "---:|" * len(schemes),
    ]
    for accounting in ACCOUNTINGS:
        for n in cfg.ns:
            row = [
                f"{cell(100 * by[k]['bound_share'], 1)}% of {by[k]['agent_updates']}"
                + (
                    f", {by[k]['steps_per_update']:.2f} steps each"
                    if math.isfinite(by[k].get("steps_per_update", math.nan))
                    else ""
                )
                + (f", {by[k]['kl_over']} over δ" if by[k]["kl_over"] else "")
                if (k := (accounting, n, s)) in by
                else "—"
                for s in schemes
            ]
            lines.append(f"| {accounting.replace('_', ' ')} | {n} | " + " | ".join(row) + " |")
    shares = [r["bound_share"] for r in cells if r["accounting"] == "equal_updates"]
    lines += [
        "",
        f"![exact J vs sampled episodes, mean ± sd over seeds]({link}/learning_curves.png)",
        "",
        f"The main run's own report (drift, regressions, certificate, acceptance checks of `orchestra experiment "
        f"chain`): [{link}/summary.md]({link}/summary.md).",
        "",
        "## What it does not show",
        "",
        *(
            [
                f"- The trust region bound in {cell(100 * min(shares), 1)}–{cell(100 * max(shares), 1)}% of the "
                "agent-updates at equal updates: (nearly) every full step broke δ and was shortened by the line search "
                "until KL ≤ δ, so how far each update moved was set by δ more than by the gradient, for every scheme "
                "alike. The schemes "
                "can differ here only in the direction of their steps; a regime where steps are not all cut to δ "
                "is not measured."
            ]
            if shares and min(shares) >= 0.9
            else []
        ),
        "- The budget is what keeps J below the ceiling: the schemes are compared part-way through training, from "
        "one warm start per (n, seed). Whether a gap found (or not found) here persists, widens or closes later is "
        "not measured; the saturated regimes of [teamtr.md](teamtr.md) are the late end.",
        "- One trainer setting (lr, δ, epochs, batch) for every scheme, chosen by a rule that looks at J levels and "
        "teamtr's learning only, not at any difference between schemes. Other settings may order the schemes "
        "differently; none was tuned per scheme.",
        "- The intervals are t intervals over seeds, one per row, with no correction for the rows of the table. The "
        "primary family of issue 34 (teamtr vs naive and vs stale_indep, Holm-corrected), IQM with stratified "
        "bootstrap intervals and the null check are the seed-level statistics of issue 34 item 4, computed from "
        "`seeds.csv` and `runs.csv`; they are not on this page.",
        "- An interval that spans 0 is the absence of evidence at this many seeds, not evidence of equality: a true "
        "difference as large as the interval's far end is compatible with the data.",
        "- Telephone chains of tiny random-init models with one-token messages and exact evaluation, not LLM teams.",
        "",
    ]
    return lines


def _warm(cfg: ChainExperimentConfig) -> str:
    if cfg.warm_success is None:
        return f"warm pass {cfg.warm_pass:g}"
    passes = "/".join(f"{cfg.warm_pass_for(n):.3f}" for n in cfg.ns)
    return f"warm J0 {cfg.warm_success:g} at every n (per-hop pass {passes} at n = {'/'.join(map(str, cfg.ns))})"


def _delta(cfg: ChainExperimentConfig) -> str:
    d = cfg.trainer.delta
    return f"{d:g}" if isinstance(d, float | int) else "/".join(f"{x:g}" for x in d)


def _yes(ok: bool) -> str:
    return "yes" if ok else "no"


def _signed(v: float) -> str:
    return "—" if not math.isfinite(v) else f"{v:+.3f}"


def write_regime_page(
    validation: Sequence[str | Path], main: str | Path, page: str | Path, rule: BudgetRule, command: str
) -> Path:
    """Read the run directories, write the page to ``page`` and its tables as CSV: ``budgets.csv`` beside the
    first validation run's directory's parent (one row per candidate and budget), ``seeds.csv``, ``cells.csv`` and
    ``differences.csv`` into the main run's directory. Returns the page's path."""
    runs = [(str(d), *load_run(d)) for d in validation]
    text, tables = regime_page(runs, (str(main), *load_run(main)), rule, command, Path(page).parent)
    main_dir = Path(main)
    for name in ("seeds", "cells", "differences"):
        write_rows(main_dir / f"{name}.csv", tables[name], list(tables[name][0]), nan="")
    if tables["budgets"]:
        fields = list(dict.fromkeys(k for r in tables["budgets"] for k in r))
        write_rows(Path(validation[0]).parent / "budgets.csv", tables["budgets"], fields, nan="")
    out = Path(page)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    return out


__all__ = [
    "ACCOUNTINGS",
    "BudgetRule",
    "budget_table",
    "cell_summary",
    "chain_command",
    "choose_budget",
    "load_run",
    "log_seconds",
    "paired_differences",
    "regime_page",
    "seed_readings",
    "write_regime_page",
]
