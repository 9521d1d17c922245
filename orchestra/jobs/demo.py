"""``orchestra demo``: both phases at demo scale. Phase 1 records rule-based conductors, trains BC and CQL and
evaluates them against the rule-based ones (:mod:`orchestra.jobs.phase1`); phase 2 runs the telephone-chain
experiment (:mod:`orchestra.jobs.experiment`) and a Stage-0 swap of one trained chain agent (:mod:`orchestra.jobs.align`).
Every part resumes: finished work is kept."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from orchestra.experiments.chain.config import ChainExperimentConfig
from orchestra.jobs.align import AlignChainConfig, align_chain
from orchestra.jobs.evaluate import EvaluateConfig, evaluate
from orchestra.jobs.experiment import ChainExperimentJob, run_chain_job
from orchestra.jobs.phase1 import Phase1Config, run_phase1
from orchestra.report.html import first_screen, write_html_report


@dataclass(frozen=True)
class DemoConfig:
    """Everything ``orchestra demo`` runs. One seed and one progress switch serve both phases (the command line sets
    ``phase1.run.seed``, ``chain.seed`` and the align seeds together); phase 2 writes under ``OUT/phase2``
    (``chain/``, ``align/``: ``align.out`` is set from ``out``)."""

    out: str = "runs/demo"  # run directory (phase 2 writes under OUT/phase2)
    phases: tuple[Literal[1, 2], ...] = (1, 2)  # which phases to run
    phase1: Phase1Config = field(default_factory=Phase1Config.demo)  # phase 1 at demo scale
    chain: ChainExperimentConfig = field(default_factory=ChainExperimentConfig.demo)  # the chain experiment, demo scale
    align: AlignChainConfig = AlignChainConfig()  # the Stage-0 swap of agent 1 of a 4-agent chain
    # robustness (after phase 1): these conductors on phase 1's test tasks, clean and under each perturbation
    robustness: tuple[str, ...] = ("drop=0.2", "noise=0.1")  # envs.perturb specs; () = skip
    robustness_conductors: tuple[str, ...] = ("single_shot", "heuristic")


def run_demo(cfg: DemoConfig, say: Callable[[str], None] = print) -> int:
    out = Path(cfg.out)
    progress = cfg.phase1.run.progress
    if 1 in cfg.phases:
        run_phase1(cfg.phase1, out, command=f"orchestra demo --seed {cfg.phase1.run.seed}")
        if cfg.robustness:
            _robustness(cfg, out, say)
    if 2 in cfg.phases:
        _phase2(cfg, out, progress, say)
    if 1 in cfg.phases:  # the report shows phase 1's tables, plots and episodes (phase 2 has its own summaries)
        report = write_html_report(out)
        say(f"\nHTML report (tables, plots, every episode's decisions; no network needed): {report}")
        shot = first_screen(report, out / "report_first_screen.png")
        say(
            f"its first screen at 1280 × 900 px: {shot}"
            if shot
            else "(no headless chromium here: no screenshot of the report's first screen)"
        )
    return 0


def _robustness(cfg: DemoConfig, out: Path, say: Callable[[str], None]) -> None:
    p1 = cfg.phase1
    ev = EvaluateConfig(
        teams=tuple(p1.teams),
        conductors=cfg.robustness_conductors,
        episodes=p1.eval_episodes,
        split="test",
        perturb=cfg.robustness,
        run=p1.run,
    )
    paths = evaluate(ev, out / "robustness").paths
    say("\n# Robustness (demo scale): the same test tasks under perturbed communication\n")
    say(paths["robustness_md"].read_text(encoding="utf-8").split("\n\n", 2)[-1].rstrip())


def _phase2(cfg: DemoConfig, out: Path, progress: bool, say: Callable[[str], None]) -> None:
    result = run_chain_job(ChainExperimentJob(cfg.chain, str(out / "phase2" / "chain"), progress))
    say("\n# Phase 2 (demo scale): TeamTR on the telephone chain\n")
    say(result.section("J:equal_stages"))
    say("\n" + result.section("checks"))
    say(f"\nfull tables and plots: {result.summary.parent}")
    align = dataclasses.replace(cfg.align, out=str(out / "phase2" / "align"), progress=progress)
    report = Path(align.out) / "report.md"
    if report.exists():
        say("\n" + report.read_text(encoding="utf-8"))
        return
    say("\n# Phase 2 (demo scale): Stage-0 swap of agent 1 of a 4-agent chain\n")
    res = align_chain(align)
    say(res.markdown)
    say("written: " + "  ".join(str(p) for p in res.written))


__all__ = ["DemoConfig", "run_demo"]
