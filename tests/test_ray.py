"""Ray-distributed rollouts on a local cluster (``ray.init(num_cpus=2)``): the same episodes as one process, the driver
the single crash-safe writer (a SIGKILL mid-run resumes with no gap and no duplicate), evaluation on the same pool."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestra.jobs.evaluate import EvaluateConfig, evaluate
from orchestra.jobs.record import RecordConfig, record
from orchestra.runtime.distributed import RayOptions, plan_width
from orchestra.runtime.session import RunOptions
from tests.test_rollout import short_team
from trajectories import Episode, read_trajectories

pytestmark = pytest.mark.slow

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def local_cluster() -> Iterator[None]:
    """One local cluster for the module's in-process tests (the recordings find it connected and keep it)."""
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, object_store_memory=128 * 1024 * 1024)
    yield
    ray.shutdown()


def comparable(e: Episode) -> dict[str, Any]:
    """An episode's record without the one field that measures the machine (its wall-clock time)."""
    d = e.to_dict()
    d["usage"] = {k: v for k, v in d["usage"].items() if k != "wall_time_s"}
    return d


def test_record_on_an_existing_cluster(tmp_path: Path) -> None:
    """The multi-node launch of docs/recording.md on one node: ``ray start --head``, then ``record --ray-address``. First in the
    module: its ``ray stop`` must not meet the in-process cluster of the tests below."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ray_cli = str(Path(sys.executable).with_name("ray"))
    # Ray's token authentication on both ends, as the launch in docs/recording.md says: the token generated first (a fresh machine
    # has none, and `ray start` with token auth refuses to start without one), under a home of the test's own
    home = tmp_path / "home"
    home.mkdir()
    env = {**os.environ, "ORCHESTRA_CACHE_DIR": str(tmp_path / "cache"), "RAY_USAGE_STATS_ENABLED": "0"}
    env.update(HOME=str(home), RAY_AUTH_MODE="token")
    for var in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        env.pop(var, None)
    subprocess.run([ray_cli, "get-auth-token", "--generate"], env=env, check=True, capture_output=True, timeout=120)
    assert (home / ".ray" / "auth_token").stat().st_size > 0
    head = [ray_cli, "start", "--head", f"--port={port}", "--num-cpus=2", "--include-dashboard=false"]
    started = subprocess.run(head, env=env, capture_output=True, text=True, timeout=180)
    assert started.returncode == 0, started.stderr[-2000:]
    try:
        team = str(short_team(tmp_path))
        out = tmp_path / "far.jsonl"
        args = [sys.executable, "-m", "orchestra.cli", "record", "--team", team, "--conductor", "pipeline"]
        args += ["--episodes", "4", "--quiet", "--ray-address", f"127.0.0.1:{port}", "--out", str(out)]
        r = subprocess.run(args, env=env, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr[-2000:]
        ids = sorted(e.episode_id for e in read_trajectories(out, strict=True).episodes)
        assert ids == [f"arithmetic-pipeline-train-s0-{i:05d}" for i in range(4)]
    finally:
        subprocess.run([ray_cli, "stop", "--force"], env=env, capture_output=True, timeout=120)


def test_ray_options_and_chunking() -> None:
    assert RayOptions.of(RunOptions()) is None
    assert RayOptions.of(RunOptions(ray_address="auto")) == RayOptions("auto", 2, 1.0)  # an address implies --ray
    with pytest.raises(ValueError, match="--ray-actors"):
        RayOptions.of(RunOptions(ray=True, ray_actors=0))
    assert plan_width(8, 2, 8) == 4  # both actors busy
    assert plan_width(100, 2, 8) == 8  # at most the engine's width
    assert plan_width(1, 4, 8) == 1


def test_ray_recording_equals_the_single_process_one(tmp_path: Path, local_cluster: None) -> None:
    """8 episodes of the real SmolLM2 team under two conductors (one exploring, so a seeded random draw is in play),
    once in this process and once on two actors: the same episode set, field for field (the serial llama.cpp path,
    no cache: every reply is generated in both runs)."""
    team = str(short_team(tmp_path))
    run = RunOptions(seed=3, num_envs=4, use_cache=False, progress=False, serial=True)
    cfg = RecordConfig(team=team, conductor="round_robin,heuristic", episodes=4, epsilon=0.2, run=run)
    here = record(cfg, tmp_path / "here.jsonl")
    far = record(RecordConfig(**{**cfg.__dict__, "run": RunOptions(**{**run.__dict__, "ray": True})}), tmp_path / "ray")
    a = {e.episode_id: comparable(e) for e in read_trajectories(here.trajectories, strict=True).episodes}
    b = {e.episode_id: comparable(e) for e in read_trajectories(far.trajectories, strict=True).episodes}
    assert len(a) == 8 and a.keys() == b.keys()
    for k in a:
        assert a[k] == b[k], k
    assert any(
        m.message is not None and m.message.model_id.startswith("llamacpp:") for e in far.episodes for m in e.steps
    )
    assert (
        far.metrics["rollout/episodes"] == 8 and far.metrics["rollout/llm_calls"] == here.metrics["rollout/llm_calls"]
    )
    rows = [json.loads(x) for x in (far.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert sorted(r["episode_id"] for r in rows) == sorted(a)  # the driver logged every episode it wrote


def test_evaluate_on_ray_reuses_one_pool_and_matches(tmp_path: Path, local_cluster: None) -> None:
    team = str(short_team(tmp_path))
    run = RunOptions(seed=0, num_envs=2, use_cache=False, progress=False, serial=True)
    cfg = EvaluateConfig(teams=(team,), conductors=("round_robin", "pipeline"), episodes=3, run=run)
    rows_here = evaluate(cfg, tmp_path / "here").rows
    cfg_ray = EvaluateConfig(**{**cfg.__dict__, "run": RunOptions(**{**run.__dict__, "ray": True})})
    ev_ray = evaluate(cfg_ray, tmp_path / "ray")
    rows_ray, paths = ev_ray.rows, ev_ray.paths
    assert [(r.conductor, r.success_rate, r.mean_tokens) for r in rows_here] == [
        (r.conductor, r.success_rate, r.mean_tokens) for r in rows_ray
    ]
    assert paths["csv"].stat().st_size > 0


def test_sigkill_of_the_ray_driver_resumes_without_gaps_or_duplicates(tmp_path: Path) -> None:
    team = str(short_team(tmp_path))
    out = tmp_path / "killed.jsonl"
    n = 8
    env = {**os.environ, "ORCHESTRA_CACHE_DIR": str(tmp_path / "cache")}
    args = [sys.executable, "-m", "orchestra.cli", "record", "--team", team, "--conductor", "round_robin"]
    args += ["--episodes", str(n), "--num-envs", "1", "--no-cache", "--quiet", "--ray", "--out", str(out)]
    proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        if out.exists() and out.read_text().count("\n") >= 2:
            break
        time.sleep(0.05)
    assert proc.poll() is None, f"the recording ended before it could be killed: {proc.stderr and proc.stderr.read()}"
    proc.send_signal(signal.SIGKILL)  # the driver only: its actors and local cluster are Ray's to reap
    proc.wait()
    before = read_trajectories(out).episodes
    assert 2 <= len(before) < n
    r = subprocess.run([*args, "--resume"], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    report = read_trajectories(out, strict=True)
    ids = [e.episode_id for e in report.episodes]
    assert len(ids) == n == len(set(ids)) and not report.problems
    assert ids[: len(before)] == [e.episode_id for e in before]  # nothing written was lost or redone
    assert sorted(ids) == [f"arithmetic-round_robin-train-s0-{i:05d}" for i in range(n)]  # no gaps


def test_a_bad_cluster_address_is_one_clear_error(tmp_path: Path) -> None:
    team = str(short_team(tmp_path))
    env = {**os.environ, "ORCHESTRA_CACHE_DIR": str(tmp_path / "cache")}
    args = [sys.executable, "-m", "orchestra.cli", "record", "--team", team, "--conductor", "round_robin"]
    args += ["--episodes", "2", "--quiet", "--ray-address", "127.0.0.1:1", "--out", str(tmp_path / "x.jsonl")]
    r = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode != 0
    assert "--ray: could not start or reach the Ray cluster at 127.0.0.1:1" in r.stderr
    assert "Traceback" not in r.stderr
