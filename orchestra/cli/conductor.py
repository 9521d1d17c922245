"""``orchestra dataset | train | ope | finetune-conductor | distill | reproduce``: learning the conductor (phase 1)."""

from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path

from orchestra.cli.data import run_options
from orchestra.cli.options import Command, Opt, add_options, build


def _dataset(p: argparse.ArgumentParser, epilog: str) -> None:
    from envs.tasks.base import SPLITS
    from orchestra.jobs.conductor import DatasetBuildConfig

    dsub = p.add_subparsers(dest="dataset_command", required=True, metavar="SUBCOMMAND")
    q = dsub.add_parser("build", help="trajectory files → dataset (.npz), states re-encoded with the team's encoder")
    add_options(
        q,
        DatasetBuildConfig,
        [
            "team",
            Opt("inputs", "--input"),
            "out",
            Opt("filters.families", "--family", action="append", help="keep only this task family (repeat)"),
            Opt("filters.splits", "--split", action="append", choices=SPLITS, help="keep only this split (repeat)"),
            Opt("filters.conductors", "--source", action="append", help="keep only this recorded conductor (repeat)"),
            Opt("filters.success_only", "--success-only"),
            Opt("filters.min_return", "--min-return"),
            Opt("filters.include_errors", "--include-errors"),
            Opt("weights", "--weight", action="append", metavar="COMPONENT=NUMBER"),
            "seed",
        ],
    )
    q = dsub.add_parser("stats", help="episodes, transitions, action histogram, returns per source conductor")
    q.add_argument("path", help="dataset .npz")
    q.add_argument("--json", action="store_true", help="print as JSON")
    q = dsub.add_parser("export", help="write a dataset (.npz) in another format: a Minari dataset (--to minari)")
    q.add_argument("path", help="dataset .npz")
    q.add_argument("--to", choices=["minari"], required=True, help="target format: minari")
    q.add_argument("--id", default=None, help="Minari dataset id (default: orchestra/TEAM-v0)")
    q.add_argument(
        "--root",
        default=None,
        help="Minari datasets folder (default: $MINARI_DATASETS_PATH, else ~/.minari/datasets); "
        "load it back with MINARI_DATASETS_PATH=ROOT and minari.load_dataset(ID)",
    )


def _train(p: argparse.ArgumentParser, epilog: str) -> None:
    from orchestra.jobs.conductor import TrainConfig
    from policies.learning.offline import D3RLPY_ALGOS

    add_options(
        p,
        TrainConfig,
        [
            Opt("offline.algo", "--algo", choices=D3RLPY_ALGOS, required=True),
            "dataset",
            "out",
            "team",
            Opt("offline.n_steps", "--steps"),
            Opt("offline.n_steps_per_epoch", "--steps-per-epoch"),
            Opt("offline.batch_size", "--batch-size"),
            Opt("offline.learning_rate", "--lr"),
            Opt("offline.gamma", "--gamma"),
            Opt("offline.cql_alpha", "--cql-alpha"),
            Opt("offline.n_critics", "--critics"),
            Opt("offline.bcq_action_flexibility", "--bcq-flexibility"),
            Opt("offline.hidden_units", "--hidden"),
            Opt("offline.truncation", "--truncation"),
            Opt("offline.seed", "--seed"),
            "resume",
            "tensorboard",
        ],
    )
    p.add_argument("--quiet", action="store_true", help="no progress output")


def _ope(p: argparse.ArgumentParser, epilog: str) -> None:
    from orchestra.jobs.conductor import OPEConfig

    add_options(
        p,
        OPEConfig,
        [
            "checkpoint",
            "dataset",
            "team",
            Opt("fqe.n_steps", "--steps"),
            Opt("fqe.gamma", "--gamma"),
            "out",
            Opt("fqe.seed", "--seed"),
        ],
    )


def _conductor_ppo(p: argparse.ArgumentParser, epilog: str) -> None:
    from orchestra.jobs.conductor_ppo import ConductorPPOConfig

    add_options(
        p,
        ConductorPPOConfig,
        [
            "team",
            "timesteps",
            "n_steps",
            "warm_start",
            Opt("allow", action="append", metavar="LABEL"),
            "max_turns",
            "max_tokens",
            Opt("risky", action="append", metavar="LABEL"),
            "approve",
            "embedder",
            "difficulty",
            "resume",
            "tensorboard",
            "seed",
            Opt("use_cache", "--no-cache", help="do not use the response cache"),
            Opt("cache_path", "--cache"),
            Opt("progress", "--quiet", help="no progress bar"),
        ],
    )
    p.add_argument("--out", required=True, help="run directory (checkpoint in OUT/checkpoint)")


def _distill(p: argparse.ArgumentParser, epilog: str) -> None:
    from orchestra.jobs.conductor import DistillJob

    add_options(p, DistillJob, ["dataset", "team"])
    add_options(p.add_mutually_exclusive_group(required=True), DistillJob, ["checkpoint", "conductor"])
    add_options(
        p,
        DistillJob,
        [
            "out",
            Opt("distill.max_depth", "--max-depth"),
            Opt("distill.features", "--features"),
            Opt("distill.heldout_frac", "--heldout-frac"),
            Opt("distill.seed", "--seed"),
        ],
    )


def _reproduce(p: argparse.ArgumentParser, epilog: str) -> None:
    from orchestra.jobs.phase1 import ReproduceConfig

    rsub = p.add_subparsers(dest="experiment", required=True, metavar="EXPERIMENT")
    q = rsub.add_parser("conductor", help="phase 1 at full scale: the tables of docs/results/conductor-summary.md")
    add_options(
        q,
        ReproduceConfig(),
        [
            "out",
            Opt("phase1.teams", "--teams"),
            Opt("phase1.train_episodes", "--train-episodes"),
            Opt("phase1.validation_episodes", "--validation-episodes"),
            Opt("phase1.eval_episodes", "--episodes"),
            Opt("phase1.seeds", "--seeds"),
            Opt("phase1.algos", "--algos"),
            Opt("phase1.cql_alphas", "--cql-alphas"),
            Opt("phase1.n_critics", "--critics"),
            Opt("phase1.features", "--features"),
            Opt("phase1.replicate_offset", "--replicate-offset"),
            "report",
            Opt("tables", "--tables"),
            "report_only",
            Opt("phase1.force_test", "--force-test", metavar="REASON"),
            *run_options("phase1.run"),
        ],
    )


def _cmd_dataset(a: argparse.Namespace) -> int:
    from orchestra.report.summaries import format_dataset_summary
    from policies.learning.dataset import ConductorDataset

    if a.dataset_command == "stats":
        s = ConductorDataset.load(a.path).summary()
        print(json.dumps(s, indent=2) if a.json else format_dataset_summary(s))
        return 0
    if a.dataset_command == "export":
        import os
        from pathlib import Path

        from policies.learning.minari_io import to_minari

        ds = ConductorDataset.load(a.path)
        root = a.root or os.environ.get("MINARI_DATASETS_PATH") or str(Path.home() / ".minari" / "datasets")
        dataset_id = a.id or f"orchestra/{ds.team}-v0"
        folder = to_minari(ds, dataset_id, root)
        print(f"Minari dataset {dataset_id!r}: {len(ds.episodes)} episodes, {len(ds)} steps → {folder}")
        return 0
    from orchestra.jobs.conductor import DatasetBuildConfig, build_dataset

    built = build_dataset(build(DatasetBuildConfig, a))
    print(format_dataset_summary(built.summary))
    print(f"\ndataset: {built.path}")
    return 0


def _cmd_train(a: argparse.Namespace) -> int:
    from orchestra.jobs.conductor import TrainConfig, train_conductor

    cfg = build(TrainConfig, a)
    trained = train_conductor(cfg, progress=not a.quiet)
    ds, res = trained.dataset, trained.result
    last = res.metrics[-1] if res.metrics else {}
    algo = cfg.offline.algo
    print(
        f"trained {algo} on {len(ds.episodes)} episodes ({len(ds)} decisions), {cfg.offline.n_steps} steps; "
        f"agreement with the logged actions {last.get('perf/agreement', float('nan')):.3f}\n"
        f"checkpoint: {res.run_dir}  (use it as --conductor {trained.spec})"
    )
    return 0


def _cmd_ope(a: argparse.Namespace) -> int:
    from orchestra.jobs.conductor import OPEConfig, ope_job

    cfg = build(OPEConfig, a)
    res = ope_job(cfg)
    print(
        f"FQE estimate of {cfg.checkpoint}: {res['fqe_estimate']:.3f} (gamma {cfg.fqe.gamma:g}) from "
        f"{res['episodes']} logged episodes; the logged behaviour itself returned {res['behaviour_return']:.3f}"
    )
    return 0


def _cmd_conductor_ppo(a: argparse.Namespace) -> int:
    from orchestra.jobs.conductor_ppo import ConductorPPOConfig, train_conductor_ppo

    run = train_conductor_ppo(build(ConductorPPOConfig, a), a.out)
    print(
        f"run dir: {run}\ncheckpoint: {Path(run) / 'checkpoint'}  (use it as --conductor ppo:{Path(run) / 'checkpoint'})"
    )
    return 0


def _cmd_distill(a: argparse.Namespace) -> int:
    from orchestra.jobs.conductor import DistillJob, distill_job

    cfg = build(DistillJob, a)
    res = distill_job(cfg)
    print(res.rules.rstrip())
    print(
        f"\nfidelity: {res.fidelity_heldout:.3f} on {res.n_heldout} held-out states, {res.fidelity_train:.3f} on "
        f"{res.n_train} training states (masked {res.masked_fidelity:.3f})\nwritten: {cfg.out}/rules.txt"
    )
    return 0


def _cmd_reproduce(a: argparse.Namespace) -> int:
    from orchestra.jobs.phase1 import ReproduceConfig, reproduce

    cfg = build(ReproduceConfig(), a)
    reproduce(cfg, command=shlex.join(["orchestra", *a.argv]))
    if cfg.report:
        print(f"report: {cfg.report}")
    return 0


COMMANDS = {
    "dataset": Command("build or inspect an offline dataset of conductor decisions", _dataset, _cmd_dataset),
    "train": Command(
        "train an offline conductor with d3rlpy (bc | fbc | dqn | ddqn | bcq | cql; --resume continues a killed run)",
        _train,
        _cmd_train,
    ),
    "ope": Command("estimate a learned conductor's value from logs alone (d3rlpy FQE)", _ope, _cmd_ope),
    "finetune-conductor": Command(
        "refine a conductor online with MaskablePPO behind safety rails", _conductor_ppo, _cmd_conductor_ppo
    ),
    "distill": Command("distil a conductor into a readable decision tree", _distill, _cmd_distill),
    "reproduce": Command("run a documented full-scale experiment", _reproduce, _cmd_reproduce),
}
