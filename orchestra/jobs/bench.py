"""``orchestra bench teamtr``: the telephone-chain benchmark of TeamTR against naive, joint and HAPPO
(:mod:`orchestra.teamtr.bench`), as a job: where it writes and whether it talks."""

from __future__ import annotations

from dataclasses import dataclass, field

from orchestra.teamtr.bench.config import BenchConfig
from orchestra.teamtr.bench.run import BenchResult


@dataclass(frozen=True)
class BenchJob:
    """``orchestra bench teamtr``: the benchmark's config and its run directory."""

    bench: BenchConfig = field(default_factory=BenchConfig)  # chains, schemes, seeds and the trainer of every run
    out: str = "runs/bench_teamtr"  # output directory (an existing one of the same config is resumed)
    progress: bool = True  # one line per finished run on stderr


def run_bench_job(job: BenchJob) -> BenchResult:
    import torch

    from orchestra.teamtr.bench.run import run_bench

    torch.set_num_threads(1)  # tiny models are dispatch-bound
    return run_bench(job.bench, job.out, progress=job.progress)


__all__ = ["BenchJob", "run_bench_job"]
