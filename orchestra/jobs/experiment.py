"""``orchestra experiment chain``, ``chain-regime``, ``llm``, ``freshness`` and ``freshness-llm``: the
telephone-chain comparison of TeamTR with naive, joint and HAPPO (:mod:`orchestra.experiments.chain`), its page in a
regime that does not saturate (:mod:`orchestra.experiments.chain.regime`), the real-LLM one
(:mod:`orchestra.experiments.llm`) and the paired freshness experiment on the chain and on the real-LLM team
(:mod:`orchestra.experiments.freshness`), as jobs: where they read and write and whether they talk."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from orchestra.experiments.chain.config import ChainExperimentConfig
from orchestra.experiments.chain.regime import BudgetRule
from orchestra.experiments.freshness.config import FreshnessConfig
from orchestra.experiments.freshness.llm_config import LLMFreshnessConfig
from orchestra.experiments.harness import ExperimentResult, stderr_say
from orchestra.experiments.llm.config import LLMExperimentConfig
from orchestra.experiments.llm.tune import LLMTuneConfig


@dataclass(frozen=True)
class ChainExperimentJob:
    """``orchestra experiment chain``: the experiment's config and its run directory."""

    experiment: ChainExperimentConfig = field(default_factory=ChainExperimentConfig)  # chains, schemes, seeds, trainer
    out: str = "runs/experiment_chain"  # output directory (an existing one of the same config is resumed)
    progress: bool = True  # one line per finished run on stderr
    tensorboard: bool = False  # also write each run's metrics as TensorBoard event files (OUT/runs/*/tensorboard/)


def run_chain_job(job: ChainExperimentJob) -> ExperimentResult:
    import torch

    from orchestra.experiments.chain.run import run_chain_experiment

    torch.set_num_threads(1)  # tiny models are dispatch-bound
    return run_chain_experiment(job.experiment, job.out, say=stderr_say(job.progress), tensorboard=job.tensorboard)


@dataclass(frozen=True)
class ChainRegimeJob:
    """``orchestra experiment chain-regime``: the page of the chain in a regime that does not saturate, from the
    run directories of ``orchestra experiment chain`` (trains nothing)."""

    # validation run directories, one per candidate, in the order tried (default: the committed ones, val1…val15)
    validation: tuple[str, ...] = tuple(f"docs/results/chain_hard/val{k}" for k in range(1, 16))
    main: str = "docs/results/chain_hard/main"  # the main run's directory (gets seeds.csv, cells.csv, differences.csv)
    page: str = "docs/results/teamtr_hard.md"  # the page written
    rule: BudgetRule = field(default_factory=BudgetRule)  # the rule that picks the budget on the validation runs


def chain_regime_command(job: ChainRegimeJob) -> str:
    """The command line that writes ``job``'s page (the rule's flags only where they differ from the defaults)."""
    rule, default = job.rule, BudgetRule()
    flags = [
        f"--{name.replace('_', '-')} {getattr(rule, name):g}"
        for name in ("ceiling", "min_rise", "min_rise_largest_n", "min_stages")
        if getattr(rule, name) != getattr(default, name)
    ]
    return " ".join(
        ["orchestra experiment chain-regime --validation", *job.validation, "--main", job.main, "--page", job.page]
        + flags
    )


def run_chain_regime_job(job: ChainRegimeJob) -> Path:
    from orchestra.experiments.chain.regime import write_regime_page

    return write_regime_page(job.validation, job.main, job.page, job.rule, chain_regime_command(job))


@dataclass(frozen=True)
class ChainPageJob:
    """``orchestra experiment chain-page``: the chain's results page (findings first) from committed run directories
    of ``orchestra experiment chain`` (trains nothing)."""

    # NAME=DIR per run, in the page's order (default: the two committed runs of docs/results/teamtr.md)
    runs: tuple[str, ...] = ("reliable=docs/results/teamtr_reliable", "study=docs/results/teamtr_study")
    notes: str | None = "docs/results/teamtr_notes.md"  # hand-written reading placed before the runs' tables ("": none)
    page: str = "docs/results/teamtr.md"  # the page written (its figures beside it)


def chain_page_command(job: ChainPageJob) -> str:
    """The command line that writes ``job``'s page."""
    return " ".join(
        ["orchestra experiment chain-page --runs", *job.runs]
        + (["--notes", job.notes] if job.notes else [])
        + ["--page", job.page]
    )


def run_chain_page_job(job: ChainPageJob) -> Path:
    from orchestra.experiments.chain.page import write_chain_page

    runs = []
    for spec in job.runs:
        name, sep, run_dir = spec.partition("=")
        if not sep or not name or not run_dir:
            raise ValueError(f"--runs {spec!r}: expected NAME=DIR, e.g. reliable=docs/results/teamtr_reliable")
        runs.append((name, run_dir))
    return write_chain_page(runs, job.notes or None, job.page, chain_page_command(job))


@dataclass(frozen=True)
class LLMExperimentJob:
    """``orchestra experiment llm``: the experiment's config, its run directory and the torch threads."""

    experiment: LLMExperimentConfig = field(default_factory=LLMExperimentConfig)  # team, schemes, seeds, held-out tasks
    out: str = "runs/experiment_llm"  # output directory (an existing one of the same config is resumed)
    report: str | None = None  # also write summary.md here (and its plot beside it), e.g. docs/results/finetune.md
    # also copy the run's tables here without its checkpoints (config, evals.csv, each run's update and stage
    # tables), from which --report-only --out THERE writes the same report on a fresh clone
    tables: str | None = None
    # start a new OUT from the tables --tables wrote (committed by an earlier session, or from another machine): their
    # complete runs are kept, a run cut short there runs again from its start; ignored once OUT holds evaluations
    resume_from: str | None = None
    threads: int = 0  # torch CPU threads (0 = torch's default: the physical cores)
    progress: bool = True  # one line per evaluation and run on stderr
    tensorboard: bool = False  # also write each run's metrics as TensorBoard event files (OUT/runs/*/tensorboard/)
    # train and play nothing: the report of the evaluations already in OUT (interim while a run is unfinished)
    report_only: bool = False


def run_llm_job(job: LLMExperimentJob) -> ExperimentResult:
    import torch

    from orchestra.experiments.llm.run import run_llm_experiment

    if job.threads:
        torch.set_num_threads(job.threads)
    say = stderr_say(job.progress)
    if job.resume_from:
        from orchestra.experiments.llm.run import resume_from_tables

        carried = resume_from_tables(job.experiment, job.resume_from, job.out)
        say(
            f"{job.out}: started from {job.resume_from}'s {len(carried)} complete runs"
            if carried
            else f"{job.out}: already holds evaluations, or {job.resume_from} holds no complete run; nothing carried over"
        )
    result = run_llm_experiment(job.experiment, job.out, say=say, tensorboard=job.tensorboard, play=not job.report_only)
    if job.tables:
        from orchestra.experiments.llm.run import publish_tables

        publish_tables(job.out, job.tables, job.experiment)
    if job.report:
        publish(result.summary, Path(job.report))
    return result


@dataclass(frozen=True)
class LLMTuneJob:
    """``orchestra experiment llm-tune``: the tuning config, its run directory and the torch threads."""

    tune: LLMTuneConfig = field(default_factory=LLMTuneConfig)  # the validation experiment and the learning-rate grid
    out: str = "runs/experiment_llm_tune"  # output directory (an existing one of the same config is resumed)
    # also write summary.md here, tuning.csv beside it as {stem}.csv and selection.json as {stem}_selection.json
    report: str | None = None
    # also copy the runs' tables here without their checkpoints (the config and each learning rate's tables), from
    # which --report-only --out THERE writes the same choice and report on a fresh clone
    tables: str | None = None
    threads: int = 0  # torch CPU threads (0 = torch's default: the physical cores)
    progress: bool = True  # one line per evaluation and run on stderr
    # train and play nothing: the table and choice from the evaluations already in OUT
    report_only: bool = False


def run_llm_tune_job(job: LLMTuneJob) -> ExperimentResult:
    import shutil

    import torch

    from orchestra.experiments.llm.tune import publish_tuning_tables, run_llm_tuning

    if job.threads:
        torch.set_num_threads(job.threads)
    result = run_llm_tuning(job.tune, job.out, say=stderr_say(job.progress), play=not job.report_only)
    if job.tables:
        publish_tuning_tables(job.tune, job.out, job.tables)
    if job.report:
        report = Path(job.report)
        report.parent.mkdir(parents=True, exist_ok=True)
        report.write_text(result.summary.read_text())
        shutil.copyfile(Path(job.out) / "tuning.csv", report.with_suffix(".csv"))
        shutil.copyfile(Path(job.out) / "selection.json", report.parent / f"{report.stem}_selection.json")
    return result


@dataclass(frozen=True)
class FreshnessJob:
    """``orchestra experiment freshness``: the experiment's config, its run directory and where its report goes."""

    experiment: FreshnessConfig = field(default_factory=FreshnessConfig)  # chains, step sizes, replicate pairs
    out: str = "runs/experiment_freshness"  # output directory (an existing one of the same config is resumed)
    # also write summary.md here, and pairs.csv beside it as {stem}_chain.csv (e.g. docs/results/freshness.md)
    report: str | None = None
    # run nothing: the report of this pairs CSV alone (e.g. the committed docs/results/freshness_chain.csv)
    from_csv: str | None = None
    progress: bool = True  # one line per finished pair on stderr


def run_freshness_job(job: FreshnessJob) -> ExperimentResult:
    import shutil

    import torch

    from orchestra.experiments.freshness.run import report_from_csv, run_freshness_experiment

    torch.set_num_threads(1)  # tiny models are dispatch-bound
    if job.from_csv is not None:
        result = report_from_csv(job.from_csv, job.out)
    else:
        result = run_freshness_experiment(job.experiment, job.out, say=stderr_say(job.progress))
    if job.report:
        report = Path(job.report)
        report.parent.mkdir(parents=True, exist_ok=True)
        report.write_text(result.summary.read_text())
        if job.from_csv is None:
            shutil.copyfile(Path(job.out) / "pairs.csv", report.parent / f"{report.stem}_chain.csv")
    return result


@dataclass(frozen=True)
class LLMFreshnessJob:
    """``orchestra experiment freshness-llm``: the experiment's config, its run directory, where its report goes and
    the torch threads."""

    experiment: LLMFreshnessConfig = field(default_factory=LLMFreshnessConfig)  # team, trainer, pairs, held-out tasks
    out: str = "runs/experiment_freshness_llm"  # output directory (an existing one of the same config is resumed)
    # also write summary.md here (a page under docs/results/), and pairs.csv beside it as {stem}.csv (not with
    # --report-only: the run directory holds the rows the page reads)
    report: str | None = None
    threads: int = 0  # torch CPU threads (0 = torch's default: the physical cores)
    progress: bool = True  # the teams' progress and one line per finished pair on stderr
    # play nothing: the report of the pairs already in OUT (interim while fewer than --pairs), OUT left as it is
    report_only: bool = False


def run_llm_freshness_job(job: LLMFreshnessJob) -> ExperimentResult:
    import shutil

    import torch

    from orchestra.experiments.freshness.llm_run import run_llm_freshness_experiment

    if job.threads:
        torch.set_num_threads(job.threads)
    result = run_llm_freshness_experiment(
        job.experiment, job.out, say=stderr_say(job.progress), play=not job.report_only
    )
    if job.report:
        report = Path(job.report)
        report.parent.mkdir(parents=True, exist_ok=True)
        report.write_text(result.summary.read_text())
        if not job.report_only:
            shutil.copyfile(Path(job.out) / "pairs.csv", report.with_suffix(".csv"))
    return result


def publish(summary: Path, report: Path) -> None:
    """Copy ``summary.md`` to ``report`` and its figures beside it, ``learning_curves.png`` as
    ``{report stem}_curves.png`` and ``verdicts.png`` (where written) as ``{report stem}_verdicts.png``, the image
    links rewritten."""
    import shutil

    report.parent.mkdir(parents=True, exist_ok=True)
    text = summary.read_text()
    for figure, suffix in (("learning_curves.png", "curves"), ("verdicts.png", "verdicts")):
        if (summary.parent / figure).exists():
            png = f"{report.stem}_{suffix}.png"
            shutil.copyfile(summary.parent / figure, report.parent / png)
            text = text.replace(f"]({figure})", f"]({png})")
    report.write_text(text)


__all__ = [
    "ChainExperimentJob",
    "ChainPageJob",
    "ChainRegimeJob",
    "FreshnessJob",
    "LLMExperimentJob",
    "LLMFreshnessJob",
    "LLMTuneJob",
    "chain_page_command",
    "chain_regime_command",
    "publish",
    "run_chain_job",
    "run_chain_page_job",
    "run_chain_regime_job",
    "run_freshness_job",
    "run_llm_freshness_job",
    "run_llm_job",
    "run_llm_tune_job",
]
