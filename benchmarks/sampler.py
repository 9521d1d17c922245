"""orchestra's sampler against plain ``model.generate``: same model, prompts, batch, dtype and device, in one run.

    python benchmarks/sampler.py [--batch 16 64] [--new-tokens 128] [--device cpu] [--dtype float32] [--seed 0]

For each batch size, after one warm-up of each:

- **orchestra** (``TransformersBackend.generate_ids``, the phase-2 sampler): temperature 1, top_p 1, a per-row seed,
  stops off (no EOS, no stop strings), exactly ``--new-tokens`` tokens per row; it returns every row's ids and
  behaviour log-probs;
- **generate** (``model.generate``): ``do_sample=True, temperature=1, top_k=0, top_p=1``, ``min_new_tokens =
  max_new_tokens = --new-tokens`` (EOS suppressed), so both produce the same number of tokens to count;
- the **ratio** orchestra ÷ generate (≥ 1: orchestra is at least as fast);
- **orchestra with stops on**: the team's stop string and EOS on (rows end early; tokens counted are the ones made).

Prompts are distinct chat prompts (no shared prefill for either side), left-padded by both. Figures are tok/s of new
tokens, prefill included, labelled with the machine. ``--out FILE.json`` writes them (the GPU check reads it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repo importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from orchestra.backends.base import ChatMessage, GenerationParams  # noqa: E402
from orchestra.backends.hf import TransformersBackend  # noqa: E402

QUESTIONS = [
    f"What is {a} + {b} * {c}? Answer with the number only."
    for a, b, c in zip(range(3, 200, 3), range(7, 400, 7), range(2, 140, 2), strict=False)
]


def machine(device: str) -> str:
    """One line naming the machine: the CPU model and cores, or the GPU."""
    if device.startswith("cuda") and torch.cuda.is_available():
        return f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}"
    from orchestra.backends.llamacpp_build import cpu_info

    cpu, _ = cpu_info()
    return f"{cpu}, {len(os.sched_getaffinity(0))} cores, torch {torch.__version__}"


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def time_orchestra(
    backend: TransformersBackend, prompts: list[list[int]], params: list[GenerationParams], device: str
) -> tuple[float, int]:
    _sync(device)
    t0 = time.perf_counter()
    rows = backend.generate_ids(prompts, params)
    _sync(device)
    return time.perf_counter() - t0, sum(len(r.token_ids) for r in rows)


def time_generate(
    backend: TransformersBackend, prompts: list[list[int]], new_tokens: int, seed: int, device: str
) -> tuple[float, int]:
    from transformers import GenerationConfig

    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), backend.pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    cfg = GenerationConfig(
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        pad_token_id=backend.pad_id,
        eos_token_id=sorted(backend.eos_ids),
    )
    torch.manual_seed(seed)
    _sync(device)
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = backend.model.generate(input_ids=ids.to(device), attention_mask=mask.to(device), generation_config=cfg)
    _sync(device)
    made = int(out.shape[1] - width) * len(prompts)
    return time.perf_counter() - t0, made


def run(
    model: str = "smollm2",
    batches: tuple[int, ...] = (16, 64),
    new_tokens: int = 128,
    device: str = "cpu",
    dtype: str = "float32",
    seed: int = 0,
    repeats: int = 1,
    stop: str = "\n\n",
) -> dict[str, Any]:
    backend = TransformersBackend(model, dtype=dtype, device=device, max_batch_size=max(batches), seed=seed)
    backend.share_prefill = False
    report: dict[str, Any] = {
        "machine": machine(device),
        "device": device,
        "dtype": dtype,
        "new_tokens": new_tokens,
        "batches": {},
    }
    eos = backend.eos_ids
    for batch in batches:
        prompts = [backend.prompt_ids((ChatMessage("user", QUESTIONS[i % len(QUESTIONS)]),)) for i in range(batch)]
        free = [GenerationParams(max_tokens=new_tokens, temperature=1.0, seed=seed * 1000 + i) for i in range(batch)]
        stopping = [
            GenerationParams(max_tokens=new_tokens, temperature=1.0, seed=seed * 1000 + i, stop=(stop,))
            for i in range(batch)
        ]
        warm = [GenerationParams(max_tokens=4, temperature=1.0, seed=i) for i in range(batch)]
        backend.generate_ids(prompts, warm)
        time_generate(backend, prompts, 4, seed, device)
        ours, theirs, stops = [], [], []
        for _ in range(repeats):
            backend.eos_ids = frozenset()  # stops off: every row makes exactly new_tokens tokens
            try:
                ours.append(time_orchestra(backend, prompts, free, device))
            finally:
                backend.eos_ids = eos
            theirs.append(time_generate(backend, prompts, new_tokens, seed, device))
            stops.append(time_orchestra(backend, prompts, stopping, device))
        (t_o, n_o), (t_g, n_g), (t_s, n_s) = (min(x) for x in (ours, theirs, stops))
        assert n_o == n_g == batch * new_tokens, (n_o, n_g)
        fig = {
            "orchestra_tok_s": n_o / t_o,
            "generate_tok_s": n_g / t_g,
            "ratio": (n_o / t_o) / (n_g / t_g),
            "orchestra_stops_tok_s": n_s / t_s,
            "orchestra_stops_tokens": n_s,
            "seconds": {"orchestra": t_o, "generate": t_g, "orchestra_stops": t_s},
        }
        report["batches"][str(batch)] = fig
        print(
            f"batch {batch:3d} × {new_tokens} new tokens: orchestra {fig['orchestra_tok_s']:8.1f} tok/s | "
            f"model.generate {fig['generate_tok_s']:8.1f} tok/s | ratio {fig['ratio']:.2f} | "
            f"orchestra, stops on ({stop!r}, EOS): {fig['orchestra_stops_tok_s']:8.1f} tok/s ({n_s} tokens)",
            flush=True,
        )
    return report


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", default="smollm2", help="model spec (alias, .gguf, HF folder)")
    ap.add_argument("--batch", type=int, nargs="+", default=[16, 64], help="batch sizes (rows decoded at once)")
    ap.add_argument("--new-tokens", type=int, default=128, help="new tokens per row (stops off)")
    ap.add_argument("--device", default="cpu", help="torch device")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--repeats", type=int, default=1, help="timed runs per side (the fastest is kept)")
    ap.add_argument("--seed", type=int, default=0, help="sampling seeds of both sides")
    ap.add_argument("--out", type=Path, default=None, help="write the figures as JSON")
    args = ap.parse_args()
    print(f"machine: {machine(args.device)} | {args.device} {args.dtype}", flush=True)
    report = run(args.model, tuple(args.batch), args.new_tokens, args.device, args.dtype, args.seed, args.repeats)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
