"""``orchestra bench teamtr`` and ``orchestra bench finetune``: the telephone-chain benchmark of TeamTR against naive,
joint and HAPPO (:mod:`orchestra.teamtr.bench`) and the real-LLM one (:mod:`orchestra.teamtr.llmbench`), as jobs:
where they write and whether they talk."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from orchestra.teamtr.bench.config import BenchConfig
from orchestra.teamtr.bench.run import BenchResult
from orchestra.teamtr.llmbench.config import FinetuneBenchConfig
from orchestra.teamtr.llmbench.run import FinetuneBenchResult


@dataclass(frozen=True)
class BenchJob:
    """``orchestra bench teamtr``: the benchmark's config and its run directory."""

    bench: BenchConfig = field(default_factory=BenchConfig)  # chains, schemes, seeds and the trainer of every run
    out: str = "runs/bench_teamtr"  # output directory (an existing one of the same config is resumed)
    progress: bool = True  # one line per finished run on stderr
    tensorboard: bool = False  # also write each run's metrics as TensorBoard event files (OUT/runs/*/tensorboard/)


def run_bench_job(job: BenchJob) -> BenchResult:
    import torch

    from orchestra.teamtr.bench.run import run_bench

    torch.set_num_threads(1)  # tiny models are dispatch-bound
    return run_bench(job.bench, job.out, progress=job.progress, tensorboard=job.tensorboard)


@dataclass(frozen=True)
class FinetuneBenchJob:
    """``orchestra bench finetune``: the benchmark's config, its run directory and the torch threads."""

    bench: FinetuneBenchConfig = field(default_factory=FinetuneBenchConfig)  # team, schemes, seeds, held-out tasks
    out: str = "runs/bench_finetune"  # output directory (an existing one of the same config is resumed)
    report: str | None = None  # also write summary.md here (and its plot beside it), e.g. docs/results/finetune.md
    threads: int = 0  # torch CPU threads (0 = torch's default: the physical cores)
    progress: bool = True  # one line per evaluation and run on stderr
    tensorboard: bool = False  # also write each run's metrics as TensorBoard event files (OUT/runs/*/tensorboard/)
    # train and play nothing: the report of the evaluations already in OUT (interim while a run is unfinished)
    report_only: bool = False


def run_finetune_bench_job(job: FinetuneBenchJob) -> FinetuneBenchResult:
    import sys

    import torch

    from orchestra.teamtr.llmbench.run import run_finetune_bench

    if job.threads:
        torch.set_num_threads(job.threads)
    say = (lambda line: print(line, file=sys.stderr, flush=True)) if job.progress else (lambda _line: None)
    result = run_finetune_bench(job.bench, job.out, say=say, tensorboard=job.tensorboard, play=not job.report_only)
    if job.report:
        publish(result.summary, Path(job.report))
    return result


def publish(summary: Path, report: Path) -> None:
    """Copy ``summary.md`` to ``report`` and its ``learning_curves.png`` beside it as ``{report stem}_curves.png``,
    the image link rewritten."""
    import shutil

    report.parent.mkdir(parents=True, exist_ok=True)
    png = f"{report.stem}_curves.png"
    shutil.copyfile(summary.parent / "learning_curves.png", report.parent / png)
    report.write_text(summary.read_text().replace("](learning_curves.png)", f"]({png})"))


__all__ = ["BenchJob", "FinetuneBenchJob", "publish", "run_bench_job", "run_finetune_bench_job"]
