"""The real-LLM fine-tuning experiment's report: ``summary.md`` (the setting, every table and a reading generated from
them, as named sections) and ``learning_curves.png``."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from orchestra.experiments.harness import FULL_VOLUME, INTERIM_LOOKS, STILL_KL, Sections, cell, pval
from orchestra.experiments.llm.analysis import ACCOUNTINGS, acceptance
from orchestra.experiments.llm.config import FROZEN, LLMExperimentConfig
from orchestra.experiments.verdicts import interval_rows, null_status, verdict_findings, verdict_section
from orchestra.report.findings import Cite, Finding, findings_section
from orchestra.report.plots import plot_intervals, scheme_colour

_ACCOUNTING_TEXT = {
    "equal_stages": "equal stages (every worker updated {S} times)",
    "equal_episodes": "equal sampled episodes (teamtr's episodes at stage {S})",
    "equal_updates": "equal updates, the control (every worker updated {L} times; teamtr sampled {n}× the episodes)",
}


def _acc_text(cfg: LLMExperimentConfig, accounting: str) -> str:
    return _ACCOUNTING_TEXT[accounting].format(S=cfg.num_stages, L=cfg.long_stages, n=cfg.n_agents)


def _pct(v: float) -> str:
    return "—" if math.isnan(v) else f"{100 * v:+.1f}"


def _pts(v: float) -> str:
    """A share as points, unsigned (a spread), NaN as —."""
    return "—" if math.isnan(v) else f"{100 * v:.1f}"


def _setting(cfg: LLMExperimentConfig, seconds: float | None) -> list[str]:
    team, tr = cfg.team, cfg.trainer
    steps = " → ".join(team.pipeline) if team.pipeline else f"the team file's {team.conductor!r} schedule"
    lrs = cfg.scheme_lrs()
    lr_text = f"lr {tr.lr:g}" + (
        " (" + ", ".join(f"{s} {lr:g}" for s, lr in lrs.items()) + ": per scheme, by `orchestra experiment llm-tune`)"
        if lrs
        else ""
    )
    return [
        f"# Fine-tuning a real LLM team: {' vs '.join(cfg.schemes)} against the frozen team",
        "",
        f"Team `{team.team}` (family {team.family or 'of the team file'}, difficulty "
        f"{team.difficulty if team.difficulty is not None else 'mixed'}), fixed conductor `{team.conductor}`: {steps}. "
        f"Trainable workers: {', '.join(team.workers)} (one LoRA adapter each, r = {team.lora_r}, on one frozen "
        f"`{team.model}` base, {team.dtype} on {team.device}); sampling temperature {team.temperature:g}, at most "
        f"{team.max_tokens} new tokens per turn; reward: {team.reward}.",
        "",
        f"Trainer: {tr.num_stages} stages (equal-stages accounting; one-batch schemes run "
        f"{cfg.episode_stage('naive')} for equal episodes"
        + (f"; teamtr also runs {cfg.long_stages}, the equal-updates control" if cfg.long_stages else "")
        + f"), batches of {tr.batch_size} episodes "
        f"({tr.batch_size // team.group_size} tasks × G = {team.group_size}), {tr.optimizer} {lr_text} "
        f"(optimizer state {tr.optimizer_state}), {tr.num_epochs} epoch(s) × {tr.num_minibatches} minibatch(es), "
        f"trust region {tr.trust_region} with δ = "
        f"{tr.delta} per token, advantage {tr.advantage}. Schemes: {', '.join(cfg.schemes)}; {cfg.seeds} seeds "
        "(paired: a seed gives every scheme the same initial adapters and trainer seed).",
        "",
        f"Held out: the same {cfg.eval_tasks} `{cfg.eval_split}` tasks with the same episode seeds in every evaluation, "
        f"trainable workers decoding at temperature {team.eval_temperature:g}"
        + (" (greedy: the frozen team is played once and serves every seed)." if team.eval_temperature == 0 else "."),
        (
            f"Wall time of this invocation: {seconds / 60:.1f} min (a resumed benchmark counts only its own part; "
            "each run's training time is in the tables)."
            if seconds is not None
            else "Written from the evaluations stored in the run directory (`--report-only`: nothing played here; "
            "each run's training time is in the tables)."
        ),
        "",
    ]


def _final(cfg: LLMExperimentConfig, tables: dict[str, list[dict[str, Any]]]) -> list[str]:
    lines = [
        "## Held-out success and cost, per accounting",
        "",
        "Success and return: mean over seeds and tasks (± the SD of the per-seed means). Episodes, tokens and "
        "training wall time: sampled by training up to the stage read (mean over seeds).",
        "",
    ]
    for accounting in ACCOUNTINGS:
        rows = [r for r in tables["final"] if r["accounting"] == accounting]
        if not rows:
            continue
        lines += [
            f"**{_acc_text(cfg, accounting)}**",
            "",
            "| scheme | stage | success | ± seed SD (pts) | return | episodes | tokens sampled | train min | tokens/eval task |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for r in rows:
            lines.append(
                f"| {r['scheme']} | {r['stage']} | {r['success']:.1%} | {_pts(r['success_seed_sd'])} | "
                f"{r['ret']:.3f} | {r['episodes']:.0f} | {r['tokens']:.0f} | {r['train_seconds'] / 60:.1f} | "
                f"{r['eval_tokens']:.1f} |"
            )
        lines.append("")
    return lines


def _paired(title: str, table: Sequence[dict[str, Any]], cfg: LLMExperimentConfig, against: str | None) -> list[str]:
    lines = [
        f"## {title} (task level: descriptive only)",
        "",
        "Descriptive: these intervals and tests hold the trained adapters fixed and read run-to-run variation as an "
        "effect; the verdicts are under Verdicts over seeds. "
        "Δ = mean over tasks of the seed-averaged per-task difference, in points of success (×100) or in return; "
        "95% t interval over tasks; p: one-sample t-test over tasks (scipy), Holm-adjusted within each "
        "accounting and measure (statsmodels). Per seed: the mean difference of each seed; p (seeds): t-test over "
        "seeds, the test of the training procedure rather than of these trained adapters. MDD: the smallest true Δ "
        "the test over these tasks detects with 80% power at α = 0.05 (before Holm), given the observed spread "
        "(statsmodels' TTestPower): a Δ inside ±MDD that the test misses is not evidence of no effect. Won / lost: "
        "the (seed, task) pairs where the first team did better / worse.",
        "",
    ]
    for accounting in ACCOUNTINGS:
        for measure in ("success", "return"):
            rows = [r for r in table if r["accounting"] == accounting and r["measure"] == measure]
            if not rows:
                continue
            fmt = _pct if measure == "success" else (lambda v: cell(v))
            lines += [
                f"**{measure}, {_acc_text(cfg, accounting)}**",
                "",
                "| comparison | Δ | 95% CI | p | p (Holm) | MDD | won / lost | per seed | p (seeds) |",
                "|---|---|---|---|---|---|---|---|---|",
            ]
            for r in rows:
                name = f"{r['scheme']} − {against or r['vs']}"
                per_seed = r["per_seed"]
                if measure == "success":
                    per_seed = " ".join(f"{100 * float(v):+.1f}" for v in per_seed.split())
                lines.append(
                    f"| {name} | {fmt(r['diff'])} | [{fmt(r['lo'])}, {fmt(r['hi'])}] | {pval(r['p'])} | "
                    f"{pval(r['p_holm'])} | {fmt(r['mdd'])} | {r['won']} / {r['lost']} | {per_seed} | "
                    f"{pval(r['p_seeds'])} |"
                )
            lines.append("")
    return lines


def _reading(cfg: LLMExperimentConfig, tables: dict[str, list[dict[str, Any]]], seeds: int) -> list[str]:
    """Sentences the tables support, generated from them (nothing here is typed by hand); ``seeds``: how many seeds
    the tables read."""
    lines = ["## What the numbers show, and what they do not", ""]
    verdict = acceptance(tables)
    frozen = next((r for r in tables["final"] if r["scheme"] == FROZEN), None)
    if frozen is not None:
        band = "inside" if 0.2 <= frozen["success"] <= 0.6 else "OUTSIDE"
        lines.append(
            f"- The frozen team solves {frozen['success']:.1%} of the held-out tasks ({band} the 20–60% band)."
        )
    lines += _seed_reading(cfg, tables)
    lines.append(
        "- Every sentence below is task level and descriptive only: the trained adapters held fixed, so run-to-run "
        "variation reads as an effect there; no verdict about the schemes is drawn from it."
    )
    for accounting in ACCOUNTINGS:
        row = next(
            (
                r
                for r in tables["vs_frozen"]
                if r["accounting"] == accounting and r["scheme"] == "teamtr" and r["measure"] == "success"
            ),
            None,
        )
        if row is None:
            continue
        text = _acc_text(cfg, accounting)
        if verdict.get(accounting):
            lines.append(
                f"- At {text}, teamtr improves held-out success over the frozen team by {_pct(row['diff'])} points "
                f"(95% CI [{_pct(row['lo'])}, {_pct(row['hi'])}], Holm p {pval(row['p_holm'])}); per seed "
                f"{row['per_seed']}, p over seeds {pval(row['p_seeds'])}."
            )
        else:
            lines.append(
                f"- At {text}, teamtr does NOT improve held-out success over the frozen team with a 95% interval "
                f"above 0: Δ {_pct(row['diff'])} points, CI [{_pct(row['lo'])}, {_pct(row['hi'])}], Holm p "
                f"{pval(row['p_holm'])}. "
                + (
                    f"With {row['tasks']} tasks the test detects a true Δ of {_pct(row['mdd']).lstrip('+')} points "
                    "with 80% power; smaller effects are neither shown nor ruled out."
                    if math.isfinite(row["mdd"])
                    else "The two teams played every held-out task alike: there is no difference to test."
                )
            )
    for accounting in ACCOUNTINGS:  # the other schemes against the frozen team
        gains = [
            r
            for r in tables["vs_frozen"]
            if r["accounting"] == accounting
            and r["measure"] == "success"
            and r["scheme"] != "teamtr"
            and r["p_holm"] < 0.05
            and r["lo"] > 0
        ]
        if gains:
            listed = "; ".join(
                f"{r['scheme']} {_pct(r['diff'])} points [{_pct(r['lo'])}, {_pct(r['hi'])}] (Holm p "
                f"{pval(r['p_holm'])}; per seed {_seed_text(r)})"
                for r in gains
            )
            lines.append(
                f"- Other schemes that improve held-out success over the frozen team at {_acc_text(cfg, accounting)} "
                f"(95% interval above 0, Holm p < 0.05 over tasks): {listed}."
            )
    for room in tables.get("headroom", []):
        lines.append(
            f"- Headroom: a per-task oracle that picks, with the answer in hand, the best of the {room['teams']} "
            f"evaluated teams (every scheme, seed and stage, and the frozen team) solves {room['oracle']:.1%} of the "
            f"{room['tasks']} tasks; {room['never']:.1%} are solved by none. That figure counts training-seed luck "
            "as headroom, and it is not a bound on what training could reach."
            + (
                f" Capturable, cross-fitted over seeds: a per-task choice among the {room['configs']} configurations "
                "(scheme and stage, the frozen team included) made on one half of the seeds and scored on the other "
                f"reaches {room['crossfit_oracle']:.1%}, against {room['crossfit_fixed']:.1%} for the best single "
                f"configuration chosen the same way: {_pct(room['capturable'])} points a per-task choice among these "
                "configurations could capture."
                if math.isfinite(room["crossfit_oracle"])
                else ""
            )
        )
    for accounting in ACCOUNTINGS:
        sig = [
            r
            for r in tables["pairwise"]
            if r["accounting"] == accounting and r["measure"] == "success" and r["p_holm"] < 0.05
        ]
        text = _acc_text(cfg, accounting)
        if sig:
            pairs = "; ".join(
                f"{r['scheme']} − {r['vs']} {_pct(r['diff'])} points (Holm p {pval(r['p_holm'])})" for r in sig
            )
            lines.append(f"- Scheme differences in success that survive Holm at {text}: {pairs}.")
        elif any(r["accounting"] == accounting for r in tables["pairwise"]):
            lines.append(f"- No difference in success between two schemes survives Holm at {text}.")
    for r in tables["pairwise"]:  # the control: does an equal-episodes gap survive equal updates?
        if r["accounting"] != "equal_episodes" or r["measure"] != "success" or "teamtr" not in (r["scheme"], r["vs"]):
            continue
        if {r["scheme"], r["vs"]} <= FULL_VOLUME:  # sampled alike at every stage: read by the freshness control
            continue
        same = next(
            (
                c
                for c in tables["pairwise"]
                if c["accounting"] == "equal_updates"
                and c["measure"] == "success"
                and (c["scheme"], c["vs"]) == (r["scheme"], r["vs"])
            ),
            None,
        )
        if same is None:
            continue
        kept = (
            "survives" if same["p_holm"] < 0.05 and np.sign(same["diff"]) == np.sign(r["diff"]) else "does not survive"
        )
        lines.append(
            f"- Control, {r['scheme']} − {r['vs']}: {_pct(r['diff'])} points at equal sampled episodes (Holm p "
            f"{pval(r['p_holm'])}), {_pct(same['diff'])} points [{_pct(same['lo'])}, {_pct(same['hi'])}] at "
            f"{_acc_text(cfg, 'equal_updates')} (Holm p {pval(same['p_holm'])}): the equal-episodes difference "
            + (f"{kept} when the updates are equal" if r["p_holm"] < 0.05 else "was not significant to begin with")
            + f" (over tasks). Over seeds, at equal updates: {_seed_text(same)}."
        )
    lines += _freshness_control(cfg, tables)
    lines += [
        "- The task-level intervals hold the trained adapters fixed; with "
        f"{seeds} seeds, the seed-level p values are the evidence about the training procedure, and they are "
        "weak by construction. One team, one family, one model size and one trainer setting: nothing here says how "
        "the schemes compare elsewhere.",
        "",
    ]
    return lines


def _seed_reading(cfg: LLMExperimentConfig, tables: dict[str, list[dict[str, Any]]]) -> list[str]:
    """The verdicts over seeds in a sentence each: the null check, then the primary family."""
    nulls, rows = tables.get("null_check", []), tables.get("seed_verdicts", [])
    status = null_status(nulls)
    lines = []
    if nulls:
        a, b = nulls[0]["a"], nulls[0]["b"]
        lines.append(
            f"- Null check over seeds ({a} against {b if a != b else 'itself'} on disjoint seeds): {status}"
            + (": every verdict over seeds is refused." if status == "FAILS" else ".")
        )
    for r in rows:
        if r["family"] != "primary" or r["same_as"]:
            continue
        lines.append(
            f"- Primary, over {r['seeds']} seeds at {_acc_text(cfg, r['accounting'])}: {r['scheme']} − {r['vs']} "
            f"{_pct(r['diff'])} points [{_pct(r['lo'])}, {_pct(r['hi'])}], Holm p {pval(r['p_holm'])}, MDE "
            f"{_pct(r['mde']).lstrip('+')} points: {r['verdict']}."
        )
    return lines


def _freshness_control(cfg: LLMExperimentConfig, tables: dict[str, list[dict[str, Any]]]) -> list[str]:
    """The ``stale_indep`` control against teamtr, where both ran: the same episodes and updates per worker, each
    worker learning from a batch of its own, differing only in who sampled it (teamtr: the team with the previous
    workers' updates of this stage; stale_indep: the stage-start team). Read at equal stages and at equal updates,
    where the two have sampled alike."""
    lines: list[str] = []
    for accounting, stage in (("equal_stages", cfg.num_stages), ("equal_updates", cfg.long_stages)):
        row = next(
            (
                r
                for r in tables["pairwise"]
                if r["accounting"] == accounting
                and r["measure"] == "success"
                and {r["scheme"], r["vs"]} == {"teamtr", "stale_indep"}
            ),
            None,
        )
        if row is None:
            continue
        sign = 1.0 if row["scheme"] == "teamtr" else -1.0  # teamtr − stale_indep, whatever order the table holds
        d, lo, hi = sign * row["diff"], min(sign * row["lo"], sign * row["hi"]), max(sign * row["lo"], sign * row["hi"])
        if not row["p_holm"] < 0.05:  # nan (no difference at all) included
            reading = "no difference survives Holm over tasks"
        elif d < 0:
            reading = (
                "fresh sampling does worse than the stale batches over tasks: the per-worker episodes alone do not "
                "explain a teamtr deficit"
            )
        else:
            reading = "fresh sampling does better than the stale batches over tasks"
        seeds = _seed_text(
            {
                **row,
                "per_seed": " ".join(f"{sign * float(v):g}" for v in str(row["per_seed"]).split()),
                "scheme": "teamtr",
                "vs": "stale_indep",
            }
        )
        lines.append(
            f"- Freshness control after {stage} stages, teamtr − stale_indep (the same episodes and updates per "
            "worker, each worker with a batch of its own; only the sampler differs: the team as updated by the "
            f"stage's previous workers, or the stage-start team): {_pct(d)} points [{_pct(lo)}, {_pct(hi)}], "
            f"Holm p {pval(row['p_holm'])}; {reading}. Over seeds: {seeds}."
        )
    return lines


def _seed_text(row: Mapping[str, Any]) -> str:
    """A pairwise row's seed-level reading: the per-seed differences, whether they agree in sign, the t-test over
    seeds (the evidence about the training procedure rather than about these trained adapters)."""
    d = [float(v) for v in str(row["per_seed"]).split()]
    signs = {int(np.sign(v)) for v in d}
    if signs == {1} or signs == {-1}:
        agree = f"every seed favours {row['scheme'] if signs == {1} else row['vs']}"
    elif signs == {0}:
        agree = "no seed shows a difference"
    else:
        agree = "the seeds do not agree in sign"
    return f"{' / '.join(f'{100 * v:+.1f}' for v in d)} points ({agree}), p over seeds {pval(row['p_seeds'])}"


def _interim(missing: Sequence[tuple[str, int, int]], seeds_read: int, seeds: int) -> list[str]:
    if not missing:
        return []
    by: dict[str, list[str]] = {}
    for scheme, seed, stage in missing:
        by.setdefault(scheme, []).append(f"seed {seed} stage {stage}")
    listed = "; ".join(f"{scheme}: {', '.join(keys)}" for scheme, keys in by.items())
    if seeds_read < seeds:
        read = (
            f"Every table below reads seed{'s 0–' if seeds_read > 1 else ' '}{seeds_read - 1} only, "
            f"the seed{'s' if seeds_read > 1 else ''} every scheme has completed (the runs go seed-major), so each "
            f"comparison is paired over {seeds_read} of the {seeds} seeds"
            + (
                ": one seed is one run, from which nothing about a training procedure can be inferred"
                if seeds_read == 1
                else ". The verdicts are planned at "
                f"{seeds} seeds: a verdict read at an interim look is not that test ({INTERIM_LOOKS})"
            )
        )
    else:
        read = "Every table below holds only the comparisons whose evaluations are complete for every seed"
    return [
        f"**Interim report: {len(missing)} evaluation{' is' if len(missing) == 1 else 's are'} not in yet** "
        f"({listed}). {read}; rerun the same command to continue.",
        "",
    ]


def _mechanism(cfg: LLMExperimentConfig, table: Sequence[Mapping[str, Any]]) -> list[str]:
    """What the update mechanism did, per scheme (``mechanism.csv``): read before any difference between schemes."""
    t = cfg.trainer
    lines = [
        "## What the update mechanism did",
        "",
        f"Per scheme, over every agent-update of every seed. An update takes up to {t.num_epochs} epoch(s) × "
        f"{t.num_minibatches} minibatch(es) = {t.num_epochs * t.num_minibatches} optimizer steps; the trust region "
        f"({t.trust_region}, δ = {t.delta} per token) *acted* when it shortened or reverted a step (or its penalty "
        "was on); *did not move*: the steps it kept left the agent where it was (realised KL < "
        f"{STILL_KL:g}: every group's rewards in its batch tied, so no learning signal); KL / δ is the realised "
        "per-token KL of the kept step against the budget; the clip fraction is the PPO clip's share of tokens in "
        "the losses the steps were taken on.",
        "",
    ]
    if not table:
        return [*lines, "No update recorded yet.", ""]
    lines += [
        "| scheme | agent-updates | steps / update | trust region acted | did not move | KL / δ | clip during steps |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in table:
        steps, acted = _mechanism_cells(r)
        lines.append(
            f"| {r['scheme']} | {r['agent_updates']} | {steps} | {acted} | {r['still_share']:.0%} | "
            f"{cell(r['kl_over_delta'], 2)} | {100 * r['step_clip_fraction']:.2f}% |"
        )
    return [*lines, ""]


def _acc_short(accounting: str) -> str:
    return accounting.replace("_", " ")


def _mechanism_cells(r: Mapping[str, Any]) -> tuple[str, str]:
    return f"{r['steps_per_update']:.2f}", f"{r['acted_share']:.0%}"


def findings(cfg: LLMExperimentConfig, tables: dict[str, list[dict[str, Any]]]) -> list[Finding]:
    """The report's findings, each number cited from a table of the report: what the update mechanism did, then the
    verdicts over seeds (null check, primary family, secondary comparisons that came out different)."""
    out: list[Finding] = []
    parts, cites = [], []
    for r in tables["mechanism"]:
        steps, acted = _mechanism_cells(r)
        still = f"{r['still_share']:.0%}"
        parts.append(
            f"{r['scheme']} {steps} steps per update, the trust region acting in {acted} of updates"
            + (f", {still} of updates without learning signal (the agent did not move)" if r["still_share"] else "")
        )
        keys = (str(r["scheme"]), str(r["agent_updates"]))
        cites += [Cite(keys, steps), Cite(keys, acted), *([Cite(keys, still)] if r["still_share"] else [])]
    if parts:
        out.append(
            Finding(
                f"The update mechanism (up to {cfg.trainer.num_epochs * cfg.trainer.num_minibatches} optimizer steps "
                f"per update, δ = {cfg.trainer.delta}): " + "; ".join(parts) + ".",
                tuple(cites),
            )
        )
    if tables.get("null_check") is not None and tables.get("seed_verdicts") is not None:
        out += verdict_findings(tables, _pct, _acc_short, prefix="Held-out success in points, ")
    return out


def summary_sections(
    cfg: LLMExperimentConfig,
    tables: dict[str, list[dict[str, Any]]],
    seconds: float | None,
    missing: Sequence[tuple[str, int, int]] = (),
    seeds_read: int | None = None,
) -> Sections:
    """``summary.md`` as named sections: setting (marked interim when ``missing`` names evaluations not played
    yet; ``seeds_read``: the seeds its tables read, when fewer than ``cfg.seeds``), final, mechanism (what the trust region and the clip did), seeds (the verdicts over seeds), vs_frozen and pairwise (task level, descriptive), reading, files."""
    read = cfg.seeds if seeds_read is None else seeds_read
    figures = ["![held-out success and training reward against sampled episodes](learning_curves.png)", ""]
    if tables.get("seed_verdicts"):
        figures += ["![teamtr − each scheme over seeds, 95% intervals; filled: the primary family](verdicts.png)", ""]
    return {
        "setting": _setting(cfg, seconds) + _interim(missing, read, cfg.seeds),
        "findings": findings_section(
            findings(cfg, tables),
            (
                f"**An interim look at {read} of the {cfg.seeds} seeds: the verdicts below are not the planned test.** "
                if 1 < read < cfg.seeds
                else ""
            )
            + "Generated from the tables below. A run is the unit: the declared primary family (teamtr − naive, "
            "teamtr − stale_indep) is Holm-corrected; secondary comparisons appear only where they came out "
            "different, uncorrected.",
        )
        + figures,
        "final": _final(cfg, tables),
        "mechanism": _mechanism(cfg, tables["mechanism"]),
        "seeds": verdict_section(
            tables,
            _pct,
            f"its held-out success (the share of the {cfg.eval_tasks} held-out tasks it solves at the accounting's "
            "stage, in points)",
            _acc_short,
            level=lambda v: "—" if math.isnan(v) else f"{100 * v:.1f}",
        ),
        "vs_frozen": _paired("Against the frozen team", tables["vs_frozen"], cfg, FROZEN),
        "pairwise": _paired("Between schemes", tables["pairwise"], cfg, None),
        "reading": _reading(cfg, tables, read),
        "files": [
            "Files (in the benchmark's `--out` directory): `evals.csv` (one row per evaluation and task), `final.csv`, `vs_frozen.csv`, `pairwise.csv`, "
            "`seed_verdicts.csv`, `null_check.csv`, `seed_iqm.csv`, "
            "`curves.csv`, `headroom.csv`, `training.csv`, `mechanism.csv`, `learning_curves.png`, `verdicts.png` (with verdicts), `runs/{scheme}-seed{s}/` (each run's config, "
            "metrics and checkpoints).",
            "",
        ],
    }


def plot(
    cfg: LLMExperimentConfig, rows: Sequence[dict[str, Any]], tables: dict[str, list[dict[str, Any]]], out: Path
) -> None:
    """``learning_curves.png``: held-out success against sampled episodes (mean over seeds with the seeds' range as a
    band, seeds as dots) and the training batches' mean reward against sampled episodes; with verdicts,
    ``verdicts.png`` (teamtr − each scheme over seeds, 95% intervals, in points)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    frozen = [r["success"] for r in tables["curves"] if r["scheme"] == FROZEN]
    if frozen:
        axes[0].axhline(float(np.mean(frozen)), color=scheme_colour(FROZEN), ls="--", label="frozen")
    for scheme in cfg.schemes:
        pts = [r for r in tables["curves"] if r["scheme"] == scheme]
        if not pts:
            continue
        by_stage: dict[int, list[dict[str, Any]]] = {}
        for r in pts:
            by_stage.setdefault(r["stage"], []).append(r)
        stages = sorted(by_stage)
        x = [float(np.mean([r["episodes"] for r in by_stage[s]])) for s in stages]
        y = [float(np.mean([r["success"] for r in by_stage[s]])) for s in stages]
        colour = scheme_colour(scheme)
        axes[0].plot(x, y, "-o", label=scheme, color=colour)
        lo = [min(r["success"] for r in by_stage[s]) for s in stages]
        hi = [max(r["success"] for r in by_stage[s]) for s in stages]
        axes[0].fill_between(x, lo, hi, color=colour, alpha=0.15, lw=0)
        axes[0].scatter([r["episodes"] for r in pts], [r["success"] for r in pts], s=8, color=colour, alpha=0.4)
        train = [r for r in tables["training"] if r["scheme"] == scheme]
        if train:
            eps = sorted({r["episodes"] for r in train})
            axes[1].plot(
                eps,
                [float(np.mean([r["reward"] for r in train if r["episodes"] == e])) for e in eps],
                label=scheme,
                color=colour,
                alpha=0.8,
            )
    axes[0].set_xlabel("sampled episodes")
    axes[0].set_ylabel("held-out success")
    axes[0].legend(fontsize=8)
    axes[1].set_xlabel("sampled episodes")
    axes[1].set_ylabel(f"training batch reward ({cfg.team.reward})")
    fig.tight_layout()
    fig.savefig(out / "learning_curves.png", dpi=100)
    plt.close(fig)
    if tables.get("seed_verdicts"):
        plot_intervals(
            [
                (label, 100 * d, 100 * lo, 100 * hi, primary, vs)
                for label, d, lo, hi, primary, vs in interval_rows(tables, _acc_short)
            ],
            out / "verdicts.png",
            "teamtr − scheme, held-out success (points; mean over seeds, 95% t interval)",
            "filled: the primary family (Holm); hollow: secondary",
        )


__all__ = ["plot", "summary_sections"]
