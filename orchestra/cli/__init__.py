"""The ``orchestra`` command line: argument parsing only.

Each command group is a module that declares its commands (:class:`Command`: a one-line help, a function that adds
the command's options from the job's config dataclass — :mod:`orchestra.cli.options`: a default is written once, in
the dataclass — and a handler that hands the resolved config to a job in :mod:`orchestra.jobs`):

* :mod:`~orchestra.cli.data` — record, evaluate, trajectories, teams, families;
* :mod:`~orchestra.cli.demo` — demo;
* :mod:`~orchestra.cli.conductor` — dataset, train, ope, finetune-conductor, distill, reproduce (phase 1);
* :mod:`~orchestra.cli.experiment` — experiment chain, experiment llm (phase 2's scheme comparisons);
* :mod:`~orchestra.cli.teamtr` — finetune, align (phase 2);
* :mod:`~orchestra.cli.doctor` — doctor (this machine and install, for a bug report).

A command's options are added only when that command runs (or for ``--help`` of it), so ``orchestra --help`` and
the commands that need no model stack do not import torch, transformers or d3rlpy.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from orchestra.cli import conductor, data, demo, doctor, experiment, teamtr
from orchestra.cli.options import Command, ConfigError

EPILOG = (
    "Every command that samples, trains or evaluates takes --seed; runs repeat exactly on CPU. Docs: docs/index.md."
)


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors (``error: orchestra record: argument --episodes: invalid int value: 'x' (see
    orchestra record --help)``, exit 2), like every other error of the CLI; subcommand parsers inherit it."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {self.prog}: {message} (see {self.prog} --help)\n")


def commands() -> dict[str, Command]:
    """Every command, in the order ``orchestra --help`` lists them."""
    return {
        **data.COMMANDS,
        **demo.COMMANDS,
        **experiment.EXPERIMENT,
        **conductor.COMMANDS,
        **teamtr.COMMANDS,
        **doctor.COMMANDS,
    }


def build_parser(only: str | None = None) -> tuple[argparse.ArgumentParser, dict[str, Command]]:
    """The root parser with every command (only ``only``'s options, if given) and the commands by name."""
    ap = Parser(
        prog="orchestra",
        description="Learn how to run a team of LLM agents: record orchestration trajectories, compare conductors.",
        epilog=EPILOG,
    )
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")
    table = commands()
    for name, cmd in table.items():
        p = sub.add_parser(name, help=cmd.help, epilog=EPILOG)
        if only is None or only == name:
            cmd.build(p, EPILOG)
    return ap, table


def _command_of(argv: Sequence[str]) -> str | None:
    """The command named on the command line (the root parser takes no option but ``-h``)."""
    return next((a for a in argv if not a.startswith("-")), None)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap, table = build_parser(only=_command_of(argv) or "")
    args = ap.parse_args(argv)
    args.argv = argv  # the command line as given (a report quotes the command that produced it)
    from envs.tasks.base import Task  # noqa: F401  (fail early with a clear message if the install is broken)
    from envs.tasks.user_data import UserDataError
    from envs.team_env import IllegalActionError
    from orchestra.backends.base import BackendError
    from orchestra.runtime.distributed import RayRolloutError
    from orchestra.runtime.team_file import TeamFileError
    from policies.base import PolicyError
    from policies.learning.dataset import DatasetError
    from trajectories import SchemaError, TrajectoryFileError

    try:
        return table[args.command].run(args)
    except (
        ConfigError,
        UserDataError,
        TeamFileError,
        PolicyError,
        DatasetError,
        IllegalActionError,
        BackendError,
        RayRolloutError,
        TrajectoryFileError,
        SchemaError,
        ValueError,
    ) as e:
        if os.environ.get("ORCHESTRA_DEBUG"):
            raise
        print(f"error: {_one_line(e)}", file=sys.stderr)
        return 2
    except OSError as e:  # a missing file, a full disk (ENOSPC), a read-only folder (EROFS), a lock held elsewhere
        if os.environ.get("ORCHESTRA_DEBUG"):
            raise
        where = f"{e.filename}: " if e.filename else ""
        print(f"error: {where}{e.strerror or _one_line(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted; recorded episodes are safe (rerun with --resume to continue)", file=sys.stderr)
        return 130


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split("\n")).strip()
    return text or type(e).__name__


__all__ = ["EPILOG", "Parser", "build_parser", "commands", "main"]
