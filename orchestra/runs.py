"""Jobs behind the CLI: record trajectories, evaluate conductors. Each writes a run directory holding
its resolved config, its trajectories and its metrics (CSV + JSONL)."""

from __future__ import annotations

import csv
import hashlib
import json
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from envs.tasks.base import Split, TaskFamily
from envs.tasks.registry import get_family
from orchestra.conductors import conductor_factory, split_spec
from orchestra.evaluate import ResultRow, evaluation_report, format_table
from orchestra.rollout import RolloutEngine, RolloutStats, episode_metrics, plan_jobs
from orchestra.team import TeamSpec, load_team
from orchestra.workers import Worker, build_workers
from policies.base import ConductorPolicy
from policies.exploration import EpsilonGreedyConductor, exploring_name
from trajectories import Episode, TrajectoryWriter, read_trajectories


@dataclass
class RecordConfig:
    """Resolved settings of one recording; written to the run directory."""

    team: str  # built-in team name or team file path
    conductor: str  # conductor NAME[:CHECKPOINT]; several, comma-separated, each run on the same tasks
    episodes: int = 20  # episodes to record
    split: str = "train"  # task split: train or test
    family: str | None = None  # task family (default: the team's)
    difficulty: int | None = None  # one difficulty level, or None to mix them
    seed: int = 0  # run seed: tasks and per-episode seeds derive from it
    num_envs: int = 8  # envs stepped at once (worker requests batched across them)
    use_cache: bool = True  # response cache for temperature-0 calls
    cache_path: str | None = None  # default: $ORCHESTRA_CACHE_DIR/responses.sqlite
    progress: bool = True  # progress bar on stderr
    epsilon: float = 0.0  # ε-random exploration: share of decisions replaced by a random legal action

    def conductor_specs(self) -> list[str]:
        specs = [c.strip() for c in self.conductor.split(",") if c.strip()]
        if not specs:
            raise ValueError("--conductor: name at least one conductor")
        return specs


@dataclass
class RecordResult:
    trajectories: Path
    run_dir: Path
    episodes: list[Episode]
    skipped: int
    metrics: dict[str, float] = field(default_factory=dict)


def run_paths(out: str | Path) -> tuple[Path, Path]:
    """``--out X.jsonl`` → (X.jsonl, X_run/); ``--out DIR`` → (DIR/trajectories.jsonl, DIR)."""
    out = Path(out)
    if out.suffix == ".jsonl":
        return out, out.with_name(out.stem + "_run")
    return out / "trajectories.jsonl", out


def resolve_family(team: TeamSpec, family: str | None) -> TaskFamily:
    name = family or team.family
    if name.endswith(".jsonl"):
        return get_family("jsonl", path=name)
    return get_family(name)


class Session:
    """A loaded team with its family and workers, reused across conductors of one job."""

    def __init__(self, team: str, family: str | None, use_cache: bool, cache_path: str | None) -> None:
        self.team = load_team(team)
        self.family = resolve_family(self.team, family)
        self.workers: dict[str, Worker] = build_workers(
            self.team, self.family.tools(), cache_path=Path(cache_path) if cache_path else None, use_cache=use_cache
        )

    def backends(self) -> dict[str, Any]:
        return {k: w.backend for k, w in self.workers.items()}


def _run_id(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:12]


def _write_config(run_dir: Path, config: dict[str, Any], team: TeamSpec) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    resolved = {
        "config": config,
        "team_file": str(team.path),
        "team": team.raw,
        "machine": {"platform": platform.platform(), "python": platform.python_version()},
        "written_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    (run_dir / "config.json").write_text(json.dumps(resolved, indent=2, default=str), encoding="utf-8")


def _append_metrics(run_dir: Path, rows: Sequence[dict[str, Any]]) -> None:
    if not rows:
        return
    with (run_dir / "metrics.jsonl").open("a", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    csv_path = run_dir / "metrics.csv"
    keys = sorted({k for r in rows for k in r})
    new = not csv_path.exists()
    if not new:  # keep one header: extend rows to the existing columns
        with csv_path.open() as f:
            keys = next(csv.reader(f), keys)
    with csv_path.open("a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys, extrasaction="ignore")
        if new:
            w.writeheader()
        w.writerows(rows)


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
    }


def _exploring(base: Callable[[], ConductorPolicy], epsilon: float, seed: int) -> ConductorPolicy:
    return EpsilonGreedyConductor(base(), epsilon, seed)


def record(cfg: RecordConfig, out: str | Path, resume: bool = False, session: Session | None = None) -> RecordResult:
    """Record ``cfg.episodes`` episodes; with ``resume`` continue a killed recording exactly."""
    traj_path, run_dir = run_paths(out)
    session = session or Session(cfg.team, cfg.family, cfg.use_cache, cfg.cache_path)
    team, family = session.team, session.family
    if cfg.split not in ("train", "test"):
        raise ValueError(f"--split: expected train or test, got {cfg.split!r}")
    split: Split = cfg.split  # type: ignore[assignment]
    tasks = family.generate(split, cfg.episodes, cfg.seed, cfg.difficulty)
    specs = cfg.conductor_specs()
    episodes: list[Episode] = []
    skipped = 0
    stats = RolloutStats()
    with TrajectoryWriter(traj_path, resume=resume) as writer:
        _write_config(run_dir, {**cfg.__dict__, "resume": resume}, team)
        for spec in specs:
            label, checkpoint = split_spec(spec)
            name = exploring_name(label, cfg.epsilon)
            run_id = _run_id(team.name, name, family.name, cfg.split, cfg.seed, cfg.difficulty)
            jobs = plan_jobs(tasks, cfg.seed, f"{team.name}-{name}-{cfg.split}-s{cfg.seed}")
            todo = [j for j in jobs if j.episode_id not in writer.done_ids]
            skipped += len(jobs) - len(todo)
            base = conductor_factory(spec, team, cfg.seed, session.backends())
            factory = base
            if cfg.epsilon > 0:
                factory = partial(_exploring, base, cfg.epsilon, cfg.seed)
            engine = RolloutEngine(
                team,
                family,
                session.workers,
                factory,
                conductor_name=name,
                conductor_checkpoint=checkpoint,
                run_id=run_id,
                num_envs=cfg.num_envs,
                progress=cfg.progress,
            )
            episodes += engine.run(
                todo, writer=writer, on_episode=lambda e: _append_metrics(run_dir, [_episode_row(e)])
            )
            stats.merge(engine.stats)
    metrics = {**stats.as_metrics(), **episode_metrics(episodes)}
    (run_dir / "summary.json").write_text(json.dumps(metrics, indent=2), encoding="utf-8")
    return RecordResult(traj_path, run_dir, episodes, skipped, metrics)


@dataclass
class EvaluateConfig:
    teams: list[str]  # one team per task family (built-in names or files)
    # conductor NAME or LABEL:CHECKPOINT, all run on the same tasks and seeds; "{team}" in a checkpoint
    # path is replaced by each team's name (learned conductors are trained per team)
    conductors: list[str]
    episodes: int = 20  # held-out tasks per family
    split: str = "test"  # the held-out split
    seed: int = 0
    num_envs: int = 8
    use_cache: bool = True
    cache_path: str | None = None
    progress: bool = True


def evaluate(cfg: EvaluateConfig, out_dir: str | Path) -> tuple[list[ResultRow], dict[str, Path]]:
    """Run every conductor on the same held-out tasks of every team's family; write the report."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    all_eps: list[Episode] = []
    for team_name in cfg.teams:
        session = Session(team_name, None, cfg.use_cache, cfg.cache_path)
        for spec in cfg.conductors:
            conductor = spec.replace("{team}", session.team.name)
            rc = RecordConfig(
                team_name,
                conductor,
                cfg.episodes,
                cfg.split,
                seed=cfg.seed,
                num_envs=cfg.num_envs,
                use_cache=cfg.use_cache,
                cache_path=cfg.cache_path,
                progress=cfg.progress,
            )
            label, _ = split_spec(conductor)
            res = record(rc, out / "episodes" / f"{session.team.name}-{label}.jsonl", resume=True, session=session)
            all_eps.extend(read_trajectories(res.trajectories).episodes)
    rows, _paired, paths = evaluation_report(all_eps, out)
    (out / "config.json").write_text(json.dumps(cfg.__dict__, indent=2), encoding="utf-8")
    return rows, paths


__all__ = [
    "EvaluateConfig",
    "RecordConfig",
    "RecordResult",
    "Session",
    "evaluate",
    "format_table",
    "record",
    "run_paths",
]
