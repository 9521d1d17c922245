"""What every job writes into its run directory: the resolved config and per-episode metrics (CSV + JSONL)."""

from __future__ import annotations

import json
import platform
import time
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


__all__ = ["write_run_config"]
