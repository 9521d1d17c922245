"""Phase 1's report (stage 7 of :func:`orchestra.jobs.phase1.run_phase1`): from the test episodes, the results and
paired tables, the oracle router over the menu with headroom and captured fraction, the LLM-required subset, the power
of the test, the cost–quality plane, and the text of ``summary.md``."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from orchestra.report import stats
from orchestra.report.evaluation import (
    PAIRED_LEGEND,
    PRICE_LEGEND,
    PairedRow,
    ResultRow,
    above_hull,
    format_collapse_table,
    format_paired_table,
    format_table,
    hull_comparison,
    mode_collapse,
    p_text,
    paired_comparison,
    summarize,
    write_report,
)
from orchestra.report.findings import Cite, Finding, findings_section, write_findings
from orchestra.report.plots import plot_cost_quality
from orchestra.report.protocol import (
    FQERow,
    HeadroomRow,
    MenuHeadroomRow,
    RouterRow,
    captured_text,
    fqe_table_md,
    headroom_table_md,
    level_table_md,
    menu_headroom_md,
    not_shown,
    router_table_md,
    subset_table_md,
)
from trajectories import Episode
from trajectories.rundir import write_table


@dataclass
class Tables:
    """Stage 7: the report's tables (the markdown rows the summary quotes) and files."""

    rows: list[ResultRow]
    paired: list[PairedRow]
    headroom: list[HeadroomRow]
    subset_lines: list[str]
    power_lines: list[str]
    paths: dict[str, Path]
    findings: list[Finding]  # the summary's findings (:func:`phase1_findings`), also in ``report/findings.json``
    # each learner against the menu's hull at its place (evaluation.hull_comparison), Holm within each team
    hull: list[PairedRow] = field(default_factory=list)
    level_lines: list[str] = field(default_factory=list)  # per team, success per difficulty level (markdown)
    routers: list[RouterRow] = field(default_factory=list)  # per team, the simple router fitted on validation


def report_tables(
    out: Path,
    menus: dict[str, list[str]],
    best_fixed: dict[str, str],
    released: dict[str, dict[str, str]],
    test_eps: list[Episode],
    learners: dict[str, dict[str, list[str]]],
    replicate: Sequence[Episode] = (),
    routers: Mapping[str, stats.StumpRouter] | None = None,
) -> Tables:
    """Stage 7: results and paired tests against the best fixed schedule, then per team the oracle router over the
    menu, headroom and captured fraction, the LLM-required subset, the power of the test, the cost–quality
    plane and the findings (files under ``out/report/``). Per team: its menu, best fixed schedule (chosen on validation), released
    configuration per algorithm and the labels of its test evaluations per algorithm (one per seed). ``replicate``: the
    menu's episodes on the same test tasks with other sampling seeds; the oracle is then also picked on them and
    scored on ``test_eps`` (the capturable headroom; the in-sample oracle's surplus is luck), and a learner's captured
    fraction is of that capturable headroom. ``routers``: per team the simple router fitted on validation
    (:func:`orchestra.report.stats.fit_stump_router`), scored here on the menu's test episodes."""
    rows = summarize(test_eps)
    fam_of = {r.team: r.family for r in rows}
    baselines = {(fam_of[name], name): best_fixed[name] for name in menus}
    paired = paired_comparison(test_eps, rows, baselines=baselines)
    report_dir = out / "report"
    paths = write_report(rows, report_dir, "Phase 1 (test split)", paired, mode_collapse(test_eps))
    head_rows: list[HeadroomRow] = []
    panels: dict[str, list[tuple[str, float, float, str]]] = {}
    subset_lines: list[str] = []
    level_lines: list[str] = []
    router_rows: list[RouterRow] = []
    power_lines: list[str] = []
    xlabels: dict[str, str] = {}
    hull: list[PairedRow] = []
    for name in menus:
        eps = [e for e in test_eps if e.team.name == name]
        by = _by_task(eps)
        menu = [m for m in menus[name] if m in by]
        priced = _priced(eps)

        def row_cost(r: ResultRow, priced: bool = priced) -> float:
            return r.mean_price if priced else r.mean_tokens

        hull += hull_comparison(eps, rows, {name: menu}, row_cost)
        tasks, oracle, r_oracle = _menu_oracles(menu, by, _by_task([e for e in replicate if e.team.name == name]))
        o_succ, o_cost = _mean_choice(oracle)
        r_succ = _mean_choice(r_oracle)[0]
        # a learner is measured against what a router could capture: the replicate oracle where there is one
        target = r_succ if r_oracle else o_succ
        team_rows = {r.conductor: r for r in rows if r.team == name}
        bf = team_rows[best_fixed[name]]
        bt = best_of(list(team_rows.values()), menu)
        xlabels[fam_of[name]] = "mean price per episode (team file)" if priced else "mean tokens per episode"
        panels[fam_of[name]] = [(m, row_cost(team_rows[m]), team_rows[m].success_rate, "rule") for m in menu]
        panels[fam_of[name]].append(("oracle", o_cost, o_succ, "oracle"))
        if r_oracle:
            panels[fam_of[name]].append(("replicate oracle", _mean_choice(r_oracle)[1], r_succ, "replicate"))
        if routers and name in routers:
            outcomes, feats = menu_outcomes(eps, menu)
            picks = stats.route(routers[name], outcomes, feats)
            rs, rc = _mean_choice(picks)
            router_rows.append(RouterRow(name, routers[name].describe(), routers[name].fit_success, rs, rc, len(picks)))
            panels[fam_of[name]].append(("simple router", rc, rs, "other"))
        if "random" in team_rows:
            panels[fam_of[name]].append(
                ("random", row_cost(team_rows["random"]), team_rows["random"].success_rate, "other")
            )
        for algo, labs in learners[name].items():
            succ = [team_rows[lab].success_rate for lab in labs]
            cap = [stats.captured_fraction(s, bf.success_rate, target) for s in succ]
            sm, ss = stats.mean_sd(succ)
            cm, cs = stats.mean_sd(cap)
            head_rows.append(
                HeadroomRow(
                    name,
                    len(tasks),
                    bf.conductor,
                    bf.success_rate,
                    bt.conductor,
                    bt.success_rate,
                    o_succ,
                    stats.headroom(o_succ, bf.success_rate),
                    f"{algo} ({released[name][algo]})",
                    sm,
                    ss,
                    cm,
                    cs,
                    len(labs),
                    o_cost,
                    r_succ,
                    r_succ - bf.success_rate,
                    o_succ - r_succ,
                )
            )
            panels[fam_of[name]].append(
                (algo, float(np.mean([row_cost(team_rows[lab]) for lab in labs])), sm, "learned")
            )
            for lab in labs:
                common = [t for t in tasks if t in by[lab]]
                disc = (
                    float(np.mean([by[lab][t].success != by[bf.conductor][t].success for t in common]))
                    if common
                    else 0.0
                )
                power_lines.append(
                    f"| {name} | {lab} | {len(common)} | {100 * disc:.1f}% | "
                    f"{100 * stats.noninferiority_power(len(common), max(disc, 0.05)):.0f}% | "
                    f"{stats.tasks_for_noninferiority(max(disc, 0.05))} |"
                )
        hard = [t for t in tasks if not any(by[m][t].success for m in ("tool_only", "single_shot") if m in by)]
        subset_lines.append(
            f"| {name} | oracle | {len(hard)} | "
            f"{100 * float(np.mean([oracle[t].success for t in hard])) if hard else float('nan'):.1f}% |"
        )
        names = [*menu, *(lab for labs in learners[name].values() for lab in labs)]
        subset_lines.append(subset_table_md(name, names, by, hard))
        levels = {t: by[menu[0]][t].task.difficulty for t in tasks}
        level_lines.append(level_table_md(name, [m for m in names if m != "tool_only"], by, levels))
    plot_cost_quality(panels, report_dir / "cost_quality.png", "Phase 1", xlabel=xlabels)
    paths["cost_quality"] = report_dir / "cost_quality.png"
    write_table(report_dir / "headroom.csv", head_rows, HeadroomRow.__dataclass_fields__)
    tables = Tables(rows, paired, head_rows, subset_lines, power_lines, paths, [], hull, level_lines, router_rows)
    tables.findings = phase1_findings(tables)
    write_findings(report_dir / "findings.json", tables.findings)
    paths["findings"] = report_dir / "findings.json"
    return tables


def phase1_findings(tables: Tables) -> list[Finding]:
    """Per family: the best fixed schedule, the oracle over the menu and the best learner (cited from the headroom
    table), then how the learners' test evaluations compare with the best fixed schedule (cited from the paired
    table: the verdicts' counts and the smallest Holm-adjusted McNemar p)."""
    out: list[Finding] = []
    for team in dict.fromkeys(r.team for r in tables.headroom):
        rows = [r for r in tables.headroom if r.team == team]
        best = max(rows, key=lambda r: (r.learner_success_mean, -r.learner_success_sd))
        keys = (team, best.learner)
        bf, oracle, room = (
            f"{100 * best.best_fixed_success:.1f}%",
            f"{100 * best.oracle_success:.1f}%",
            f"{100 * best.headroom:+.1f}",
        )
        succ = f"{100 * best.learner_success_mean:.1f}% ± {100 * best.learner_success_sd:.1f}"
        cap = captured_text(best)
        if math.isnan(best.replicate_oracle_success):
            out.append(
                Finding(
                    f"**{team}**: the best fixed schedule chosen on validation, {best.best_fixed}, solves {bf} of "
                    f"{best.tasks} test tasks; the oracle over the menu {oracle} (headroom {room} points, scored on the "
                    f"episodes it picks from, so it includes best-of-N luck); the best learner, {best.learner}, "
                    f"{succ} over {best.seeds} seeds, capturing {cap} of the headroom.",
                    (Cite(keys, bf), Cite(keys, oracle), Cite(keys, room), Cite(keys, succ), Cite(keys, cap)),
                )
            )
        else:
            rep, capt, luck = (
                f"{100 * best.replicate_oracle_success:.1f}%",
                f"{100 * best.capturable:+.1f}",
                f"{100 * best.luck:+.1f}",
            )
            out.append(
                Finding(
                    f"**{team}**: the best fixed schedule chosen on validation, {best.best_fixed}, solves {bf} of "
                    f"{best.tasks} test tasks; the oracle over the menu, picking per task on a replicate run (other "
                    f"sampling seeds), {rep}: a capturable headroom of {capt} points (in-sample the oracle reaches "
                    f"{oracle}; the {luck} points between the two are best-of-N luck); the best learner, "
                    f"{best.learner}, {succ} over {best.seeds} seeds"
                    + (
                        ", with no headroom to capture (no captured fraction)."
                        if cap == "—"
                        else f", capturing {cap} of the capturable headroom."
                    ),
                    tuple(Cite(keys, x) for x in (bf, rep, capt, oracle, luck, succ, cap) if x != "—"),
                )
            )
        for r in (r for r in tables.routers if r.team == team):
            ts, tc = f"{100 * r.test_success:.1f}%", f"{r.test_cost:.3g}"
            out.append(
                Finding(
                    f"**{team}**: the simple router fitted on validation, {r.router}, solves {ts} of the test tasks "
                    f"at a cost of {tc} per task; the best learner, {best.learner}, {succ}.",
                    (Cite((team, r.router), ts), Cite((team, r.router), tc), Cite(keys, succ)),
                )
            )
        learned = [p for p in tables.paired if p.team == team and not p.rule_based]
        if not learned:
            continue
        counts: dict[str, int] = {}
        for p in learned:
            counts[p.verdict] = counts.get(p.verdict, 0) + 1
        low = min(learned, key=lambda p: p.mcnemar_p_holm)
        lp = p_text(low.mcnemar_p_holm)
        out.append(
            Finding(
                f"**{team}**, each learner's test evaluation against {low.baseline} on the same tasks: "
                + ", ".join(f"{k} {v}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1]))
                + f" of {len(learned)}; the smallest Holm-adjusted McNemar p is {lp} ({low.conductor}).",
                (Cite((low.conductor, low.baseline), lp),),
            )
        )
    return out


def summary_md(
    scale: str,
    tables: Tables,
    test_eps: list[Episode],
    ledger: Sequence[Mapping[str, object]],
    fqe_rows: list[FQERow],
    selection: dict[str, stats.FQESelection],
    rules: dict[str, str],
    seeds: list[int],
    run_seed: int,
    validation_headroom: Sequence[MenuHeadroomRow] = (),
) -> list[str]:
    """The lines of ``summary.md`` (the run time is appended by the caller); ``scale``, its sentence on the tasks,
    seeds and command of the run; ``validation_headroom``, the headroom sized on validation before training."""
    caveats = not_shown(tables.headroom, tables.paired, seeds, run_seed, tables.routers)
    n_forced = sum(1 for e in ledger if e.get("forced"))
    summary = [
        "# Phase 1: learned conductors vs a menu of fixed schedules",
        "",
        scale,
        "",
        *findings_section(
            tables.findings,
            "Generated from the tables below; task-level tests of fixed trained conductors (a learner's row per "
            "training seed), Holm-adjusted across the paired table.",
        ),
        "![cost–quality plane: the menu, its hull, the oracle and the learners](report/cost_quality.png)",
        "",
        "The menu is every rule of a team's file; the best fixed schedule and every learner's hyperparameters are "
        "chosen on validation; the test split is evaluated once per released configuration "
        f"(`test_ledger.jsonl`: {len(ledger)} entries, {n_forced} forced).",
        "",
        *forced_md(ledger),
        *(
            [
                "## Headroom sized on validation, before any learner was trained",
                "",
                "The menu on the validation tasks, and again with other sampling seeds (the replicate run); the oracle "
                "picks per task on the replicate and is scored on the first run. Capturable = replicate oracle − best "
                "fixed schedule: what a router could gain on these tasks; luck = in-sample − replicate oracle. Cost is "
                "a priced team's price, else tokens, per task.",
                "",
                menu_headroom_md(validation_headroom),
                "",
            ]
            if validation_headroom
            else []
        ),
        *(
            [
                "## The simple router: one threshold on one prompt statistic",
                "",
                "The strongest simple baseline of routing: per task, one of two rules of the menu by whether one "
                "statistic of the prompt (its numbers, words, sentences or characters) is at most a threshold; the "
                "feature, threshold and rules that solve the most validation tasks (ties: cheaper), scored on the "
                "menu's test episodes. A learner that routes no better has learned no more than the prompt's size.",
                "",
                router_table_md(tables.routers),
                "",
            ]
            if tables.routers
            else []
        ),
        "## Success per difficulty level (test)",
        "",
        "A single-worker rule's row is that worker's single-shot success per level; the levels are the task "
        "generator's, never shown to a conductor (it sees the prompt).",
        "",
        *[ln for block in tables.level_lines for ln in (block, "")],
        "## Headroom: the oracle router over the menu, and what each learner captures",
        "",
        "Oracle: per test task, the best schedule of the menu in hindsight (a success if any schedule succeeds; "
        "the cheapest such). In-sample it picks on the very episodes it is scored on, so it includes best-of-N luck; "
        "the replicate oracle picks on a replicate run (the menu on the same tasks, other sampling seeds) and is "
        "scored on this one. Capturable = replicate oracle − best fixed schedule; luck = in-sample − replicate "
        "oracle; headroom = in-sample oracle − best fixed; captured = (learner − best fixed) / capturable headroom "
        "(the in-sample headroom without a replicate run), per seed, then mean ± sd. 'best rule on test' shows the "
        "selection effect a test-set choice would hide.",
        "",
        headroom_table_md(tables.headroom),
        "",
        "## Results on the test split (success: 95% Wilson interval; return, turns, tokens: 95% bootstrap)",
        "",
        format_table(tables.rows),
        "",
        "## Paired against the best fixed schedule (chosen on validation)",
        "",
        PAIRED_LEGEND + ("" if all(math.isnan(p.price_ratio) for p in tables.paired) else " " + PRICE_LEGEND),
        "",
        format_paired_table(tables.paired),
        "",
        "## The cost–quality verdict: each learner against the menu's hull at its place",
        "",
        "Each learner (per training seed) is paired with two fixed schedules of the menu read off the test plane: the "
        "most successful one costing no more than it (the hull at its cost) and the cheapest one at least as "
        "successful (the hull at its success); cost is a priced team's price, else tokens. Above the hull: more "
        "successful than the first (Holm-adjusted McNemar p < 0.05), or non-inferior to the second at a cost ≥ 25% "
        "lower whose interval lies below 1; Holm within each team's rows. The two rules are picked on the test "
        "plane, which favours them, not the learner.",
        "",
        *hull_md(tables.hull),
        "",
        "## The LLM-required subset: test tasks neither `tool_only` nor `single_shot` solves",
        "",
        "| team | conductor | tasks | success |",
        "|---|---|---:|---:|",
        *[ln for ln in tables.subset_lines if ln],
        "",
        "## Power of the non-inferiority test at this sample size",
        "",
        "Discordance: share of test tasks where the learner and the best fixed schedule differ in success. Power: "
        "of the one-sided test at a −5-point margin, α = 0.05, if the true difference were 0 at that discordance, "
        "floored at 5% (statsmodels TTestPower; before Holm); tasks for 80%: the sample that would give 80% power there.",
        "",
        "| team | learner | tasks | discordance | power | tasks for 80% |",
        "|---|---|---:|---:|---:|---:|",
        *tables.power_lines,
        "",
        "## FQE as a model-selection tool (validation split)",
        "",
        "Every learner checkpoint (mid-training and final, seed "
        f"{seeds[0]}): FQE from the training logs evaluated at the validation tasks' initial states, against "
        "the return measured on those same tasks.",
        "",
        fqe_table_md(fqe_rows, selection),
        "",
        "## What these numbers do not show",
        "",
        *caveats,
        "",
        "## Mode collapse: how varied each conductor's action sequences are (test)",
        "",
        format_collapse_table(mode_collapse(test_eps)),
        "",
        "## Distilled rules of the released learners (seed " + str(seeds[0]) + ")",
        "",
    ]
    for k, v in rules.items():
        summary += [f"### {k}", "", "```", v.rstrip(), "```", ""]
    return summary


def hull_md(rows: Sequence[PairedRow]) -> list[str]:
    """The hull table and, per learner, whether it is above the hull (no rows: a line saying so)."""
    if not rows:
        return ["No learner was evaluated against the hull."]
    above = above_hull(rows)
    verdicts = [
        f"- **{team}** / {conductor}: {'above the hull' if up else 'not above the hull'}"
        for (team, conductor), up in above.items()
    ]
    return [format_paired_table(rows), "", *verdicts]


def forced_md(ledger: Sequence[Mapping[str, object]]) -> list[str]:
    """The section listing every forced test evaluation among the ledger's entries, with its reason (no lines when
    none was forced)."""
    forced = [e for e in ledger if e.get("forced")]
    if not forced:
        return []
    lines = [
        "",
        "### Forced test evaluations",
        "",
        "Each is a second evaluation on test of a configuration the ledger already held (`--force-test REASON`); "
        "its numbers are not from a test split used once.",
        "",
        "| team | conductor | run seed | evaluated with | reason | time |",
        "|---|---|---:|---|---|---|",
    ]
    skip = ("team", "conductor", "split", "run_seed", "forced", "time")
    for e in forced:
        what = ", ".join(f"{k} {str(v)[:12] if k.endswith('sha256') else v}" for k, v in e.items() if k not in skip)
        lines.append(f"| {e['team']} | {e['conductor']} | {e['run_seed']} | {what} | {e['forced']} | {e['time']} |")
    return lines


def best_of(rows: Sequence[ResultRow], names: Sequence[str]) -> ResultRow:
    cand = [r for r in rows if r.conductor in names]
    return max(cand, key=lambda r: (r.success_rate, r.mean_return, [-ord(c) for c in r.conductor]))


def prompt_statistics(prompt: str) -> dict[str, float]:
    """What a conductor can read off a task's prompt without a model: how many numbers, words, sentences and
    characters it has (the simple router's features, :func:`orchestra.report.stats.fit_stump_router`)."""
    return {
        "numbers": float(len(re.findall(r"\d+(?:\.\d+)?", prompt))),
        "words": float(len(prompt.split())),
        "sentences": float(len(re.findall(r"[.?!](?:\s|$)", prompt))),
        "chars": float(len(prompt)),
    }


def menu_outcomes(
    eps: Sequence[Episode], menu: Sequence[str]
) -> tuple[dict[str, dict[str, tuple[bool, float]]], dict[str, dict[str, float]]]:
    """(outcomes[rule][task id] = (success, cost), prompt statistics per task id) of the menu's episodes: what a
    router over the menu is fitted on and scored by. Cost: a priced team's price, else tokens."""
    priced = _priced(eps)
    outcomes: dict[str, dict[str, tuple[bool, float]]] = {}
    features: dict[str, dict[str, float]] = {}
    for e in eps:
        if e.conductor.name in menu:
            outcomes.setdefault(e.conductor.name, {})[e.task.id] = (e.success, _cost(e, priced))
            features[e.task.id] = prompt_statistics(str(e.steps[0].state["task"]["prompt"]))
    return outcomes, features


def _priced(eps: Sequence[Episode]) -> bool:
    """Whether the cost of these episodes is their price (a priced team's worker prices), else their tokens."""
    return any(e.price > 0 for e in eps)


def _cost(e: Episode, priced: bool) -> float:
    return e.price if priced else float(e.total_tokens)


def _mean_choice(choice: Mapping[object, stats.OracleChoice]) -> tuple[float, float]:
    """(success, cost) of an oracle's picks, averaged over its tasks (nan, nan without tasks)."""
    if not choice:
        return math.nan, math.nan
    return float(np.mean([c.success for c in choice.values()])), float(np.mean([c.cost for c in choice.values()]))


def _menu_oracles(
    menu: Sequence[str],
    by: Mapping[str, Mapping[tuple[str, int], Episode]],
    rep_by: Mapping[str, Mapping[tuple[str, int], Episode]],
) -> tuple[list[tuple[str, int]], dict[object, stats.OracleChoice], dict[object, stats.OracleChoice]]:
    """The tasks every rule of ``menu`` played, the in-sample oracle router on them, and the replicate oracle (picked
    on ``rep_by``, the same tasks with other sampling seeds, matched by task id; empty without a replicate run)."""
    priced = _priced([e for m in menu for e in by[m].values()])
    tasks = sorted(set.intersection(*(set(by[m]) for m in menu)))
    outcomes = {m: {t: (by[m][t].success, _cost(by[m][t], priced)) for t in tasks} for m in menu}
    rep = menu_outcomes([e for m in menu for e in rep_by.get(m, {}).values()], menu)[0]  # by task id
    main_by_id = {m: {tid: v for (tid, _), v in outcomes[m].items()} for m in menu}
    return tasks, dict(stats.oracle_router(outcomes)), dict(stats.replicate_oracle(rep, main_by_id))


def menu_headroom(
    team: str, split: str, menu: Sequence[str], eps: Sequence[Episode], replicate: Sequence[Episode]
) -> MenuHeadroomRow:
    """The headroom over ``menu`` on one split from its episodes and a replicate run of them (other sampling seeds):
    what :func:`orchestra.jobs.phase1.validate_menu` sizes on validation before any learner is trained."""
    by = _by_task(eps)
    menu = [m for m in menu if m in by]
    tasks, oracle, r_oracle = _menu_oracles(menu, by, _by_task(replicate))
    bf = best_of(summarize(list(eps)), menu)
    (o_succ, _), (r_succ, r_cost) = _mean_choice(oracle), _mean_choice(r_oracle)
    priced = _priced(eps)
    bf_cost = float(np.mean([_cost(by[bf.conductor][t], priced) for t in tasks]))
    return MenuHeadroomRow(
        team, split, len(tasks), bf.conductor, bf.success_rate, o_succ, r_succ, r_succ - bf.success_rate,
        o_succ - r_succ, bf_cost, r_cost,
    )  # fmt: skip


def _by_task(eps: Sequence[Episode]) -> dict[str, dict[tuple[str, int], Episode]]:
    out: dict[str, dict[tuple[str, int], Episode]] = {}
    for e in eps:
        out.setdefault(e.conductor.name, {})[(e.task.id, e.seed)] = e
    return out


__all__ = [
    "Tables",
    "best_of",
    "forced_md",
    "hull_md",
    "menu_headroom",
    "phase1_findings",
    "report_tables",
    "summary_md",
]
