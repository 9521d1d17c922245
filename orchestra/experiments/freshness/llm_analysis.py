"""The LLM freshness experiment's statistics and report: pure functions from the rows of ``pairs.csv`` (one per
replicate pair, :mod:`~orchestra.experiments.freshness.llm_run`) to the one-row table ``result`` and ``summary.md``.

The unit is the replicate pair, as on the chain (:mod:`~orchestra.experiments.freshness.analysis`, whose statistics
are used as they are): d = success_fresh − success_stale of one pair is the difference of two greedy plays of the
same held-out tasks with the same episode seeds, so it carries the pair's batches and the tasks' discreteness
(multiples of 1 / eval_tasks), and the spread between pairs holds both. Mean d with a 95% t interval over pairs,
the one-sample t-test p and the minimum detectable effect (80% power); one comparison, so Holm leaves its p as it is.
The null check applies the same statistics to the difference of the two null arms, 0 in expectation: it passes when
its p is ≥ 0.05.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from scipy.stats import binomtest

from orchestra.experiments.freshness.analysis import holm, null_check_passes, paired_summary, verdict
from orchestra.experiments.harness import INTERIM_LOOKS, STILL_KL, Sections, Tables, cell, pval

if TYPE_CHECKING:
    from orchestra.experiments.freshness.llm_config import LLMFreshnessConfig

# the arms of a pair (pairs.csv's column suffixes) and their names in the tables
ARM_NAMES = {"stale": "stale (S)", "fresh": "fresh (F)", "null_a": "null (S1)", "null_b": "null (S2)"}
# per arm, what its update of the last worker did (column prefix → the update's metric): per-token KL(π_old ‖ π_new)
# on its batch (the trust region's own measure), optimizer steps kept, whether the trust region acted (a step
# shortened or reverted)
STEP_FIELDS = {"kl": "kl_trust", "steps": "optimizer_steps", "acted": "trust_region_acted"}


def posed(row: dict[str, Any]) -> bool:
    """Whether a pair poses the question: its upstream worker(s) moved. Where they did not (their batch S carried no
    learning signal), F is S exactly and fresh − stale is 0 by construction; such a pair's arms are not played."""
    return bool(row["upstream_kl"] >= STILL_KL)


def analyse(rows: Sequence[dict[str, Any]]) -> Tables:
    """``result``: one row over the pairs that pose the question (:func:`posed`): held-out success at the branch and
    after each arm (means), fresh − stale and fresh − the first null arm (:func:`paired_summary`; ``*_p_holm``: Holm
    within each family, of one comparison), the stale gap and the realised steps (means; TR acted: the share of
    updates); the null difference over every pair whose null arms were played; ``all_*``: fresh − stale over every
    pair, a pair that does not pose the question counted as 0 (its value by construction); ``unposed``: how many.
    Secondary, for the mechanism: ``reuse_*``, stale − the mean of the two null arms (S reused against independent
    batches, the same team state); ``step_<arm>_*``, each arm's success − success at the branch; ``moved_*``, fresh −
    stale over the pairs whose fresh arm moved (descriptive: it selects on the fresh batch)."""
    rs = sorted(rows, key=lambda r: r["pair"])
    if not rs:
        return {"result": []}
    ps = [r for r in rs if posed(r)]
    nulls = [r for r in rs if math.isfinite(r["null_diff"])]
    families = {
        "diff": [r["diff"] for r in ps],
        "all": [r["diff"] if posed(r) else 0.0 for r in rs],
        "null": [r["null_diff"] for r in nulls],
        "indep": [r["success_fresh"] - r["success_null_a"] for r in ps if math.isfinite(r["null_diff"])],
        # secondary, the mechanism: the reuse of S alone (stale against the mean of the two independent batches,
        # the same team state), and each arm's own step against the branch
        "reuse": [
            r["success_stale"] - (r["success_null_a"] + r["success_null_b"]) / 2
            for r in ps
            if math.isfinite(r["null_diff"])
        ],
        **{
            f"step_{arm}": [r[f"success_{arm}"] - r["success_branch"] for r in ps if math.isfinite(r[f"success_{arm}"])]
            for arm in ARM_NAMES
        },
        # descriptive only (it conditions on what the fresh batch turned out to be): the pairs whose fresh arm moved
        "moved": [r["diff"] for r in ps if r["kl_fresh"] >= STILL_KL],
    }

    def mean(key: str) -> float:
        return float(np.mean([r[key] for r in ps])) if ps else math.nan

    c: dict[str, Any] = dict(pairs=len(ps), pairs_run=len(rs), unposed=len(rs) - len(ps), null_pairs=len(nulls))
    c["worker"] = rs[0]["worker"]
    for key in ("success_branch", "success_stale", "success_fresh"):
        c[key] = mean(key)
    for key in ("success_null_a", "success_null_b"):
        c[key] = float(np.mean([r[key] for r in nulls])) if nulls else math.nan
    # d moves in steps of one task, so many pairs tie: the counts, and a sign test over the untied pairs (needs no
    # normality of d)
    signs = np.sign([0.0 if abs(d) < 1e-12 else d for d in families["diff"]])
    c["fresh_ahead"], c["stale_ahead"] = int(np.sum(signs > 0)), int(np.sum(signs < 0))
    c["tied"] = len(ps) - c["fresh_ahead"] - c["stale_ahead"]
    untied = c["fresh_ahead"] + c["stale_ahead"]
    c["sign_p"] = float(binomtest(c["fresh_ahead"], untied).pvalue) if untied else math.nan
    for prefix, d in families.items():
        s = paired_summary(d)
        c.update({f"{prefix}_{k}": v for k, v in s.items()})
        c[f"{prefix}_n"] = len(d)
    # Holm within each family: the mechanism's rows form one secondary family, every other comparison its own
    mechanism = ["reuse", *(f"step_{arm}" for arm in ARM_NAMES)]
    for prefix, h in zip(mechanism, holm([c[f"{k}_p"] for k in mechanism]), strict=True):
        c[f"{prefix}_p_holm"] = h
    for prefix in families.keys() - set(mechanism):
        c[f"{prefix}_p_holm"] = c[f"{prefix}_p"]  # a family of one: Holm leaves its p as it is
    keys = ["rows_changed", "adv_gap", "reward_stale", "reward_fresh", "upstream_kl", "upstream_steps"]
    keys += ["upstream_acted", *(f"{k}_{arm}" for arm in ARM_NAMES for k in STEP_FIELDS)]
    c.update({k: mean(k) for k in keys})
    for arm in ARM_NAMES:  # the share of pairs whose steps left the worker where it was: no learning signal
        still = [r[f"kl_{arm}"] < STILL_KL and r[f"steps_{arm}"] > 0 for r in ps]
        c[f"still_{arm}"] = float(np.mean(still)) if still else math.nan
    c["seconds"] = float(np.sum([r["seconds"] for r in rs]))
    return {"result": [c]}


def _ci(c: dict[str, Any], prefix: str) -> str:
    return f"{c[f'{prefix}_mean']:+.4f} [{c[f'{prefix}_ci_low']:+.4f}, {c[f'{prefix}_ci_high']:+.4f}]"


def summary_sections(
    cfg: LLMFreshnessConfig,
    rows: Sequence[dict[str, Any]],
    tables: Tables,
    *,
    seconds: float = math.nan,
    reused: int = 0,
) -> Sections:
    """``summary.md``: the setting, fresh − stale with its MDE, the null check, the stale gap and the realised steps,
    what it does not show."""
    team, tr = cfg.team, cfg.trainer
    workers = team.workers
    upstream, last = ", ".join(workers[:-1]), workers[-1]
    s: Sections = {}
    s["title"] = [
        "# The paired freshness experiment on the real-LLM team",
        "",
        f"{len(rows)} replicate pairs ({sum(posed(r) for r in rows)} in which the upstream worker(s) moved); the "
        f"pairs' own compute {float(np.sum([r['seconds'] for r in rows])):.0f} s"
        + (f", this invocation {seconds:.0f} s" if math.isfinite(seconds) else "")
        + (f", {reused} pairs reused from an earlier invocation" if reused else "")
        + ".",
        "",
        *(
            [
                f"**Interim: {len(rows)} of {cfg.pairs} pairs are in.** Every figure below reads those pairs; rerun "
                f"the command under Reproduce to continue. The test is planned at {cfg.pairs} pairs: a p read at an "
                f"interim look is not that test ({INTERIM_LOOKS}).",
                "",
            ]
            if len(rows) < cfg.pairs
            else []
        ),
        f"Per pair: the team ({team.team}, trainable {' → '.join(workers)}; its own LoRA init); the upstream "
        f"worker(s) ({upstream}) updated on one stale batch S (naive); from the state saved right after that, the "
        f"{last} updated once on S (**stale**) and once on a batch F sampled from the updated team with S's random "
        "numbers (**fresh**: the same train tasks and episode seeds), by the trainer's own update, everything else "
        f"equal; each arm's team played on the same {cfg.eval_tasks} held-out {cfg.eval_split} tasks with the same "
        f"episode seeds (trainable workers at temperature {team.eval_temperature:g}"
        + (", greedy" if team.eval_temperature == 0 else "")
        + "). d = success_fresh − success_stale per pair; mean d with a 95% t interval over pairs, p of the "
        "one-sample t-test, and the minimum detectable effect (MDE: 80% power, α = 0.05, two-sided).",
        "",
        "## Settings",
        "",
        f"Model {team.model} ({team.dtype}), max {team.max_tokens} tokens per turn, sampling temperature "
        f"{team.temperature:g}; B = {tr.batch_size} episodes per batch ({tr.batch_size // team.group_size} tasks × "
        f"G = {team.group_size}), {tr.num_epochs} epochs × {tr.num_minibatches} minibatches, lr {tr.lr:g}, "
        f"trust region {tr.trust_region} δ = {tr.deltas(len(workers))[-1]:g}; root seed {cfg.seed}.",
        "",
    ]
    if not tables["result"]:
        return {**s, "result": ["No pair has finished yet.", ""]}
    c = tables["result"][0]
    unposed = (
        [
            f"Left out of this table: {c['unposed']} of the {c['pairs_run']} pairs, in which the {upstream}'s batch "
            "S carried no learning signal (every group's rewards tied), so the upstream update did not move the "
            "team, F is S exactly and fresh − stale is 0 by construction (the question is not posed, so the arms "
            f"need not be played). Over all {c['pairs_run']} pairs, counting those as 0: {_ci(c, 'all')}, p {pval(c['all_p'])}, "
            f"MDE {cell(c['all_mde'], 4)}.",
            "",
        ]
        if c["unposed"]
        else []
    )
    if not c["pairs"]:
        return {**s, "result": ["No pair has posed the question yet.", "", *unposed]}
    s["result"] = [
        "## Fresh − stale",
        "",
        "| pairs | success at branch | success stale | success fresh | fresh − stale [95% CI] | SD | p | MDE | reading |",
        "|---|---|---|---|---|---|---|---|---|",
        f"| {c['pairs']} | {cell(c['success_branch'], 4)} | {cell(c['success_stale'], 4)} | "
        f"{cell(c['success_fresh'], 4)} | {_ci(c, 'diff')} | {cell(c['diff_sd'], 4)} | {pval(c['diff_p'])} | "
        f"{cell(c['diff_mde'], 4)} | {verdict(c)} |",
        "",
        f"Success is a share of the {cfg.eval_tasks} held-out tasks. The MDE is "
        f"{100 * c['diff_mde']:.1f} points of held-out success: a true mean difference that large would be detected "
        f"with 80% power by {c['pairs']} pairs of this spread. Each arm's own step against the team at the branch: "
        "under Where the difference comes from.",
        "",
        f"d moves in steps of one task (1/{cfg.eval_tasks}). Pairs with fresh ahead / stale ahead / tied: "
        f"{c['fresh_ahead']} / {c['stale_ahead']} / {c['tied']}; the sign test over the untied pairs (scipy's "
        f"binomtest, which needs no normality of d): p {pval(c['sign_p'])}.",
        "",
        *unposed,
    ]
    if cfg.null_check:
        s["result"] += [
            "Secondary: fresh against the stale arm on the first null batch (independent of S, so the reuse of the "
            f"batch the upstream worker(s) were fitted to is taken out; no common random numbers): {_ci(c, 'indep')}, "
            f"p {pval(c['indep_p'])}.",
            "",
        ]
    s["null"] = ["## Null check", ""]
    if not cfg.null_check:
        s["null"] += ["Not run (null_check off).", ""]
    else:
        passes = null_check_passes([c])
        s["null"] += [
            f"Two more arms that update the {last} the same way, each on its own independent batch of the "
            "stage-start team (S1, S2: the same procedure, only the seed differs): their difference is 0 in "
            f"expectation, so the statistics must not call it different from 0. **{'Passes' if passes else 'FAILS'}**"
            + (
                (": its p is ≥ 0.05." if math.isfinite(c["null_p"]) else ": every pair's null difference is 0.")
                if passes
                else ": its p is below 0.05, so the interval above is not to be trusted."
            ),
            "",
            "| pairs | success S1 | success S2 | S2 − S1 [95% CI] | SD | p | SD of fresh − stale |",
            "|---|---|---|---|---|---|---|",
            f"| {c['null_pairs']} | {cell(c['success_null_a'], 4)} | {cell(c['success_null_b'], 4)} | {_ci(c, 'null')} | "
            f"{cell(c['null_sd'], 4)} | {pval(c['null_p'])} | {cell(c['diff_sd'], 4)} |",
            "",
            "The null arms have no common random numbers; the last column shows how much smaller the spread of the "
            "CRN-paired fresh − stale difference is.",
            "",
        ]
    arms = [a for a in ARM_NAMES if cfg.null_check or not a.startswith("null")]
    s["mechanism"] = [
        "## Where the difference comes from (secondary)",
        "",
        f"Each arm's own step of the {last}, read against the team at the branch (success after it − success at the "
        "branch, over the pairs that pose the question; Holm across the rows of this section, a secondary family). "
        "The fresh and the null arms each step on a batch the upstream update was not fitted to; the stale arm alone "
        "reuses that batch. If the stale arm's step differs from the others' while the fresh and null arms agree, "
        "fresh − stale measures the reuse of S, not freshness.",
        "",
        "| arm | pairs | success after − at branch [95% CI] | p | Holm p |",
        "|---|---|---|---|---|",
        *[
            f"| {ARM_NAMES[a]} | {c[f'step_{a}_n']} | {_ci(c, f'step_{a}')} | {pval(c[f'step_{a}_p'])} | "
            f"{pval(c[f'step_{a}_p_holm'])} |"
            for a in arms
        ],
        "",
        *(
            [
                "The reuse of S alone, stale − the mean of the two null arms (the same team state, S against "
                f"independent batches; {c['reuse_n']} pairs): {_ci(c, 'reuse')}, p {pval(c['reuse_p'])}, Holm p "
                f"{pval(c['reuse_p_holm'])}.",
                "",
            ]
            if cfg.null_check
            else []
        ),
        f"Descriptive only: fresh − stale over the {c['moved_n']} pairs whose fresh arm moved (this selects pairs on "
        f"what F turned out to be, so it is no test): {_ci(c, 'moved')}.",
        "",
    ]
    s["gap"] = [
        f"## The stale gap ({last})",
        "",
        f"Over the pairs that pose the question, on the CRN-matched batches S and F, episode by episode: {c['rows_changed']:.1%} of the episodes have "
        f"different {last} turns (prompt or sampled token ids); mean abs(Â_S − Â_F) {c['adv_gap']:.4f} (GRPO "
        f"advantages of the team reward); mean reward S {c['reward_stale']:.4f}, F {c['reward_fresh']:.4f}. The "
        f"upstream update(s): KL {c['upstream_kl']:.4f} per token, {c['upstream_steps']:.2f} optimizer steps, the "
        f"trust region acted in {c['upstream_acted']:.0%} of them.",
        "",
        f"| arm | the {last}'s step KL | optimizer steps | TR acted | did not move |",
        "|---|---|---|---|---|",
        *[
            f"| {ARM_NAMES[a]} | {cell(c[f'kl_{a}'], 4)} | {c[f'steps_{a}']:.2f} | {c[f'acted_{a}']:.0%} "
            f"| {c[f'still_{a}']:.0%} |"
            for a in arms
        ],
        "",
        "KL: the realised per-token KL(π_old ‖ π_new) on the update's own batch (the trust region's measure); TR "
        "acted: the share of pairs in which the backtracking shortened or reverted a step; did not move: the share "
        f"of pairs in which the steps taken left the {last} where it was (KL < {STILL_KL:g}: every group's rewards "
        "tied, so every advantage was 0 and the batch carried no learning signal).",
        "",
    ]
    s["not_shown"] = [
        "## What it does not show",
        "",
        "- **One update, not a run.** Each pair measures one step of one worker from the initial adapters. A "
        "one-step difference neither bounds nor predicts what freshness does over many stages, and it says nothing "
        "of TeamTR's price (a batch per worker): `orchestra experiment llm` reads the schemes at equal episodes.",
        f"- **One upstream step, one downstream worker.** Only the {upstream} moved before the {last}'s update, by "
        "one naive step; the stale gap is as large as that one step makes it. The stale arm also reuses the batch "
        "the upstream update was fitted to; the secondary comparisons take that reuse out or measure it alone.",
        f"- **Greedy play of {cfg.eval_tasks} fixed tasks.** Success is read on the same held-out tasks and "
        "episode seeds in every arm; a difference smaller than one task per pair is invisible, and another "
        "decoding or task set may read otherwise.",
        *(
            [
                f"- **Steps without signal.** The {last} did not move in {c['still_fresh']:.0%} of the fresh arms "
                f"and {c['still_stale']:.0%} of the stale arms (mean reward S {c['reward_stale']:.3f}, F "
                f"{c['reward_fresh']:.3f}): at this success rate a batch of {tr.batch_size} episodes often has every "
                "group's rewards tied, and fresh − stale then compares a step with no step. That is what freshness "
                "does at this batch size, not a measure of fresher gradients. The selection leans one way: a pair "
                f"poses the question only when the {upstream} moved, so S had signal and, the reward being the "
                "team's, the stale arm always has some; the fresh arm keeps it only if F does. In a TeamTR run the "
                "fresh batch is sampled on new seeds, so when S has no signal it may still have some; the coupled "
                "design (F = S then) leaves that case out."
            ]
            if c["still_fresh"] > 0 or c["still_stale"] > 0
            else []
        ),
        f"- **{c['pairs']} pairs that pose the question.** A no-difference reading holds down to its MDE only: it is not evidence that "
        "freshness never matters.",
        "",
    ]
    s["reproduce"] = [
        "## Reproduce",
        "",
        "```bash",
        f"orchestra experiment freshness-llm --pairs {cfg.pairs} --eval-tasks {cfg.eval_tasks} "
        f"--eval-split {cfg.eval_split} --lr {tr.lr:g} --seed {cfg.seed}"
        + ("" if cfg.null_check else " --no-null-check")
        + " --out runs/freshness_llm",
        "```",
        "",
    ]
    return s


__all__ = ["ARM_NAMES", "STEP_FIELDS", "analyse", "summary_sections"]
