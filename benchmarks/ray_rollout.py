"""Ray rollout throughput: the same ``orchestra record`` work in one process, on 1 Ray actor and on 2, one run.

    python benchmarks/ray_rollout.py [--team arithmetic] [--conductor round_robin] [--episodes 16] [--num-envs 8]
                                     [--seed 0] [--serial]

All three runs record the same tasks with the same seeds, response cache off, on one local Ray cluster started once
(its start-up is outside the timings: it is printed on its own). Each actor reserves one CPU and runs llama.cpp on
one thread; the single process runs it on every core. A warm-up recording (other seed) loads the model and the sentence
encoder in this process and in every actor first, so no timed run pays a load another does not.

It prints episodes/s and completion tokens/s of each run, the ratios ``2 actors / 1 actor`` (how well rollouts scale
across processes) and ``2 actors / one process`` (what Ray buys over the engine's own batching on this machine),
the share of episodes identical across the runs, and the machine. Speed is never asserted in tests.
Importable: ``run(...)`` returns the figures.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repo importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def machine() -> str:
    import ray

    from benchmarks.record import machine as base

    return f"{base()} | ray {ray.__version__}"


def _comparable(e: Any) -> Any:
    d = e.to_dict()
    d["usage"] = {k: v for k, v in d["usage"].items() if k != "wall_time_s"}
    return d


def run(
    team: str = "arithmetic",
    conductor: str = "round_robin",
    episodes: int = 16,
    num_envs: int = 8,
    seed: int = 0,
    serial: bool = False,
) -> dict[str, Any]:
    import ray

    from orchestra.jobs.record import RecordConfig, record
    from orchestra.runtime.distributed import RayOptions, RayPool
    from orchestra.runtime.session import RunOptions, Session

    m: dict[str, Any] = {"machine": machine()}
    print(f"machine: {m['machine']}")
    print(
        f"work: orchestra record --team {team} --conductor {conductor} --episodes {episodes} --num-envs {num_envs} "
        f"--seed {seed} --no-cache{' --serial' if serial else ''}"
    )
    base = RunOptions(seed=seed, num_envs=num_envs, use_cache=False, progress=False, serial=serial)
    t0 = time.perf_counter()
    ray.init(num_cpus=os.cpu_count() or 2, include_dashboard=False, log_to_driver=False)
    m["ray_start_s"] = time.perf_counter() - t0
    results: dict[str, Any] = {}
    try:
        with tempfile.TemporaryDirectory() as tmp_s:
            tmp = Path(tmp_s)
            session = Session.of(team, None, base)
            warm = RunOptions(**{**base.__dict__, "seed": seed + 1})
            record(RecordConfig(team, conductor, 1, run=warm), tmp / "warm.jsonl", session=session)
            t0 = time.perf_counter()
            res = record(RecordConfig(team, conductor, episodes, run=base), tmp / "here.jsonl", session=session)
            results["one process"] = (time.perf_counter() - t0, res)
            for actors in (1, 2):
                run_opts = RunOptions(**{**base.__dict__, "ray": True, "ray_actors": actors})
                opts = RayOptions.of(run_opts)
                assert opts is not None
                t0 = time.perf_counter()
                with RayPool(opts, team, None, run_opts) as pool:
                    m[f"actors{actors}/start_s"] = time.perf_counter() - t0
                    record(RecordConfig(team, conductor, actors, run=warm), tmp / f"warm{actors}", player=pool)
                    t0 = time.perf_counter()
                    res = record(
                        RecordConfig(team, conductor, episodes, run=run_opts), tmp / f"ray{actors}", player=pool
                    )
                    results[f"{actors} actor{'s' if actors > 1 else ''}"] = (time.perf_counter() - t0, res)
    finally:
        ray.shutdown()
    print(f"\nRay local cluster start: {m['ray_start_s']:.1f} s (not in the timings)")
    print(f"{'run':12s} {'wall s':>7s} {'ep/s':>6s} {'compl tok/s':>11s}")
    for name, (wall, res) in results.items():
        tok = res.metrics["rollout/generated_tokens"]
        m[f"{name}/episodes_per_s"] = episodes / wall
        m[f"{name}/tokens_per_s"] = tok / wall
        print(f"{name:12s} {wall:7.1f} {episodes / wall:6.3f} {tok / wall:11.1f}")
    m["ratio_2_over_1_actor"] = m["2 actors/episodes_per_s"] / m["1 actor/episodes_per_s"]
    m["ratio_2_actors_over_one_process"] = m["2 actors/episodes_per_s"] / m["one process/episodes_per_s"]
    ref = {e.episode_id: _comparable(e) for e in results["one process"][1].episodes}
    for name in ("1 actor", "2 actors"):
        got = {e.episode_id: _comparable(e) for e in results[name][1].episodes}
        m[f"{name}/identical_share"] = sum(got.get(k) == v for k, v in ref.items()) / max(len(ref), 1)
    print(f"\nratio 2 actors / 1 actor: {m['ratio_2_over_1_actor']:.2f}x episodes/s")
    print(f"ratio 2 actors / one process: {m['ratio_2_actors_over_one_process']:.2f}x episodes/s")
    print(
        f"episodes identical to the one-process run: 1 actor {m['1 actor/identical_share']:.0%}, "
        f"2 actors {m['2 actors/identical_share']:.0%}"
        + ("" if serial else " (batched llama.cpp: a turn may round differently in another batch; --serial for 100%)")
    )
    return m


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--team", default="arithmetic")
    ap.add_argument("--conductor", default="round_robin")
    ap.add_argument("--episodes", type=int, default=16)
    ap.add_argument("--num-envs", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--serial", action="store_true", help="llama.cpp's serial path in every run")
    a = ap.parse_args()
    run(a.team, a.conductor, a.episodes, a.num_envs, a.seed, a.serial)


if __name__ == "__main__":
    main()
