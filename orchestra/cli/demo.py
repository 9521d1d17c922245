"""``orchestra demo``: both phases at demo scale (:mod:`orchestra.jobs.demo`)."""

from __future__ import annotations

import argparse

from orchestra.cli.options import Command, Opt, add_options, build


def _demo(p: argparse.ArgumentParser, epilog: str) -> None:
    from orchestra.jobs.demo import DemoConfig

    add_options(
        p,
        DemoConfig(),
        [
            "out",
            "phases",
            Opt("phase1.eval_episodes", "--episodes", help="test tasks per family and conductor"),
            Opt("phase1.validation_episodes", "--validation-episodes", help="validation tasks per family"),
            Opt("phase1.train_episodes", "--train-episodes", help="recorded training episodes per conductor"),
            Opt("phase1.run.seed", "--seed", also=("chain.seed", "align.seed"), help="seed of both phases"),
            Opt("phase1.run.num_envs", "--num-envs"),
            Opt("phase1.run.use_cache", "--no-cache", help="do not use the response cache"),
            Opt("phase1.run.cache_path", "--cache"),
            Opt("phase1.run.progress", "--quiet", help="no progress bars or progress lines"),
            Opt("phase1.run.serial", "--serial"),
            Opt("phase1.force_test", "--force-test", metavar="REASON"),
        ],
    )


def _cmd_demo(a: argparse.Namespace) -> int:
    from orchestra.jobs.demo import DemoConfig, run_demo

    return run_demo(build(DemoConfig(), a))


COMMANDS = {
    "demo": Command(
        "both phases at demo scale: record, train BC and CQL, evaluate against rule-based conductors (phase 1); "
        "TeamTR vs baselines on telephone chains and a Stage-0 swap (phase 2)",
        _demo,
        _cmd_demo,
    )
}
