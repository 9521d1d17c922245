"""``orchestra record``: episodes of a team under one or several conductors, written as trajectories, with a run
directory holding the resolved config and the metrics (CSV + JSONL)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from envs.tasks.base import SPLITS, Split
from orchestra.runtime.conductors import split_spec
from orchestra.runtime.player import EnginePlan, EpisodePlayer
from orchestra.runtime.players import Players
from orchestra.runtime.rollout import EpisodeJob, RolloutStats, episode_metrics, plan_jobs
from orchestra.runtime.session import RunOptions, Session
from policies.conductors.exploration import exploring_name
from trajectories import Episode, TrajectoryWriter
from trajectories.rundir import MetricsWriter, provenance, write_config


@dataclass(frozen=True)
class RecordConfig:
    """Resolved settings of one recording; written to the run directory."""

    team: str  # built-in team name (see `orchestra teams`) or a team YAML file
    # conductor NAME or LABEL:CHECKPOINT; several, comma-separated, each run on the same tasks (mixed-source data)
    conductor: str
    episodes: int = 20  # number of episodes (tasks) per conductor
    split: Split = "train"  # task split
    # task family (None = the team's), or a user's data: a .jsonl / .parquet file or a datasets.save_to_disk folder in
    # the QA, GSM8K, MATH, MBPP or HumanEval convention (envs/tasks/user_data.py)
    family: str | None = None
    difficulty: int | None = None  # one difficulty level (None = mixed)
    # ε-random exploration: share of decisions replaced by a random legal action (recorded as NAME+epsE)
    epsilon: float = 0.0
    # robustness: envs.perturb wrappers around every env (KIND=STRENGTH: drop, noise, action_noise, outage), seeded by
    # the run seed and each episode's seed; what they did is in each episode's metadata["perturbations"]
    perturb: tuple[str, ...] = ()
    run: RunOptions = RunOptions()  # seed, envs, cache, progress
    # the episodes' sampling seeds derive from this instead of run.seed (the tasks still from run.seed): a replicate
    # run plays the same tasks with other draws (phase 1's replicate oracle); None = run.seed
    sampling_seed: int | None = None

    def conductor_specs(self) -> list[str]:
        specs = [c.strip() for c in self.conductor.split(",") if c.strip()]
        if not specs:
            raise ValueError("--conductor: name at least one conductor")
        return specs


@dataclass
class RecordResult:
    trajectories: Path
    run_dir: Path
    episodes: list[Episode]  # played in this call
    skipped: int  # planned episodes already on disk (``resume``)
    metrics: dict[str, float] = field(default_factory=dict)  # of this call's episodes
    # every valid episode of the trajectory file, in file order: those a resumed recording found, then this call's
    recorded: list[Episode] = field(default_factory=list)


def run_paths(out: str | Path) -> tuple[Path, Path]:
    """``--out X.jsonl`` → (X.jsonl, X_run/); ``--out DIR`` → (DIR/trajectories.jsonl, DIR)."""
    out = Path(out)
    if out.suffix == ".jsonl":
        return out, out.with_name(out.stem + "_run")
    return out / "trajectories.jsonl", out


def _run_id(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:12]


def _episode_row(e: Episode) -> dict[str, Any]:
    return {
        "episode_id": e.episode_id,
        "conductor": e.conductor.name,
        "family": e.task.family,
        "task_id": e.task.id,
        "success": int(e.success),
        "return": round(e.return_, 6),
        "turns": e.worker_turns,
        "tokens": e.total_tokens,
        "truncated": int(e.truncated),
        "wall_time_s": e.usage.get("wall_time_s", 0.0),
        "error": e.error.cause if e.error is not None else "",
    }


def planned_jobs(cfg: RecordConfig, session: Session) -> dict[str, list[EpisodeJob]]:
    """The episodes a recording plans, per conductor spec: the same on every run (``--resume`` relies on it)."""
    if cfg.split not in SPLITS:
        raise ValueError(f"--split: expected one of {', '.join(SPLITS)}, got {cfg.split!r}")
    seed, team = cfg.run.seed, session.team
    tasks = session.family.generate(cfg.split, cfg.episodes, seed, cfg.difficulty)
    draws = seed if cfg.sampling_seed is None else cfg.sampling_seed
    tag = "" if cfg.sampling_seed is None else f"-r{cfg.sampling_seed}"
    out = {}
    for spec in cfg.conductor_specs():
        name = exploring_name(split_spec(spec)[0], cfg.epsilon)
        out[spec] = plan_jobs(tasks, draws, f"{team.name}-{name}-{cfg.split}-s{seed}{tag}")
    return out


@contextlib.contextmanager
def screen_to_log(log: Path) -> Iterator[None]:
    """Everything written to the process's stderr (library progress bars such as "Loading weights", warnings,
    llama.cpp's C-level logs) goes to ``log`` while a person works at the terminal; restored on the way out, so an
    error is still printed where they see it."""
    log.parent.mkdir(parents=True, exist_ok=True)
    sys.stderr.flush()
    saved = os.dup(2)
    with log.open("ab") as f:
        os.dup2(f.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)


def is_interactive(cfg: RecordConfig) -> bool:
    """A person conducts (``--conductor human``): one episode at a time and a quiet screen."""
    return any(split_spec(spec)[0] == "human" for spec in cfg.conductor_specs())


def record(
    cfg: RecordConfig,
    out: str | Path,
    resume: bool = False,
    session: Session | None = None,
    player: EpisodePlayer | None = None,
) -> RecordResult:
    """Record ``cfg.episodes`` episodes; with ``resume`` continue a killed recording exactly. ``player`` plays them
    (a caller's, shared by its recordings: one team's Ray actors); None = one picked from ``cfg.run`` for this call.

    With a human conductor the session's screen holds only the conversation: the progress bar is off and the
    libraries' output goes to ``RUN_DIR/session.log``. ``policies.QuitSession`` (the expert's ``q``) propagates
    after every completed episode is on disk."""
    if is_interactive(cfg):
        if cfg.run.ray or cfg.run.ray_address:
            raise ValueError("--ray: a person conducts one episode at a time in this terminal; drop --ray for human")
        cfg = replace(cfg, run=replace(cfg.run, progress=False))
        with screen_to_log(run_paths(out)[1] / "session.log"):
            return _record(cfg, out, resume, session, player)
    return _record(cfg, out, resume, session, player)


def _record(
    cfg: RecordConfig, out: str | Path, resume: bool, session: Session | None, player: EpisodePlayer | None
) -> RecordResult:
    traj_path, run_dir = run_paths(out)
    session = session or Session.of(cfg.team, cfg.family, cfg.run)
    team, family = session.team, session.family
    seed = cfg.run.seed
    plans = planned_jobs(cfg, session)
    episodes: list[Episode] = []
    skipped = 0
    stats = RolloutStats()
    conductor_counts: dict[str, float] = {}
    with contextlib.ExitStack() as stack:
        if player is None:  # this recording's own (in this process: the workers load before any file is opened)
            players = stack.enter_context(Players(cfg.run))
            player = stack.enter_context(players.open(cfg.team, cfg.family, session))
        writer = stack.enter_context(TrajectoryWriter(traj_path, resume=resume))
        config = {**asdict(cfg), "resume": resume}
        write_config(run_dir, {"config": config, "team_file": str(team.path), "team": team.raw, **provenance()})
        metrics_log = MetricsWriter(run_dir, resume=resume)  # one row per recorded episode
        for spec, jobs in plans.items():
            name = exploring_name(split_spec(spec)[0], cfg.epsilon)
            run_id = _run_id(team.name, name, family.name, cfg.split, seed, cfg.difficulty)
            todo = [j for j in jobs if j.episode_id not in writer.done_ids]
            skipped += len(jobs) - len(todo)
            plan = EnginePlan(spec, name, run_id, seed, cfg.epsilon, tuple(cfg.perturb))
            on_episode = lambda e: metrics_log.write(_episode_row(e))  # noqa: E731
            played = player.play(plan, todo, writer, on_episode, len(jobs))
            episodes += played.episodes
            stats.merge(played.stats)
            for k, v in played.counters.items():  # an LLM conductor's reply counts (this run's decisions)
                conductor_counts[k] = conductor_counts.get(k, 0) + v
    metrics = {**stats.as_metrics(), **episode_metrics(episodes), **conductor_counts}
    (run_dir / "summary.json").write_text(json.dumps(metrics, indent=2), encoding="utf-8")
    return RecordResult(traj_path, run_dir, episodes, skipped, metrics, [*writer.earlier, *episodes])


__all__ = ["RecordConfig", "RecordResult", "planned_jobs", "record", "run_paths"]
