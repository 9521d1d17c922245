"""Fault-injection soak: ``orchestra record`` through a flaky serving stack, checked for crashes, lost and duplicated
episodes, and errored episodes that match the unrecoverable faults injected.

    python benchmarks/faults.py [--episodes 400] [--rate 0.5] [--max-retries 3] [--episode-retries 0]
                                [--max-tokens 12] [--num-envs 4] [--seed 0] [--out runs/faults]

A real ``llama_cpp.server`` serves the embedded SmolLM2; `orchestra.backends.fault_proxy.FaultProxy` sits in front
of it and faults a share ``--rate`` of the requests (HTTP 500/502/503, 429 with Retry-After, timeouts, connection
resets, bodies cut short, non-JSON and schema-breaking 200 replies). The arithmetic team's two LLM workers talk to
the proxy through the HTTP backend (response cache off, so every turn is a request); the ``critique`` schedule
makes three LLM requests per episode. The soak then checks, and prints:

- **crashes**: the recording returned normally (0 or the exception);
- **lost / duplicated**: the trajectory file holds every planned episode id exactly once and no damaged line;
- **errored episodes vs unrecoverable faults**: an episode errors exactly when one of its requests met a fault on
  each of its ``max_retries + 1`` attempts; the proxy counts those runs (by the body, which a retry resends), so
  the two counts must be equal, cause by cause.

The client's timeout (10 s) is far above a forwarded request's latency (well under a second for a dozen tokens,
several queued), so every timeout the client sees is one the proxy injected (it hangs 1 s past the timeout).

``run(...)`` returns the figures (the slow test ``tests/test_faults.py`` runs a short soak through it).
"""

from __future__ import annotations

import argparse
import json
import platform
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repo importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx  # noqa: E402
import yaml  # noqa: E402

from orchestra.backends import smollm2_gguf_path  # noqa: E402
from orchestra.backends.fault_proxy import FaultProxy  # noqa: E402
from orchestra.jobs.record import RecordConfig, planned_jobs, record  # noqa: E402
from orchestra.runtime.session import RunOptions, Session  # noqa: E402
from trajectories import read_trajectories  # noqa: E402

TEAM = Path(__file__).resolve().parents[1] / "orchestra" / "teams" / "arithmetic.yaml"
CONDUCTOR = "critique"  # solver, critic, solver again, then the calculator: three LLM requests an episode


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_llama_server(n_ctx: int = 2048, timeout_s: float = 180.0) -> tuple[subprocess.Popen[bytes], str]:
    """A real ``llama_cpp.server`` on the embedded SmolLM2, answering on a free port (not started where llama.cpp's
    crash probe fails: its message is raised instead)."""
    from orchestra.backends.llamacpp_probe import require

    require(smollm2_gguf_path())
    port = _free_port()
    cmd = [sys.executable, "-m", "llama_cpp.server", "--model", str(smollm2_gguf_path()), "--host", "127.0.0.1"]
    cmd += ["--port", str(port), "--n_ctx", str(n_ctx), "--verbose", "False"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            err = proc.stderr.read().decode(errors="replace")[-2000:] if proc.stderr else ""
            raise RuntimeError(f"llama_cpp.server exited with {proc.returncode}: {err}")
        try:
            if httpx.get(f"{url}/v1/models", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"llama_cpp.server did not answer /v1/models within {timeout_s:.0f} s")
        time.sleep(0.5)


def team_file(path: Path, url: str, max_retries: int, timeout_s: float, max_tokens: int) -> Path:
    """The arithmetic team with its LLM workers on the HTTP backend at ``url`` (short replies: a soak counts faults,
    not answers; the hash embedder: no encoder to load)."""
    spec = yaml.safe_load(TEAM.read_text(encoding="utf-8"))
    spec["embedder"] = "hash"
    spec["backends"] = {
        "smollm2": {
            "type": "http",
            "base_url": url,
            "model": "smollm2",
            "timeout_s": timeout_s,
            "max_retries": max_retries,
            "backoff_s": 0.01,
            "max_backoff_s": 0.05,
        }
    }
    for w in spec["workers"]:
        if w.get("kind") == "llm":
            w["generation"] = {**w.get("generation", {}), "max_tokens": max_tokens}
    path.write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    return path


def run(
    episodes: int = 400,
    rate: float = 0.5,
    max_retries: int = 3,
    episode_retries: int = 0,
    max_tokens: int = 12,
    num_envs: int = 4,
    seed: int = 0,
    out: Path = Path("runs/faults"),
    timeout_s: float = 10.0,
    progress: bool = True,
) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    traj = out / "trajectories.jsonl"
    for stale in (traj, out / "metrics.csv", out / "metrics.jsonl"):
        stale.unlink(missing_ok=True)  # a soak is one uninterrupted recording
    server, upstream = start_llama_server()
    t0 = time.perf_counter()
    crash, drained = None, False
    try:
        with FaultProxy(upstream, rate=rate, seed=seed, give_up_after=max_retries + 1, hang_s=timeout_s + 1.0) as px:
            team = team_file(out / "team.yaml", px.url, max_retries, timeout_s, max_tokens)
            cfg = RecordConfig(
                str(team),
                CONDUCTOR,
                episodes,
                "test",
                run=RunOptions(
                    seed=seed, num_envs=num_envs, use_cache=False, progress=progress, episode_retries=episode_retries
                ),
            )
            try:
                res = record(cfg, out)
                metrics = res.metrics
            except Exception as e:  # noqa: BLE001 - the soak reports a crash, it does not hide it
                crash, metrics = f"{type(e).__name__}: {e}", {}
            drained = px.drain()  # a request the client gave up on may still be in flight upstream: wait for it
            ledger = px.ledger
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
    wall = time.perf_counter() - t0
    report = read_trajectories(traj) if traj.exists() else None
    eps = report.episodes if report is not None else []
    ids = Counter(e.episode_id for e in eps)
    planned = {j.episode_id for jobs in planned_jobs(cfg, Session.of(cfg.team, None, cfg.run)).values() for j in jobs}
    errored = Counter(e.error.cause for e in eps if e.error is not None)
    expected = ledger.unrecoverable_causes()
    figures = {
        "machine": f"{platform.machine()} {platform.processor() or platform.system()}, python {platform.python_version()}",
        "episodes_planned": episodes,
        "requests": ledger.requests,
        "forwarded": ledger.forwarded,
        "late_replies": ledger.late_replies,
        "faults_injected": ledger.faults,
        "faults_by_kind": dict(sorted(ledger.injected.items())),
        "unrecoverable": sum(expected.values()),
        "unrecoverable_by_cause": dict(sorted(expected.items())),
        "upstream_errors": ledger.upstream_errors,
        "drained": drained,
        "upstream_samples": ledger.upstream_samples,
        "crashes": 0 if crash is None else 1,
        "crash": crash,
        "episodes_recorded": len(eps),
        "lost": len(planned - set(ids)),
        "duplicated": sum(n - 1 for n in ids.values() if n > 1)
        + sum(1 for p in (report.problems if report else []) if p.kind == "duplicate"),
        "damaged_lines": len(report.problems) if report is not None else 0,
        "errored_episodes": sum(errored.values()),
        "errored_by_cause": dict(sorted(errored.items())),
        "errors_match_unrecoverable": errored == expected,
        "episode_retries": metrics.get("faults/episode_retries", 0),
        "success_rate_of_completed": metrics.get("rollout/success_rate"),
        "wall_s": round(wall, 1),
    }
    (out / "soak.json").write_text(json.dumps(figures, indent=2), encoding="utf-8")
    return figures


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--episodes", type=int, default=400, help="episodes to record (three LLM requests each)")
    ap.add_argument("--rate", type=float, default=0.5, help="share of requests faulted")
    ap.add_argument("--max-retries", type=int, default=3, help="the HTTP backend's retries per request")
    ap.add_argument("--episode-retries", type=int, default=0, help="replays of a faulted episode (RunOptions)")
    ap.add_argument("--max-tokens", type=int, default=12, help="new tokens per LLM turn")
    ap.add_argument("--num-envs", type=int, default=4, help="envs stepped at once (requests in flight)")
    ap.add_argument("--seed", type=int, default=0, help="run seed: tasks, episode seeds and the fault draws")
    ap.add_argument("--out", type=Path, default=Path("runs/faults"), help="run directory")
    a = ap.parse_args()
    f = run(a.episodes, a.rate, a.max_retries, a.episode_retries, a.max_tokens, a.num_envs, a.seed, a.out)
    print(json.dumps(f, indent=2))
    ok = f["crashes"] == 0 and f["lost"] == 0 and f["duplicated"] == 0 and f["errors_match_unrecoverable"]
    print(
        f"\nsoak: {f['faults_injected']} faults injected over {f['requests']} requests, {f['unrecoverable']} "
        f"unrecoverable; {f['crashes']} crashes, {f['lost']} lost, {f['duplicated']} duplicated; "
        f"{f['errored_episodes']} errored episodes {'=' if f['errors_match_unrecoverable'] else '≠'} unrecoverable "
        f"faults by cause; {f['wall_s']} s on {f['machine']}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
