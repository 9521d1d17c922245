"""``orchestra experiment chain | chain-regime | chain-page | llm | llm-tune | freshness | freshness-llm``: the experiments of phase 2
(:mod:`orchestra.jobs.experiment`), TeamTR against naive, joint and HAPPO on the telephone chain and on a real LLM
team, and the paired freshness experiment on the chain and on the real LLM team."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

from orchestra.cli.options import Command, Opt, add_options, build
from orchestra.cli.teamtr import engine_options, model_options, team_options

if TYPE_CHECKING:
    from orchestra.experiments.harness import ExperimentResult


def _experiment(p: argparse.ArgumentParser, epilog: str) -> None:
    from orchestra.jobs.experiment import (
        ChainExperimentJob,
        ChainPageJob,
        ChainRegimeJob,
        FreshnessJob,
        LLMExperimentJob,
        LLMFreshnessJob,
        LLMTuneJob,
    )

    esub = p.add_subparsers(dest="experiment", required=True, metavar="EXPERIMENT")
    q = esub.add_parser(
        "chain",
        help="TeamTR vs naive / joint / HAPPO on the telephone chain: final J, regressions, drift exponents α",
        epilog=epilog,
    )
    add_options(
        q,
        ChainExperimentJob(),
        [
            "out",
            Opt("experiment.ns", "--ns"),
            Opt(
                "experiment.schemes",
                "--schemes",
                help="trainer schemes (teamtr naive joint joint_indep happo stale_indep) "
                "and controls (naive_bigB: naive with n× the batch)",
            ),
            Opt("experiment.seeds", "--seeds"),
            Opt("experiment.trainer.num_stages", "--stages", help="stages of the equal-stages accounting"),
            Opt("experiment.trainer.batch_size", "--batch-size"),
            Opt("experiment.trainer.delta", "--delta", type=float, help="per-agent trust-region KL budget δ"),
            Opt("experiment.trainer.lr", "--lr"),
            Opt("experiment.warm_pass", "--warm-pass", help=_WARM_PASS),
            Opt("experiment.warm_success", "--warm-success", type=float),
            Opt("experiment.trainer.advantage", "--advantage"),
            Opt(
                "experiment.trainer.adv_scale",
                "--no-adv-scale",
                help="advantages mean-centred only (no division by std)",
            ),
            Opt("experiment.extend_for_episodes", "--no-equal-episodes", help=_NO_EQUAL_EPISODES),
            Opt("experiment.seed", "--seed"),
            Opt("progress", "--quiet", help="no progress output"),
            "tensorboard",
        ],
    )
    q.add_argument("--smoke", action="store_true", help="tiny preset (n 2 3, teamtr naive, 1 seed, 2 stages)")
    r = esub.add_parser(
        "chain-regime",
        help="the chain's page in a regime that does not saturate: the budget rule on validation runs, per-seed "
        "readings and paired differences of a main run (from their run directories; trains nothing)",
        epilog=epilog,
    )
    add_options(
        r,
        ChainRegimeJob(),
        [
            Opt("validation", "--validation"),
            Opt("main", "--main"),
            Opt("page", "--page"),
            Opt("rule.ceiling", "--ceiling"),
            Opt("rule.min_rise", "--min-rise"),
            Opt("rule.min_rise_largest_n", "--min-rise-largest-n"),
            Opt("rule.min_stages", "--min-stages"),
        ],
    )
    c = esub.add_parser(
        "chain-page",
        help="the chain's results page, findings first, from committed run directories of `experiment chain` "
        "(trains nothing)",
        epilog=epilog,
    )
    add_options(
        c, ChainPageJob(), [Opt("runs", "--runs", metavar="NAME=DIR"), Opt("notes", "--notes"), Opt("page", "--page")]
    )
    f = esub.add_parser(
        "llm",
        help="real LLM team: frozen vs teamtr / naive / joint / HAPPO on held-out tasks, paired CIs, both accountings",
        description=LLM_EXPERIMENT_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=epilog,
    )
    add_options(
        f,
        LLMExperimentJob(),
        [
            "out",
            Opt("report", "--report", help="also write summary.md here (e.g. docs/results/finetune.md)"),
            Opt("tables", "--tables"),
            Opt("resume_from", "--resume-from", metavar="TABLES"),
            Opt(
                "experiment.schemes",
                "--schemes",
                help="trainer schemes (teamtr naive joint joint_indep happo stale_indep)",
            ),
            Opt("experiment.seeds", "--seeds"),
            Opt("experiment.eval_tasks", "--eval-tasks"),
            Opt("experiment.eval_split", "--eval-split"),
            Opt("experiment.eval_every", "--eval-every"),
            Opt("experiment.extend_for_episodes", "--no-equal-episodes", help=_NO_EQUAL_EPISODES),
            Opt(
                "experiment.equal_updates_control",
                "--equal-updates-control",
                help="teamtr and stale_indep run n × --stages too, and every scheme is read there at equal updates (a "
                "second, later equal-updates reading; doubles their runs' cost)",
            ),
            Opt("experiment.trainer.num_stages", "--stages", help="stages of the equal-stages accounting"),
            Opt("experiment.trainer.batch_size", "--batch-size"),
            Opt("experiment.trainer.num_epochs", "--epochs"),
            Opt("experiment.trainer.num_minibatches", "--minibatches"),
            Opt("experiment.trainer.lr", "--lr"),
            Opt("experiment.lr_by_scheme", "--lr-by-scheme", metavar="SCHEME=LR"),
            Opt("experiment.trainer.delta", "--delta", type=float, help="per-agent trust-region KL budget δ"),
            *team_options("experiment.team"),
            Opt("experiment.team.workers", "--workers"),
            *model_options("experiment.team"),
            *engine_options("experiment.team"),
            Opt("experiment.team.group_size", "--group-size"),
            Opt("experiment.seed", "--seed"),
            "threads",
            Opt("progress", "--quiet", help="no progress output"),
            "tensorboard",
            "report_only",
        ],
    )
    f.add_argument("--smoke", action="store_true", help="tiny preset: random-init tiny model, teamtr vs naive, 1 seed")
    t = esub.add_parser(
        "llm-tune",
        help="the real-LLM experiment's learning rate per scheme, one validation protocol for every scheme: a grid, "
        "the same budget, the mechanism's figures per learning rate",
        description=LLM_TUNE_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=epilog,
    )
    add_options(
        t,
        LLMTuneJob(),
        [
            "out",
            Opt("report", "--report"),
            Opt("tables", "--tables"),
            Opt("tune.lrs", "--lrs"),
            Opt("tune.experiment.schemes", "--schemes"),
            Opt("tune.experiment.seeds", "--seeds"),
            Opt("tune.experiment.eval_tasks", "--eval-tasks"),
            Opt("tune.experiment.trainer.num_stages", "--stages", help="stages of the equal-stages accounting"),
            Opt("tune.experiment.seed", "--seed"),
            "threads",
            Opt("progress", "--quiet", help="no progress output"),
            "report_only",
        ],
    )
    t.add_argument("--smoke", action="store_true", help="tiny preset: random-init tiny model, 2 learning rates")
    r = esub.add_parser(
        "freshness",
        help="paired freshness experiment on the chain: the last worker updated on a stale vs a fresh batch (CRN), "
        "exact J, CI over replicate pairs, stale gap, null check",
        description=FRESHNESS_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=epilog,
    )
    add_options(
        r,
        FreshnessJob(),
        [
            "out",
            Opt("report", "--report"),
            Opt("from_csv", "--from-csv"),
            Opt("experiment.ns", "--ns"),
            Opt("experiment.pairs", "--pairs"),
            Opt("experiment.trainer.batch_size", "--batch-size"),
            Opt("experiment.seed", "--seed"),
            Opt("progress", "--quiet", help="no progress output"),
        ],
    )
    r.add_argument("--smoke", action="store_true", help="tiny preset (n 2 3, 3 pairs, V 4, B 32)")
    g = esub.add_parser(
        "freshness-llm",
        help="paired freshness experiment on the real LLM team: the critic updated on a stale vs a fresh batch (CRN), "
        "held-out success, CI over replicate pairs, stale gap, null check",
        description=LLM_FRESHNESS_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=epilog,
    )
    add_options(
        g,
        LLMFreshnessJob(),
        [
            "out",
            Opt("report", "--report"),
            Opt("experiment.pairs", "--pairs"),
            Opt("experiment.eval_tasks", "--eval-tasks"),
            Opt("experiment.eval_split", "--eval-split"),
            Opt("experiment.null_check", "--no-null-check", help="skip the two null arms (fewer evaluations)"),
            Opt("experiment.trainer.lr", "--lr"),
            Opt("experiment.seed", "--seed"),
            "threads",
            Opt("progress", "--quiet", help="no progress output"),
            "report_only",
        ],
    )
    g.add_argument(
        "--smoke", action="store_true", help="tiny preset: random-init tiny model, 2 pairs, 4 held-out tasks"
    )


_WARM_PASS = (
    "warm-start per-hop pass probability (0.85: the reliable-agent regime; 0.55: the study's non-saturating regime "
    "for team success)"
)
_NO_EQUAL_EPISODES = "skip the equal-episodes accounting (the schemes that sample one batch per stage run n× shorter)"


LLM_EXPERIMENT_DESCRIPTION = """\
The first real-LLM comparison of phase 2: the trainable LLM workers of a team (default: the arithmetic team's
solver and critic under the fixed pipeline solve -> calculator check -> critic check -> revise -> calculator check,
on one-step word problems; SmolLM2 with one LoRA adapter each) trained
by teamtr, naive, joint and HAPPO, and the frozen team, all played on the same held-out tasks with the same episode
seeds. Read at equal stages, at equal sampled episodes and, as the control of the latter, at equal updates
(teamtr run as long as the one-batch schemes); paired 95% CIs over tasks against the frozen team and
between schemes (Holm-adjusted), the per-seed differences beside them.

Writes OUT/config.json, OUT/evals.csv (one row per evaluation and task), the tables as CSV, learning_curves.png,
summary.md and OUT/runs/SCHEME-seedS/ (each run's metrics and checkpoints). Resumable: run the same command again;
the same command with --report-only writes the report of what is there so far, marked interim.
Tune settings with --eval-split validation; report the test split once per released configuration.
"""


LLM_TUNE_DESCRIPTION = """\
One hyperparameter-selection protocol for every scheme of `orchestra experiment llm`: each scheme runs the same
validation experiment (same seeds, tasks and stages; equal sampled episodes) once per learning rate of the grid, and
per scheme the learning rate with the highest validation success is chosen (ties: the smaller one). Each run also
reports what the mechanism did: steps per update, the share of updates in which the trust region acted, KL / delta
and the clip fraction during the steps.

Writes OUT/lr-LR/ (each an `orchestra experiment llm` run directory), OUT/tuning.csv, OUT/selection.json (with the
--lr-by-scheme flags that run the experiment with the choice) and OUT/summary.md. Resumable.
"""


FRESHNESS_DESCRIPTION = """\
TeamTR's claim in its purest form, on the telephone chain. Per replicate pair: a warm-started chain of n agents;
workers 0..n-2 updated in order on one stale batch S (scheme naive), the trainer stopped right after worker n-2's
update and its state saved; from that state the last worker is updated once on S (stale) and once on a batch F
sampled from the updated team with S's random numbers (fresh), by the trainer's own update, everything else equal.
Both arms are scored by the exact team success J. Two step sizes (the chain trainer's, and delta 10x), every n.

Reported per (step size, n): mean J_fresh - J_stale with a 95% t interval over pairs, Holm-adjusted p, the minimum
detectable effect (80% power), the stale gap (exact KL of the last worker's contexts, the exact stale gap of its
step, the share of episodes and the advantage change between S and F), and a null check (two stale arms that differ
only in their batch's seed must not come out different).

Writes OUT/config.json, OUT/pairs.csv (one row per pair), OUT/cells.csv and OUT/summary.md. Resumable (more
--pairs extend a run).
"""


LLM_FRESHNESS_DESCRIPTION = """\
The paired freshness experiment on the real LLM team of `orchestra experiment llm` (default: the arithmetic
team's solver and critic under the fixed pipeline, SmolLM2 with one LoRA adapter each). Per replicate pair: the
team with its own LoRA init; the solver updated on one stale batch S (scheme naive), the trainer stopped right
after and its state saved; from that state the critic is updated once on S (stale) and once on a batch F sampled
from the updated team with S's random numbers (fresh: the same train tasks and episode seeds), by the trainer's own
update, everything else equal. Each arm's team is played greedily on the same held-out tasks with the same episode
seeds.

Reported: mean success_fresh - success_stale with a 95% t interval over pairs, p, the minimum detectable effect (80%
power), the stale gap on the batches (the share of episodes whose critic turns changed, the advantage change, the
mean rewards), every update's KL, steps and trust-region action, and a null check (two stale arms that differ only
in their batch's seed must not come out different). A pair whose solver batch carries no learning signal (every
group's rewards tied, so the solver does not move and F would be S) does not pose the question: its arms are not
played and the test reads the pairs that do; --pairs counts every pair attempted.

Writes OUT/config.json, OUT/pairs.csv (one row per pair), OUT/result.csv and OUT/summary.md. Resumable (more
--pairs extend a run); the same command with --report-only writes the report of the pairs there so far, marked
interim, while the run may go on.
"""


def _cmd_experiment(a: argparse.Namespace) -> int:
    from orchestra.experiments.chain.config import ChainExperimentConfig
    from orchestra.experiments.freshness.config import FreshnessConfig
    from orchestra.experiments.freshness.llm_config import LLMFreshnessConfig
    from orchestra.experiments.llm.config import LLMExperimentConfig
    from orchestra.experiments.llm.tune import LLMTuneConfig
    from orchestra.jobs.experiment import (
        ChainExperimentJob,
        ChainPageJob,
        ChainRegimeJob,
        FreshnessJob,
        LLMExperimentJob,
        LLMFreshnessJob,
        LLMTuneJob,
        run_chain_job,
        run_chain_page_job,
        run_chain_regime_job,
        run_freshness_job,
        run_llm_freshness_job,
        run_llm_job,
        run_llm_tune_job,
    )

    if a.experiment in ("chain-regime", "chain-page"):
        try:
            page = (
                run_chain_regime_job(build(ChainRegimeJob(), a))
                if a.experiment == "chain-regime"
                else run_chain_page_job(build(ChainPageJob(), a))
            )
        except (ValueError, OSError) as e:  # a missing or damaged run directory, a run shorter than its budget
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(f"page: {page}")
        return 0
    run: Callable[[], ExperimentResult]
    if a.experiment == "freshness":
        fresh = FreshnessJob(experiment=FreshnessConfig.smoke()) if a.smoke else FreshnessJob()
        run = partial(run_freshness_job, build(fresh, a))
    elif a.experiment == "freshness-llm":
        llm_fresh = LLMFreshnessJob(experiment=LLMFreshnessConfig.smoke()) if a.smoke else LLMFreshnessJob()
        run = partial(run_llm_freshness_job, build(llm_fresh, a))
    elif a.experiment == "llm-tune":
        tune = LLMTuneJob(tune=LLMTuneConfig.smoke()) if a.smoke else LLMTuneJob()
        run = partial(run_llm_tune_job, build(tune, a))
    elif a.experiment == "llm":
        llm = LLMExperimentJob(experiment=LLMExperimentConfig.smoke()) if a.smoke else LLMExperimentJob()
        run = partial(run_llm_job, build(llm, a))
    else:
        chain = ChainExperimentJob(experiment=ChainExperimentConfig.smoke()) if a.smoke else ChainExperimentJob()
        run = partial(run_chain_job, build(chain, a))
    try:
        result = run()
    except (ValueError, FileExistsError) as e:  # a damaged rows file, another experiment's run directory
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"summary: {result.summary}")
    return 0


EXPERIMENT = {
    "experiment": Command(
        "phase 2's experiments: TeamTR against naive, joint and HAPPO on the telephone chain and on a real LLM team; "
        "the paired freshness experiment on both",
        _experiment,
        _cmd_experiment,
    )
}
