"""The ``orchestra`` command line: argument parsing only.

Each command group is a module that declares its parsers from the jobs' config dataclasses
(:mod:`orchestra.cli.options`: a default is written once, in the dataclass) and hands the resolved config to a job
(:mod:`orchestra.jobs`):

* :mod:`~orchestra.cli.data` — record, evaluate, trajectories, teams, families;
* :mod:`~orchestra.cli.demo` — demo;
* :mod:`~orchestra.cli.conductor` — dataset, train, ope, finetune-conductor, distill, reproduce (phase 1);
* :mod:`~orchestra.cli.teamtr` — bench, finetune, align (phase 2).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from orchestra.cli import conductor, data, demo, teamtr
from orchestra.cli.options import ConfigError

EPILOG = "Every command takes --seed; runs repeat exactly on CPU. Docs: README.md."
Handler = Callable[[argparse.Namespace], int]


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, Handler]]:
    """The root parser and every command's handler."""
    ap = argparse.ArgumentParser(
        prog="orchestra",
        description="Learn how to run a team of LLM agents: record orchestration trajectories, compare conductors.",
        epilog=EPILOG,
    )
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")
    handlers: dict[str, Handler] = {}
    handlers.update(data.add_parsers(sub, EPILOG))
    handlers.update(demo.add_parsers(sub, EPILOG))
    handlers.update(teamtr.add_bench_parser(sub, EPILOG))
    handlers.update(conductor.add_parsers(sub, EPILOG))
    handlers.update(teamtr.add_parsers(sub, EPILOG))
    return ap, handlers


def main(argv: Sequence[str] | None = None) -> int:
    ap, handlers = build_parser()
    args = ap.parse_args(argv)
    from envs.tasks.base import Task  # noqa: F401  (fail early with a clear message if the install is broken)
    from envs.team_env import IllegalActionError
    from orchestra.backends.base import BackendError
    from orchestra.runtime.team_file import TeamFileError
    from policies.base import PolicyError
    from policies.dataset import DatasetError
    from trajectories import SchemaError, TrajectoryFileError

    try:
        return handlers[args.command](args)
    except (
        ConfigError,
        TeamFileError,
        PolicyError,
        DatasetError,
        IllegalActionError,
        BackendError,
        TrajectoryFileError,
        SchemaError,
        FileExistsError,
        FileNotFoundError,
    ) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted; recorded episodes are safe (rerun with --resume to continue)", file=sys.stderr)
        return 130


__all__ = ["EPILOG", "build_parser", "main"]
