"""The phase-1 protocol's own tables (``orchestra.jobs.phase1``): headroom over the menu, FQE as a
model-selection tool, the LLM-required subset, and the caveats printed under them."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from orchestra.report import stats
from orchestra.report.rows import PairedRow


@dataclass
class FQERow:
    team: str
    policy: str  # CONFIG@EPOCH
    fqe_estimate: float  # FQE value at the validation tasks' initial states, from the training logs alone
    measured_return: float  # mean return measured on those validation tasks
    measured_ci_low: float
    measured_ci_high: float


@dataclass
class HeadroomRow:
    """Per family: the menu's best fixed schedule (chosen on validation), the oracle router over the menu,
    and what each released learner captures of the gap (mean ± sd over training seeds)."""

    team: str
    tasks: int
    best_fixed: str
    best_fixed_success: float
    best_on_test: str  # the rule that would have been picked on test (for the selection effect only)
    best_on_test_success: float
    oracle_success: float
    headroom: float
    learner: str
    learner_success_mean: float
    learner_success_sd: float
    captured_mean: float
    captured_sd: float
    seeds: int
    oracle_cost: float = float("nan")  # mean cost per task of the oracle's picks: tokens, or a priced team's price
    # the oracle picked per task on the replicate run (other sampling seeds) and scored on this one
    # (stats.replicate_oracle); nan without a replicate run
    replicate_oracle_success: float = float("nan")
    capturable: float = float("nan")  # replicate oracle − best fixed: what a router could capture
    luck: float = float("nan")  # in-sample oracle − replicate oracle: best-of-N luck, capturable by no router


@dataclass
class MenuHeadroomRow:
    """Per family, the headroom over the menu on one split, before any learner is involved: the best fixed schedule,
    the oracle in-sample and picked on a replicate run (other sampling seeds), capturable = replicate oracle − best
    fixed, luck = in-sample − replicate oracle. Sized on validation, before any learner is trained."""

    team: str
    split: str
    tasks: int
    best_fixed: str
    best_fixed_success: float
    oracle_success: float  # in-sample: picks on the episodes it is scored on
    replicate_oracle_success: float  # picks on the replicate run, scored on this one (nan without one)
    capturable: float
    luck: float
    best_fixed_cost: float  # mean cost per task: tokens, or a priced team's price
    replicate_oracle_cost: float


@dataclass
class RouterRow:
    """Per family, the simple router (one threshold on one prompt statistic, between two rules of the menu; fitted
    on the validation run of the menu, :func:`orchestra.report.stats.fit_stump_router`) scored on the test run."""

    team: str
    router: str  # its rule in words, e.g. `coder` if numbers ≤ 3, else `specialist`
    validation_success: float
    test_success: float
    test_cost: float  # mean per task: tokens, or a priced team's price
    tasks: int


def router_table_md(rows: Sequence[RouterRow]) -> str:
    lines = [
        "| team | simple router (fitted on validation) | validation success | test success | test cost | tasks |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r.team} | {r.router} | {_pct(r.validation_success)} | {_pct(r.test_success)} | {r.test_cost:.3g} | "
            f"{r.tasks} |"
        )
    return "\n".join(lines)


def menu_headroom_md(rows: Sequence[MenuHeadroomRow]) -> str:
    lines = [
        "| team | split | tasks | best fixed | its success | oracle (in-sample) | oracle (replicate) | capturable (pts) "
        "| luck (pts) | cost: best fixed → replicate oracle |",
        "|---|---|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r.team} | {r.split} | {r.tasks} | {r.best_fixed} | {_pct(r.best_fixed_success)} | "
            f"{_pct(r.oracle_success)} | {_pct(r.replicate_oracle_success)} | {_pts(r.capturable)} | {_pts(r.luck)} | "
            f"{r.best_fixed_cost:.3g} → {r.replicate_oracle_cost:.3g} |"
        )
    return "\n".join(lines)


def level_table_md(team: str, names: Sequence[str], by: dict[str, dict[Any, Any]], levels: dict[Any, int]) -> str:
    """Success per difficulty level of each named conductor over ``levels`` (task key -> level): a single-worker
    rule's row is that worker's single-shot success per level. ``by[conductor][task key]`` is an Episode."""
    ks = sorted(set(levels.values()))
    lines = [
        f"| team | conductor | {' | '.join(f'level {k}' for k in ks)} |",
        "|---|---|" + "---:|" * len(ks),
    ]
    for c in names:
        cells = []
        for k in ks:
            got = [by[c][t].success for t, lv in levels.items() if lv == k and t in by.get(c, {})]
            cells.append(f"{100 * float(np.mean(got)):.1f}% ({sum(got)}/{len(got)})" if got else "—")
        lines.append(f"| {team} | {c} | {' | '.join(cells)} |")
    return "\n".join(lines)


def fqe_table_md(rows: Sequence[FQERow], selection: dict[str, stats.FQESelection]) -> str:
    lines = [
        "| team | policies | Spearman ρ (FQE vs measured) | p | FQE's pick | regret of that pick |",
        "|---|---:|---:|---:|---|---:|",
    ]
    for team, sel in selection.items():
        pol = [r for r in rows if r.team == team]
        lines.append(
            f"| {team} | {sel.n_policies} | {sel.spearman:+.2f} | {sel.spearman_p:.3f} | {pol[sel.picked].policy} | "
            f"{sel.regret:.3f} |"
        )
    lines += ["", "| team | policy | FQE estimate | measured return [95% CI] |", "|---|---|---:|---|"]
    for r in rows:
        lines.append(
            f"| {r.team} | {r.policy} | {r.fqe_estimate:.3f} | {r.measured_return:.3f} "
            f"[{r.measured_ci_low:.3f}, {r.measured_ci_high:.3f}] |"
        )
    return "\n".join(lines)


def _pts(x: float) -> str:
    return "—" if math.isnan(x) else f"{100 * x:+.1f}"


def _pct(x: float) -> str:
    return "—" if math.isnan(x) else f"{100 * x:.1f}%"


def captured_text(r: HeadroomRow) -> str:
    """A learner's captured fraction as the headroom table shows it: ``mean ± sd``, or — without headroom to
    capture (the replicate oracle at or below the best fixed schedule)."""
    return "—" if math.isnan(r.captured_mean) else f"{r.captured_mean:+.2f} ± {r.captured_sd:.2f}"


def headroom_table_md(rows: Sequence[HeadroomRow]) -> str:
    lines = [
        "| team | tasks | best fixed (validation) | its test success | best rule on test | oracle (in-sample) "
        "| headroom (pts) | oracle (replicate) | capturable (pts) | luck (pts) | learner | success (mean ± sd) "
        "| captured (mean ± sd) | seeds |",
        "|---|---:|---|---:|---|---:|---:|---:|---:|---:|---|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r.team} | {r.tasks} | {r.best_fixed} | {100 * r.best_fixed_success:.1f}% | {r.best_on_test} "
            f"({100 * r.best_on_test_success:.1f}%) | {100 * r.oracle_success:.1f}% | {_pts(r.headroom)} | "
            f"{_pct(r.replicate_oracle_success)} | {_pts(r.capturable)} | {_pts(r.luck)} "
            f"| {r.learner} | {100 * r.learner_success_mean:.1f}% ± {100 * r.learner_success_sd:.1f} "
            f"| {captured_text(r)} | {r.seeds} |"
        )
    return "\n".join(lines)


def subset_table_md(team: str, names: Sequence[str], by: dict[str, dict[Any, Any]], tasks: Sequence[Any]) -> str:
    """Success on the LLM-required subset: tasks that neither the tool-only nor the single-shot schedule solves."""
    lines = []
    for c in names:
        got = [by[c][t].success for t in tasks if t in by.get(c, {})]
        if got:
            lines.append(f"| {team} | {c} | {len(got)} | {100 * float(np.mean(got)):.1f}% |")
    return "\n".join(lines)


def _cost_lo(p: PairedRow) -> float:
    """The lower end of a paired row's cost ratio interval: price on a priced team, else tokens."""
    return p.tokens_ratio_lo if math.isnan(p.price_ratio_lo) else p.price_ratio_lo


def _span(xs: Sequence[float], fmt: str) -> str:
    lo, hi = min(xs), max(xs)
    return f"{lo:{fmt}}" if f"{lo:{fmt}}" == f"{hi:{fmt}}" else f"{lo:{fmt}} to {hi:{fmt}}"


def _baseline(paired: Sequence[PairedRow], team: str) -> str:
    return next(p.baseline for p in paired if p.team == team)


def not_shown(
    head: Sequence[HeadroomRow],
    paired: Sequence[PairedRow],
    seeds: Sequence[int],
    run_seed: int,
    routers: Sequence[RouterRow] = (),
) -> list[str]:
    """Plain-words caveats, some read off the results (small headroom, a validation choice that differs on test,
    verdicts that rest on few tasks, learners no better than the simple router), some always true of this design."""
    out = []
    for r in routers:
        rows = [h for h in head if h.team == r.team]
        if not rows:
            continue
        best = max(rows, key=lambda h: h.learner_success_mean)
        gap = best.learner_success_mean - r.test_success
        out.append(
            f"- **{r.team}**: the simple router fitted on validation ({r.router}) solves {_pct(r.test_success)} of the "
            f"test tasks; the best learner, {best.learner}, {_pct(best.learner_success_mean)} on average, "
            + (
                f"{100 * gap:+.1f} points: its routing is no more than what the prompt's size tells."
                if gap <= 0.02
                else f"{100 * gap:+.1f} points above it (over tasks and seeds of fixed models, not a test)."
            )
        )
    for team in sorted({h.team for h in head}):
        h = next(x for x in head if x.team == team)
        room, which = (h.headroom, "the oracle") if math.isnan(h.capturable) else (h.capturable, "the replicate oracle")
        if room < 0.10:
            out.append(
                f"- **{team}**: {which} leaves {100 * room:.1f} points over the best fixed schedule, under 10: "
                "a router over this menu cannot do much better here, so a learner's captured fraction is mostly noise."
            )
        if not math.isnan(h.luck) and h.luck > 0:
            out.append(
                f"- **{team}**: {100 * h.luck:.1f} points of the in-sample oracle are best-of-N luck (it picks on the "
                "episodes it is scored on); no router can capture them."
            )
        if not math.isnan(h.luck) and h.luck == 0:
            out.append(
                f"- **{team}**: no best-of-N luck: the oracle picked on the replicate run scores what the in-sample one "
                "does (workers that decode greedily replay the same episodes under other sampling seeds). The "
                "headroom is a ceiling of per-task routing over this menu, reachable only by a router that tells the "
                "tasks apart from what it sees; it is not a ceiling of sampling more."
            )
        if h.best_on_test != h.best_fixed:
            out.append(
                f"- **{team}**: validation chose `{h.best_fixed}` ({100 * h.best_fixed_success:.1f}% on test); on test "
                f"`{h.best_on_test}` did best ({100 * h.best_on_test_success:.1f}%). Choosing on test would have "
                "raised the bar the learners are compared with; we did not."
            )
    good = ("beats", "better", "cheaper", "non-inferior")
    wins = [p for p in paired if not p.rule_based and p.verdict in good]
    if not wins:
        out.append("- No learned conductor is better, cheaper or non-inferior by test against the best fixed schedule.")
    for team in sorted({p.team for p in wins}):
        # a learner's verdict that a rule of the menu also earns, against the same baseline, shows a costly or weak
        # baseline on test, not something learning found that the menu lacks
        for verdict in good:
            learners = sorted(p.conductor for p in wins if p.team == team and p.verdict == verdict)
            rules = sorted(p.conductor for p in paired if p.team == team and p.rule_based and p.verdict == verdict)
            if learners and rules:
                out.append(
                    f"- **{team}**: the learners' *{verdict}* verdicts ({', '.join(f'`{x}`' for x in learners)}) are "
                    f"earned against `{_baseline(paired, team)}` by "
                    f"rules of the menu too ({', '.join(f'`{x}`' for x in rules)}): they are about the baseline "
                    "as much as about learning, and do not show that a learner found a schedule the menu lacks."
                )
    for team in sorted({p.team for p in paired}):
        # more successful than the baseline, at a cost whose interval lies above it: success bought, not found free
        costly = [
            p for p in paired
            if p.team == team and not p.rule_based and p.success_diff > 0 and _cost_lo(p) > 1
        ]  # fmt: skip
        if costly:
            what = "price" if not math.isnan(costly[0].price_ratio) else "tokens"
            ratios = [p.price_ratio if what == "price" else p.tokens_ratio for p in costly]
            out.append(
                f"- **{team}**: {', '.join(f'`{p.conductor}`' for p in costly)} solve more tasks than "
                f"`{costly[0].baseline}` ({_span([100 * p.success_diff for p in costly], '+.1f')} points) at "
                f"{_span(ratios, '.2f')}× its {what}, with a return difference (success net of the reward's costs) "
                f"of {_span([p.return_diff for p in costly], '+.3f')}: they buy success with cost. Whether that is "
                "worth it is the cost–quality verdict's question, not the success column's."
            )
    out += [
        "- The oracle is the best of *this* menu per task, not the best possible conductor; a stronger hand-written "
        "rule would raise the best fixed schedule and shrink the headroom.",
        "- The training seeds vary the learner's initialisation and minibatches, not the tasks or the LLM's samples "
        f"(fixed by run seed {run_seed}, so comparisons stay paired); {len(seeds)} seeds give a spread, "
        "not a confidence interval over seeds.",
        "- One embedded model (SmolLM2-135M, 4-bit). A larger model changes which tasks need which schedule; the "
        "menu's ranking need not carry over.",
    ]
    return out


__all__ = [
    "FQERow",
    "HeadroomRow",
    "captured_text",
    "fqe_table_md",
    "headroom_table_md",
    "router_table_md",
    "RouterRow",
    "not_shown",
    "subset_table_md",
]
