"""The inspection commands: trajectory files (stats, one episode, Parquet export) and the catalogue of built-in
teams and task families."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from trajectories import Episode, ReadReport


@dataclass(frozen=True)
class ExportConfig:
    """``orchestra trajectories export``: a trajectory file as a Parquet table."""

    path: str  # the trajectory JSONL file
    to: str  # output .parquet file
    table: Literal["steps", "episodes"] = "steps"  # one row per step or per episode


def read_files(paths: list[str]) -> ReadReport:
    """Every valid episode of the files (or directories' JSONL files), with the problems found (file:line)."""
    from trajectories import read_many

    return read_many([Path(p) for p in paths])


def read_file(path: str) -> ReadReport:
    """Every valid episode of one trajectory file, with the problems found (file:line)."""
    from trajectories import read_trajectories

    return read_trajectories(Path(path))


def pick_episode(report: ReadReport, path: str, episode: str | None, index: int | None) -> Episode:
    """One episode of a file's read report: by id, by index, or the first (ValueError naming the file if none)."""
    eps = report.episodes
    if not eps:
        raise ValueError(f"{path}: no valid episodes")
    if episode is not None:
        match = [e for e in eps if e.episode_id == episode]
        if not match:
            raise ValueError(f"{path}: no episode {episode!r} (first ids: {[e.episode_id for e in eps[:5]]})")
        return match[0]
    return eps[index or 0]


def export(cfg: ExportConfig) -> int | None:
    """Rows written (None if the writer does not say)."""
    from trajectories import to_parquet

    n = to_parquet(Path(cfg.path), Path(cfg.to), table=cfg.table)
    return n if isinstance(n, int) else None


def team_lines() -> list[str]:
    """One line per built-in team: its family, workers and turn budget."""
    from orchestra.runtime.team_file import builtin_teams, load_team

    lines = []
    for name in builtin_teams():
        t = load_team(name)
        workers = ", ".join(f"{w.name}({w.kind})" for w in t.env.workers)
        lines.append(f"{name:16s} family={t.family:15s} workers: {workers}  max_turns={t.env.max_turns}")
    return lines


def family_lines() -> list[str]:
    """One line per task family: its difficulty levels and tools."""
    from envs.tasks.registry import FAMILIES, get_family

    lines = []
    for name in FAMILIES:
        if name == "jsonl":
            lines.append(
                f"{name:16s} your own data (QA, GSM8K, MATH, MBPP, HumanEval): --family data.jsonl | data.parquet | "
                "a datasets.save_to_disk folder"
            )
            continue
        fam = get_family(name)
        lines.append(f"{name:16s} difficulties={list(fam.difficulties)} tools={sorted(fam.tools())}")
    return lines


__all__ = ["ExportConfig", "export", "family_lines", "pick_episode", "read_file", "read_files", "team_lines"]
