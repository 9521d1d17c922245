"""``orchestra evaluate``: every conductor on the same held-out tasks and seeds of every team's family, then the
report (tables, CSV, plots) from the recorded episodes."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from envs.perturb import parse_perturbation
from envs.tasks.base import Split
from orchestra.jobs.record import RecordConfig, record
from orchestra.report.evaluation import ResultRow, evaluation_report
from orchestra.report.robustness import robustness_rows, write_robustness
from orchestra.runtime.conductors import split_spec
from orchestra.runtime.players import Players
from orchestra.runtime.session import RunOptions, Session
from trajectories import Episode
from trajectories.rundir import write_config


@dataclass(frozen=True)
class EvaluateConfig:
    """Resolved settings of one evaluation; written to the run directory."""

    teams: tuple[str, ...]  # one team per task family (built-in names or team files)
    # conductor NAME or LABEL:CHECKPOINT of a learned one, all run on the same tasks and seeds; "{team}" in a
    # checkpoint path is replaced by each team's name (learned conductors are trained per team)
    conductors: tuple[str, ...]
    episodes: int = 20  # held-out tasks per family
    split: Split = "test"  # the split to evaluate on
    # robustness: each KIND=STRENGTH (envs.perturb: drop, noise, action_noise, outage) is one more run of every
    # conductor on the same tasks and seeds, reported against the clean run (robustness.md / .csv / .png)
    perturb: tuple[str, ...] = ()
    run: RunOptions = RunOptions()  # seed, envs, cache, progress


@dataclass(frozen=True)
class Evaluation:
    """What :func:`evaluate` wrote and found."""

    rows: list[ResultRow]  # one per (family, team, conductor): success rate with its interval, return, turns, tokens
    paths: dict[str, Path]  # the report's files by kind (results_md, results_csv, success_png, ...)
    # per ``team/conductor`` that is an LLM, its reply counts for the episodes played in this call
    replies: dict[str, dict[str, float]]


def evaluate(cfg: EvaluateConfig, out_dir: str | Path) -> Evaluation:
    """Run every conductor on the same held-out tasks of every team's family; write the report. An existing run
    directory is continued: its recorded episodes are reused."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    all_eps: list[Episode] = []
    perturbed: dict[str, list[Episode]] = {spec: [] for spec in cfg.perturb}
    for spec in cfg.perturb:
        parse_perturbation(spec)  # a bad spec is refused before anything runs
    replies: dict[str, dict[str, float]] = {}
    with Players(cfg.run) as players:  # one Ray cluster (--ray) for the whole evaluation
        for team_name in cfg.teams:
            session = Session.of(team_name, None, cfg.run)
            # one player per team (its Ray actors), for all its conductors and perturbations
            with players.open(team_name, None, session) as player:
                for spec in cfg.conductors:
                    conductor = spec.replace("{team}", session.team.name)
                    rc = RecordConfig(team_name, conductor, cfg.episodes, cfg.split, run=cfg.run)
                    label, _ = split_spec(conductor)
                    path = out / "episodes" / f"{session.team.name}-{label}.jsonl"
                    res = record(rc, path, resume=True, session=session, player=player)
                    all_eps.extend(res.recorded)
                    counts = {k: v for k, v in res.metrics.items() if k.startswith("conductor/")}
                    if counts.get("conductor/decisions"):
                        replies[f"{session.team.name}/{label}"] = counts
                    for kind in cfg.perturb:
                        path = out / "episodes" / f"{session.team.name}-{label}@{kind}.jsonl"
                        res = record(replace(rc, perturb=(kind,)), path, resume=True, session=session, player=player)
                        perturbed[kind].extend(res.recorded)
    rows, _paired, paths = evaluation_report(all_eps, out)
    if cfg.perturb:
        paths.update(write_robustness(robustness_rows(all_eps, perturbed), out))
    write_config(out, cfg)
    if replies:
        paths["replies_json"] = out / "conductor_replies.json"
        paths["replies_json"].write_text(json.dumps(replies, indent=2), encoding="utf-8")
    return Evaluation(rows, paths, replies)


__all__ = ["EvaluateConfig", "Evaluation", "evaluate"]
