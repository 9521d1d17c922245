"""Recording throughput: the serial and the batched llama.cpp paths on the same ``orchestra record`` work, one run.

    python benchmarks/record.py [--team arithmetic] [--conductor round_robin] [--episodes 16] [--num-envs 8]
                                [--batch-size 8] [--prefix-cache 8] [--seed 0]

Both runs record the same tasks with the same seeds, response cache off, after a warm-up that loads the model and
the sentence encoder (so neither pays a start-up the other does not). It prints, for each path:

- episodes/s and completion tokens/s of the rollout engine (what ``orchestra record`` reports);
- prompt tokens: served, prefilled and reused from a cached or shared prefix, and prefill tokens/s;
- decode tokens/s of the per-step ``llama_decode`` calls;

then the speedup of the batched path in episodes/s (``speedup N.N×``), the greedy agreement with the serial path
(episodes and LLM turns whose token ids are identical), and two rooflines measured in the same run:

- **compute ceiling of this model here**: llama.cpp's forward of one 512-token batch (every weight matrix used for 512
  rows: compute-bound), in tokens/s; the batched decode's and the whole recording's processed tokens/s are given as
  fractions of it;
- **fp32 GEMM** of the machine (numpy, 1024²), in GFLOP/s, with the model's own FLOP rate as a fraction of it (the
  quantised Q4_1 kernels do not reach fp32 GEMM speed; this says how far).

Speed is never asserted in tests; this script is where it is measured. Importable: ``run(...)`` returns the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repo importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import yaml  # noqa: E402


def machine() -> str:
    from orchestra.backends.llamacpp_build import cpu_info

    cpu, _ = cpu_info()
    import llama_cpp

    return (
        f"{platform.system()} {platform.machine()} | {cpu} | {os.cpu_count()} cpus | python "
        f"{platform.python_version()} | llama-cpp-python {llama_cpp.__version__}"
    )


def _team_file(team: str, tmp: Path, batch_size: int, prefix_cache: int) -> str:
    """The team file with every llama.cpp backend set to this decoding plan."""
    from orchestra.runtime.team_file import resolve_team_path

    raw = yaml.safe_load(resolve_team_path(team).read_text(encoding="utf-8"))
    for spec in (raw.get("backends") or {}).values():
        if spec.get("type") == "llamacpp":
            spec.update(batch_size=batch_size, prefix_cache=prefix_cache)
    path = tmp / f"team-{batch_size}-{prefix_cache}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
    return str(path)


def _record(team_file: str, conductor: str, episodes: int, num_envs: int, seed: int, out: Path) -> dict[str, Any]:
    from orchestra.backends.llamacpp import _SHARED
    from orchestra.jobs.record import RecordConfig, record
    from orchestra.runtime.session import RunOptions
    from trajectories import read_trajectories

    before = {k: (m, {kk: vars(s.stats).copy() for kk, s in m._streams.items()}) for k, m in _SHARED.items()}
    run = RunOptions(seed=seed, num_envs=num_envs, use_cache=False, progress=False)
    res = record(RecordConfig(team_file, conductor, episodes, run=run), out)
    stats: dict[str, float] = {}
    for key, loaded in _SHARED.items():
        for skey, streams in loaded._streams.items():
            old = before.get(key, (None, {}))[1].get(skey, {})
            for name, value in vars(streams.stats).items():
                stats[name] = stats.get(name, 0) + value - old.get(name, 0)
    eps = read_trajectories(res.trajectories).episodes
    return {"metrics": res.metrics, "stats": stats, "episodes": {e.episode_id: e for e in eps}}


def compute_ceiling(threads: int) -> float:
    """tokens/s of llama.cpp's forward of one 512-token batch of the embedded model (best of 3)."""
    import llama_cpp

    from orchestra.backends.llamacpp import load_shared
    from orchestra.backends.models import smollm2_gguf_path

    model = load_shared(smollm2_gguf_path(), threads).llm.model
    cp = llama_cpp.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch = 1024, 512, 512
    cp.n_threads = cp.n_threads_batch = threads
    cp.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
    ctx = llama_cpp.llama_init_from_model(model, cp)
    batch = llama_cpp.llama_batch_init(512, 0, 1)
    try:
        batch.n_tokens = 512
        for i in range(512):
            batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = 100 + i, i, 1, i == 511
            batch.seq_id[i][0] = 0
        best = 0.0
        for _ in range(3):
            llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(ctx), True)
            t0 = time.perf_counter()
            if llama_cpp.llama_decode(ctx, batch) != 0:
                raise RuntimeError("llama_decode failed")
            best = max(best, 512 / (time.perf_counter() - t0))
        return best
    finally:
        llama_cpp.llama_batch_free(batch)
        llama_cpp.llama_free(ctx)


def gemm_gflops(n: int = 1024) -> float:
    a = np.random.default_rng(0).random((n, n), dtype=np.float32)
    b = np.random.default_rng(1).random((n, n), dtype=np.float32)
    a @ b
    best = 0.0
    for _ in range(5):
        t0 = time.perf_counter()
        a @ b
        best = max(best, 2 * n**3 / (time.perf_counter() - t0) / 1e9)
    return best


def _turn_ids(episode: Any) -> list[list[int]]:
    """The completion token ids of an episode's LLM turns."""
    return [list(s.message.token_ids) for s in episode.steps if s.message is not None and s.message.completion_tokens]


def agreement(a: dict[str, list[list[int]]], b: dict[str, list[list[int]]]) -> tuple[float, float, int]:
    """Share of episodes, and of LLM turns, whose token ids are identical in ``b`` and ``a`` (by episode id); turns."""
    same_ep = same_turn = turns = 0
    for eid, ids_a in a.items():
        ids_b = b.get(eid, [])
        same_ep += int(ids_a == ids_b)
        turns += len(ids_a)
        same_turn += sum(int(x == y) for x, y in zip(ids_a, ids_b, strict=False))
    return same_ep / max(len(a), 1), same_turn / max(turns, 1), turns


def run(
    team: str = "arithmetic",
    conductor: str = "round_robin",
    episodes: int = 16,
    num_envs: int = 8,
    batch_size: int = 8,
    prefix_cache: int = 8,
    seed: int = 0,
) -> dict[str, Any]:
    from envs.embeddings import get_embedder
    from orchestra.backends.llamacpp import physical_cores
    from orchestra.runtime.team_file import load_team

    threads = physical_cores()
    m: dict[str, Any] = {"machine": machine()}
    print(f"machine: {m['machine']}, llama.cpp threads {threads}")
    print(
        f"work: orchestra record --team {team} --conductor {conductor} --episodes {episodes} --num-envs {num_envs} "
        f"--seed {seed} --no-cache; batched path: batch_size {batch_size}, prefix_cache {prefix_cache}"
    )
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        serial_team = _team_file(team, tmp, 1, 0)
        batched_team = _team_file(team, tmp, batch_size, prefix_cache)
        get_embedder(load_team(team).env.embedder).embed(["warm-up"])  # the encoder loads outside the timings
        _record(serial_team, conductor, 1, num_envs, seed + 1, tmp / "warm-s.jsonl")
        _record(batched_team, conductor, 1, num_envs, seed + 1, tmp / "warm-b.jsonl")
        results = {}
        for name, team_file in (("serial", serial_team), ("batched", batched_team)):
            results[name] = _record(team_file, conductor, episodes, num_envs, seed, tmp / f"{name}.jsonl")
        shutil.rmtree(tmp, ignore_errors=True)
    ceiling = compute_ceiling(threads)
    gflops = gemm_gflops()
    flop_per_token = 2 * 134.5e6  # SmolLM2-135M: 2 FLOP per parameter per token
    print(
        f"\n{'path':8s} {'ep/s':>6s} {'compl tok/s':>11s} {'prompt tok':>10s} {'prefilled':>9s} {'reused':>7s} "
        f"{'prefill tok/s':>13s} {'decode tok/s':>12s}"
    )
    for name, r in results.items():
        mt, st = r["metrics"], r["stats"]
        prefill_rate = st["prefilled"] / st["prefill_seconds"] if st["prefill_seconds"] else float("nan")
        decode_rate = st["decoded"] / st["decode_seconds"] if st["decode_seconds"] else float("nan")
        m[f"{name}/episodes_per_s"] = mt["perf/episodes_per_s"]
        m[f"{name}/completion_tok_s"] = mt["perf/tokens_per_s"]
        m[f"{name}/prefill_tok_s"] = prefill_rate
        m[f"{name}/decode_tok_s"] = decode_rate
        m[f"{name}/processed_tok_s"] = (st["prefilled"] + st["decoded"]) / (
            st["prefill_seconds"] + st["decode_seconds"]
        )
        m[f"{name}/prompt_tokens"], m[f"{name}/prefilled"] = st["prompt_tokens"], st["prefilled"]
        print(
            f"{name:8s} {mt['perf/episodes_per_s']:6.2f} {mt['perf/tokens_per_s']:11.1f} {int(st['prompt_tokens']):10d} "
            f"{int(st['prefilled']):9d} {int(st['reused']):7d} {prefill_rate:13.1f} {decode_rate:12.1f}"
        )
    speedup = m["batched/episodes_per_s"] / m["serial/episodes_per_s"]
    ids = {name: {eid: _turn_ids(e) for eid, e in r["episodes"].items()} for name, r in results.items()}
    ep_agree, turn_agree, turns = agreement(ids["serial"], ids["batched"])
    for name in ("serial", "batched"):  # what each path generated, for comparing builds (benchmarks/llama_build.py)
        m[f"{name}/token_ids"] = dict(sorted(ids[name].items()))
    m.update(
        speedup=speedup,
        agreement_episodes=ep_agree,
        agreement_turns=turn_agree,
        ceiling_tok_s=ceiling,
        gemm_gflops=gflops,
    )
    print(f"\nspeedup {speedup:.1f}× in episodes/s (batched over serial, the same {episodes} episodes)")
    print(f"greedy agreement with the serial path: {ep_agree:.1%} of episodes, {turn_agree:.1%} of {turns} LLM turns")
    print(f"roofline 1, compute ceiling of this model here (llama.cpp, one 512-token forward): {ceiling:.1f} tok/s")
    for name in ("serial", "batched"):
        print(
            f"  {name:7s}: decode {m[f'{name}/decode_tok_s']:.1f} tok/s = {m[f'{name}/decode_tok_s'] / ceiling:.0%} of it; "
            f"prompt + decode {m[f'{name}/processed_tok_s']:.1f} tok/s = {m[f'{name}/processed_tok_s'] / ceiling:.0%}"
        )
    model_gflops = m["batched/decode_tok_s"] * flop_per_token / 1e9
    print(
        f"roofline 2, fp32 GEMM of this machine (numpy 1024²): {gflops:.1f} GFLOP/s; the batched decode runs "
        f"{model_gflops:.1f} GFLOP/s = {model_gflops / gflops:.0%} of it"
    )
    return m


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--team", default="arithmetic", help="built-in team name or team YAML")
    ap.add_argument("--conductor", default="round_robin", help="the conductor of both recordings")
    ap.add_argument("--episodes", type=int, default=16, help="episodes per recording")
    ap.add_argument("--num-envs", type=int, default=8, help="envs stepped at once (the batch the backend is handed)")
    ap.add_argument("--batch-size", type=int, default=8, help="batched path: sequences decoded at once")
    ap.add_argument("--prefix-cache", type=int, default=8, help="batched path: prompts whose KV is kept for reuse")
    ap.add_argument("--seed", type=int, default=0, help="run seed of both recordings")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures (and each path's token ids) here")
    a = ap.parse_args(argv)
    m = run(a.team, a.conductor, a.episodes, a.num_envs, a.batch_size, a.prefix_cache, a.seed)
    if a.json is not None:
        a.json.write_text(json.dumps(m, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
