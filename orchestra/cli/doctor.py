"""``orchestra doctor``: this machine and this install, for a bug report (:mod:`orchestra.jobs.doctor`)."""

from __future__ import annotations

import argparse

from orchestra.cli.options import Command, Opt, add_options, build


def _doctor(p: argparse.ArgumentParser, epilog: str) -> None:
    from orchestra.jobs.doctor import DoctorConfig

    p.description = (
        "Print what a bug report needs: the CPU and its instruction sets, what llama.cpp was built with and the crash "
        "probe's verdict, thread settings, models and backends found, versions of the model stack, CUDA, cache folders."
    )
    add_options(p, DoctorConfig, [Opt("as_json", "--json"), "probe"])


def _cmd_doctor(a: argparse.Namespace) -> int:
    from orchestra.jobs.doctor import DoctorConfig, run_doctor

    return run_doctor(build(DoctorConfig(), a))


COMMANDS = {
    "doctor": Command(
        "what a bug report needs: CPU, llama.cpp build and crash probe, threads, models, versions, CUDA, caches",
        _doctor,
        _cmd_doctor,
    )
}
