"""CLI smoke runs via subprocess, incl. resume after SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.test_rollout import short_team
from trajectories import load_pandas, read_trajectories

pytestmark = pytest.mark.slow


def orchestra(*args: str, env: dict[str, str] | None = None, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "orchestra", *args], capture_output=True, text=True, timeout=timeout, env=env
    )


@pytest.fixture()
def cli_env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "ORCHESTRA_CACHE_DIR": str(tmp_path / "cache")}


def test_help_everywhere() -> None:
    top = orchestra("--help")
    assert top.returncode == 0 and "record" in top.stdout and "evaluate" in top.stdout
    for cmd in (["record"], ["evaluate"], ["trajectories"], ["trajectories", "stats"], ["demo"], ["teams"]):
        r = orchestra(*cmd, "--help")
        assert r.returncode == 0 and "usage: orchestra" in r.stdout, cmd


def test_teams_and_families_listings() -> None:
    r = orchestra("teams")
    assert r.returncode == 0
    for name in ("arithmetic", "logic_grid", "blocksworld", "code_synthesis"):
        assert name in r.stdout
    r = orchestra("families")
    assert r.returncode == 0 and "constraint_checker" in r.stdout and "jsonl" in r.stdout


def test_bad_input_gives_a_clear_error(tmp_path: Path, cli_env: dict[str, str]) -> None:
    r = orchestra(
        "record", "--team", "nope", "--conductor", "round_robin", "--out", str(tmp_path / "x.jsonl"), env=cli_env
    )
    assert r.returncode == 2 and "unknown team 'nope'" in r.stderr and "Traceback" not in r.stderr
    r = orchestra("trajectories", "stats", str(tmp_path / "missing.jsonl"))
    assert r.returncode == 2 and "missing.jsonl" in r.stderr and "Traceback" not in r.stderr


def test_record_stats_show_export_evaluate(tmp_path: Path, cli_env: dict[str, str]) -> None:
    team = str(short_team(tmp_path))
    out = tmp_path / "rec.jsonl"
    r = orchestra(
        "record",
        "--team",
        team,
        "--conductor",
        "pipeline",
        "--episodes",
        "3",
        "--seed",
        "2",
        "--out",
        str(out),
        "--quiet",
        env=cli_env,
    )
    assert r.returncode == 0, r.stderr
    assert "recorded 3 episodes" in r.stdout
    assert len(read_trajectories(out, strict=True).episodes) == 3
    # refusing to overwrite without --resume
    r = orchestra(
        "record",
        "--team",
        team,
        "--conductor",
        "pipeline",
        "--episodes",
        "3",
        "--out",
        str(out),
        "--quiet",
        env=cli_env,
    )
    assert r.returncode == 2 and "--resume" in r.stderr
    r = orchestra("trajectories", "stats", str(out), "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["count"] == 3
    r = orchestra("trajectories", "show", str(out), "--index", "1")
    assert r.returncode == 0 and "conductor → solver:solve" in r.stdout
    pq = tmp_path / "steps.parquet"
    r = orchestra("trajectories", "export", str(out), "--to", str(pq))
    assert r.returncode == 0 and pq.exists()
    assert len(load_pandas(pq)) == sum(len(e.steps) for e in read_trajectories(out).episodes)
    # damaged line: reported with its number, exit code 1, good episodes still counted
    with out.open("a") as f:
        f.write("{not json}\n")
    r = orchestra("trajectories", "stats", str(out), "--json")
    assert r.returncode == 1 and "rec.jsonl:4:" in r.stderr and json.loads(r.stdout)["count"] == 3
    ev = tmp_path / "eval"
    r = orchestra(
        "evaluate",
        "--team",
        team,
        "--conductor",
        "pipeline",
        "--conductor",
        "random",
        "--episodes",
        "2",
        "--out",
        str(ev),
        "--quiet",
        env=cli_env,
    )
    assert r.returncode == 0, r.stderr
    assert "| arithmetic | pipeline | 2 |" in r.stdout and "| arithmetic | random | 2 |" in r.stdout
    for f in ("results.csv", "results.md", "success.png"):
        assert (ev / f).stat().st_size > 0


def test_resume_after_sigkill_leaves_exactly_n_distinct_episodes(tmp_path: Path, cli_env: dict[str, str]) -> None:
    team = str(short_team(tmp_path))
    out = tmp_path / "killed.jsonl"
    n = 6
    args = [
        sys.executable,
        "-m",
        "orchestra.cli",
        "record",
        "--team",
        team,
        "--conductor",
        "round_robin",
        "--episodes",
        str(n),
        "--num-envs",
        "1",
        "--no-cache",
        "--quiet",
        "--out",
        str(out),
    ]
    proc = subprocess.Popen(args, env=cli_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        if out.exists() and out.read_text().count("\n") >= 2:
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the recording finished before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    before = read_trajectories(out).episodes
    assert 2 <= len(before) < n
    r = subprocess.run([*args, "--resume"], env=cli_env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    report = read_trajectories(out, strict=True)
    ids = [e.episode_id for e in report.episodes]
    assert len(ids) == n == len(set(ids)) and not report.problems
    assert ids[: len(before)] == [e.episode_id for e in before]  # nothing recorded was lost or redone
    assert sorted(ids) == [f"arithmetic-round_robin-train-s0-{i:05d}" for i in range(n)]  # no gaps
