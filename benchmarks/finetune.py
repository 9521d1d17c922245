"""Where one TeamTR stage on real LLM workers spends its time, next to this machine's matmul roofline.

    python benchmarks/finetune.py [--model smollm2] [--episodes 8] [--seed 0] [--threads 2] [--stage] [--compare]

In one run (docs/architecture.md §7: ratios against figures measured in the same run, absolute ones labelled with
the machine):

- **roofline**: dense matmul GFLOP/s at the model's shapes (512 tokens × hidden @ hidden × intermediate), the
  upper bound of every phase that runs many tokens per forward (prefill, training, KL check);
- **decode roofline**: one token-by-token step can be no faster than the model's own weight matmuls at that step's
  rows (every projection of every layer and the output head, ``F.linear`` on the real weights, nothing else):
  measured here at each row count the sampler used. At a few rows a step streams all weights from memory and is
  bandwidth-bound, so this, not the GEMM figure, is what decoding can reach;
- **sampling**: one ``LLMTeam.sample`` of ``--episodes`` episodes — generated tok/s; the share of the GEMM roofline
  its FLOPs reach (2 · non-embedding parameters · tokens processed, prompts included, plus the output head at
  every generated token); and the share of its ideal time (prefilled tokens at the GEMM roofline + every decode
  step at the decode roofline of its rows);
- **training**: one forward + backward of a worker's teacher-forced log-probs on that batch (the loss's cost) —
  tok/s and share of the roofline (FLOPs ≈ 2 forwards: the frozen base needs activation gradients, not weight
  gradients);
- **KL check**: one no-grad forward of the same turns (what each trust-region check costs);
- **stage** (``--stage``): one whole ``train`` stage of the CPU default trainer (``LLM_CPU_TRAINER``), wall time;
- ``--compare``: the same with every lever off (the stage as it was before them), and the speedup of each phase;
- **bound**: one stage at 100% of the rooflines (ideal sampling + one training pass + one KL check), a lower bound
  on any stage of this work on this machine, and the largest speedup over the levers-off stage it would allow.

Importable: ``run(...)`` returns the figures as a flat dict of ``perf/...`` keys. Speed is never asserted in tests.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repo importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from orchestra.teamtr.config import LLM_CPU_TRAINER, seeded_generator  # noqa: E402
from orchestra.teamtr.llm import LLMTeam  # noqa: E402
from orchestra.teamtr.llm_config import LLMTeamConfig  # noqa: E402


def machine() -> str:
    """One line naming the machine the figures were measured on."""
    return f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}"


def matmul_roofline(m: int, k: int, n: int, seconds: float = 1.0, dtype: torch.dtype = torch.float32) -> float:
    """Measured dense GFLOP/s of (m×k) @ (k×n) in ``dtype``, repeated for about ``seconds``."""
    a, b = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
    for _ in range(3):
        a @ b  # warm-up
    reps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        a @ b
        reps += 1
    return 2.0 * m * k * n * reps / (time.perf_counter() - t0) / 1e9


def _sizes(team: LLMTeam) -> tuple[int, int]:
    """(body, head): parameters every token passes through (the base without its embedding table; the adapters are
    negligible) and those of the output projection (vocab × hidden), which only scored positions pay for."""
    emb = team.model_of(0).get_input_embeddings().weight
    body = sum(p.numel() for k, p in team.base_parameters().items() if "embed_tokens" not in k and "lm_head" not in k)
    return body, int(emb.numel())


def decode_roofline(team: LLMTeam, rows: int, reps: int = 3) -> float:
    """Seconds of one decode step's weight matmuls alone at ``rows`` rows: ``F.linear`` over every 2-D weight of the
    base (the projections of every layer; the output head once, tied to the embedding or not), best of ``reps``."""
    params = team.base_parameters()
    weights = [w for k, w in params.items() if w.dim() == 2 and "embed_tokens" not in k]
    if not any("lm_head" in k for k in params):  # tied head: the embedding table is the output projection
        weights.append(team.model_of(0).get_input_embeddings().weight.detach())
    xs = {n: torch.randn(rows, n, dtype=weights[0].dtype) for n in {int(w.shape[1]) for w in weights}}
    best = float("inf")
    with torch.no_grad():
        for _ in range(reps + 1):  # the first pass warms up
            t0 = time.perf_counter()
            for w in weights:
                F.linear(xs[int(w.shape[1])], w)
            best = min(best, time.perf_counter() - t0)
    return best


def flops(body: int, head: int, processed: int, scored: int, passes: float) -> float:
    """Matmul FLOPs of ``passes`` × (a forward over ``processed`` tokens, the head at ``scored`` positions)."""
    return passes * 2.0 * (body * processed + head * scored)


def run(
    model: str = "smollm2",
    episodes: int = 8,
    seed: int = 0,
    threads: int | None = None,
    stage: bool = False,
    baseline: bool = False,
    dtype: str = "float32",
) -> dict[str, Any]:
    """The figures of one configuration: today's levers on, or (``baseline``) every lever off — the stage as it was
    before them (observation encoder on, no shared prefill, no shared training prompts, π_cur recomputed)."""
    if threads is not None:
        torch.set_num_threads(threads)
    torch.manual_seed(seed)
    cfg = LLMTeamConfig(
        model=model,
        workers=("solver",),
        group_size=4,
        max_tokens=64,
        num_envs=episodes,
        max_batch_size=episodes,
        forward_batch_size=episodes,
        seed=seed,
        dtype=dtype,
        share_prompts=not baseline,
        embedder="minilm" if baseline else None,
    )
    t0 = time.perf_counter()
    team = LLMTeam(cfg)
    for backend in team.backends:
        backend.share_prefill = not baseline
    out: dict[str, Any] = {"perf/load_seconds": time.perf_counter() - t0, "perf/threads": torch.get_num_threads()}
    body, head = _sizes(team)
    hidden = int(team.model_of(0).config.hidden_size)
    inter = int(getattr(team.model_of(0).config, "intermediate_size", 4 * hidden))
    roof = matmul_roofline(512, hidden, inter, dtype=team.model_of(0).get_input_embeddings().weight.dtype)
    out["perf/roofline_gflops"] = roof

    for backend in team.backends:
        backend.decode_steps.clear()
        backend.prefill_tokens = 0
    t0 = time.perf_counter()
    batch = team.sample(episodes, seeded_generator(seed, 0))
    dt = time.perf_counter() - t0
    steps: dict[int, int] = {}
    prefilled = 0
    for backend in team.backends:
        prefilled += backend.prefill_tokens
        for rows, k in backend.decode_steps.items():
            steps[rows] = steps.get(rows, 0) + k
    ideal_sample = flops(body, 0, prefilled, 0, 1) / roof / 1e9 + sum(
        k * decode_roofline(team, rows) for rows, k in steps.items()
    )
    turns = batch.turns_of(0)
    generated = sum(len(t.token_ids) for t in turns)
    processed = sum(len(t.prompt_ids) + len(t.token_ids) for t in turns)
    out.update(
        {
            "perf/sample_seconds": dt,
            "perf/sample_generated_tok_s": generated / dt,
            "perf/sample_roofline_share": flops(body, head, processed, generated, 1) / dt / 1e9 / roof,
            "perf/turns": len(turns),
            "perf/tokens_processed": processed,
            "perf/sample_prefilled_tokens": prefilled,
            "perf/sample_decode_steps": sum(steps.values()),
            "perf/sample_decode_row_steps": sum(r * k for r, k in steps.items()),
            "perf/sample_mean_rows_per_step": sum(r * k for r, k in steps.items()) / max(1, sum(steps.values())),
            "perf/decode_roofline_ms_1_row": 1e3 * decode_roofline(team, 1),
            f"perf/decode_roofline_ms_{episodes}_rows": 1e3 * decode_roofline(team, episodes),
            "perf/sample_ideal_seconds": ideal_sample,
            "perf/sample_ideal_share": ideal_sample / dt,
        }
    )

    t0 = time.perf_counter()
    logp = team.logprobs(0, batch)
    (-(logp * batch.mask[0]).sum()).backward()
    dt = time.perf_counter() - t0
    for p in team.parameters(0):
        p.grad = None
    ideal_train = flops(body, head, processed, generated, 2) / roof / 1e9
    out.update(
        {
            "perf/train_seconds": dt,
            "perf/train_tok_s": processed / dt,
            "perf/train_ideal_seconds": ideal_train,
            "perf/train_roofline_share": flops(body, head, processed, generated, 2) / dt / 1e9 / roof,
        }
    )

    t0 = time.perf_counter()
    with torch.no_grad():
        team.logprobs(0, batch)
    dt = time.perf_counter() - t0
    share = flops(body, head, processed, generated, 1) / dt / 1e9 / roof
    ideal_kl = flops(body, head, processed, generated, 1) / roof / 1e9
    out.update(
        {"perf/kl_check_seconds": dt, "perf/kl_check_roofline_share": share, "perf/kl_check_ideal_seconds": ideal_kl}
    )
    # no stage of this work can beat the rooflines: ideal sampling + one training pass + one KL check (at least one
    # of each per stage; the trainer may run more, so this bound is optimistic)
    out["perf/stage_bound_seconds"] = ideal_sample + ideal_train + ideal_kl

    if stage:
        from orchestra.teamtr.trainer import train

        t0 = time.perf_counter()
        trainer = dataclasses.replace(LLM_CPU_TRAINER, num_stages=1, batch_size=episodes, seed=seed)
        train(team, trainer if baseline else dataclasses.replace(trainer, old_logprobs="behaviour"))
        out["perf/stage_seconds"] = time.perf_counter() - t0
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2", help="base model (smollm2, a GGUF/HF path, or tiny)")
    ap.add_argument("--episodes", type=int, default=8, help="episodes sampled (a multiple of 4)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--stage", action="store_true", help="also time one whole training stage")
    ap.add_argument("--compare", action="store_true", help="also run with every lever off and print the speedups")
    ap.add_argument("--dtype", default="float32", help="model dtype of the measured run (float32 | bfloat16)")
    a = ap.parse_args(argv)
    res = run(a.model, a.episodes, a.seed, a.threads, a.stage, dtype=a.dtype)
    base = run(a.model, a.episodes, a.seed, a.threads, a.stage, baseline=True) if a.compare else {}
    print(f"machine: {machine()}")
    for k, v in res.items():
        line = f"{k:36s} {v:.3f}" if isinstance(v, float) else f"{k:36s} {v}"
        if k in base and k.endswith("_seconds") and v > 0 and not any(w in k for w in ("load", "ideal", "bound")):
            line += f"   (levers off: {base[k]:.3f}; speedup {base[k] / v:.2f}×)"
        print(line)
    if "perf/stage_seconds" in base:
        bound = res["perf/stage_bound_seconds"]
        print(
            f"levers-off stage {base['perf/stage_seconds']:.1f} s; this stage {res['perf/stage_seconds']:.1f} s "
            f"(speedup {base['perf/stage_seconds'] / res['perf/stage_seconds']:.2f}×); at 100% of the rooflines "
            f"≥ {bound:.1f} s, so at most {base['perf/stage_seconds'] / bound:.2f}× over levers-off"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
