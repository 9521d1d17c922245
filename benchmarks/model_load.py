"""How long ``TransformersBackend("smollm2")`` takes to load: straight from the GGUF, building the dequantised cache, and
from the cache.

    python benchmarks/model_load.py [--rounds 1] [--cache-dir DIR] [--seed 0]

Each load runs in a fresh child process, and its clock starts after ``import transformers, torch,
orchestra.backends.hf`` (imports are the same in all three and are not what the cache changes):

- (a) ``ORCHESTRA_MODEL_CACHE=off``: transformers dequantises the GGUF, as every load did before the cache;
- (b) first load with an empty cache folder: the same, plus writing the folder, then loading from it;
- (c) second load: from the folder (safetensors), plus the sha256 of the GGUF that names it; then the same load once
  more in that process, which shows what of (c) is transformers importing its llama modelling code on first use
  (``import transformers`` is lazy: the first load of any model pays it, from the GGUF or not).

It prints the three times (with ``--rounds N``, each round and the medians: on a shared machine one round moves by
tens of percent), (a)/(c) and (b)/(a), whether every load gave the same weights and model id (a digest of every
tensor's bytes) and the machine. The cache is built in ``--cache-dir`` (default: a temporary folder, removed
afterwards), which must not already hold this GGUF's folder. docs/performance.md, "Model load: the dequantised cache".
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestra.backends import model_cache  # noqa: E402
from orchestra.backends.llamacpp_build import cpu_info  # noqa: E402
from orchestra.backends.models import smollm2_gguf_path  # noqa: E402

CHILD = """
import hashlib, json, sys, time
import transformers, torch, orchestra.backends.hf
t0 = time.perf_counter()
backend = orchestra.backends.hf.TransformersBackend("smollm2", seed={seed})
seconds = time.perf_counter() - t0
again = None
if {again}:  # the same load once more in this process: transformers' lazy imports (llama modelling code) done
    t0 = time.perf_counter()
    orchestra.backends.hf.TransformersBackend("smollm2", seed={seed})
    again = time.perf_counter() - t0
digest = hashlib.sha256()
for name, tensor in sorted(backend.model.state_dict().items()):
    digest.update(name.encode() + tensor.contiguous().view(torch.uint8).numpy().tobytes())
print(json.dumps({{"seconds": seconds, "again": again, "model_id": backend.model_id, "weights": digest.hexdigest()[:16],
                  "threads": torch.get_num_threads(), "transformers": transformers.__version__}}))
"""


def load(cache: str, seed: int, again: bool = False) -> dict[str, Any]:
    """One ``TransformersBackend("smollm2")`` in a fresh child with ``ORCHESTRA_MODEL_CACHE=cache``: its figures."""
    env = {
        **os.environ,
        model_cache.ENV: cache,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.run(
        [sys.executable, "-c", CHILD.format(seed=seed, again=again)], env=env, capture_output=True, text=True, cwd=ROOT
    )
    if proc.returncode != 0:
        raise SystemExit(
            f"error: the load with {model_cache.ENV}={cache} ended with {proc.returncode}: {proc.stderr[-800:]}"
        )
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def one_round(cache_dir: Path, key: str, seed: int) -> dict[str, dict[str, Any]]:
    """(a), (b), (c) once, (b) building the cache in ``cache_dir`` (which must not hold it yet)."""
    if (cache_dir / key).exists():
        raise SystemExit(f"error: {cache_dir / key} exists already; pass an empty --cache-dir, so (b) builds the cache")
    a = load("off", seed)
    b = load(str(cache_dir), seed)
    if not (cache_dir / key).is_dir():
        raise SystemExit(f"error: (b) left no cache folder {cache_dir / key}")
    c = load(str(cache_dir), seed, again=True)
    return {"a": a, "b": b, "c": c}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cache-dir", type=Path, help="where (b) builds the cache (default: a temporary folder)")
    p.add_argument("--rounds", type=int, default=1, help="(a), (b), (c) this many times; medians (default: 1)")
    p.add_argument("--seed", type=int, default=0, help="the backend's seed (the load does not depend on it)")
    args = p.parse_args(argv)
    gguf = smollm2_gguf_path()
    t0 = time.perf_counter()
    key = model_cache.cache_key(gguf)
    sha_s = time.perf_counter() - t0
    rounds: list[dict[str, dict[str, Any]]] = []
    with tempfile.TemporaryDirectory(prefix="orchestra-model-cache-") as tmp:
        base = args.cache_dir.expanduser() if args.cache_dir else Path(tmp)
        for i in range(args.rounds):
            rounds.append(one_round(base if args.rounds == 1 else base / f"round-{i}", key, args.seed))
            if args.rounds > 1:
                print(f"round {i + 1}: " + ", ".join(f"({k}) {v['seconds']:.2f} s" for k, v in rounds[-1].items()))
    a, b, c = (statistics.median(r[k]["seconds"] for r in rounds) for k in "abc")
    again = statistics.median(r["c"]["again"] for r in rounds)
    last = rounds[-1]["c"]
    print(
        f"machine: {platform.system()} {platform.machine()} | {cpu_info()[0]} | {os.cpu_count()} cpus | "
        f"torch {last['threads']} threads | transformers {last['transformers']} | Python {platform.python_version()}"
    )
    what = "median of " + str(args.rounds) + " rounds" if args.rounds > 1 else "one round"
    print(f"model: {gguf.name} ({gguf.stat().st_size / 2**20:.0f} MiB), cache folder {key}; {what}")
    print(f"(a) from the GGUF ({model_cache.ENV}=off)  {a:6.2f} s")
    print(f"(b) first load, builds the cache        {b:6.2f} s")
    print(f"(c) second load, from the cache          {c:6.2f} s  (of which ~{sha_s:.2f} s: sha256 of the GGUF)")
    print(f"    the same load again in (c)'s process  {again:6.2f} s  (transformers' lazy imports of the model done)")
    print(f"(a)/(c) = {a / c:.1f}x faster | (b)/(a) = {b / a:.2f}x, once")
    ids = {(r[k]["weights"], r[k]["model_id"]) for r in rounds for k in "abc"}
    same = len(ids) == 1
    print(f"same weights and model id in every load: {'yes' if same else 'NO'} {sorted(ids)}")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
