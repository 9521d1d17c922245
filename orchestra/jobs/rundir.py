"""What every job writes into its run directory: the resolved config and per-episode metrics (CSV + JSONL)."""

from __future__ import annotations

import csv
import json
import platform
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from orchestra.runtime.team_file import TeamSpec


def write_run_config(run_dir: Path, config: dict[str, Any], team: TeamSpec) -> None:
    """``run_dir/config.json``: the job's resolved config, the team file (path and content) and the machine."""
    run_dir.mkdir(parents=True, exist_ok=True)
    resolved = {
        "config": config,
        "team_file": str(team.path),
        "team": team.raw,
        "machine": {"platform": platform.platform(), "python": platform.python_version()},
        "written_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    (run_dir / "config.json").write_text(json.dumps(resolved, indent=2, default=str), encoding="utf-8")


def append_metrics(run_dir: Path, rows: Sequence[dict[str, Any]]) -> None:
    """Append rows to ``metrics.jsonl`` and ``metrics.csv`` (one header: later rows keep the first columns)."""
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


__all__ = ["append_metrics", "write_run_config"]
