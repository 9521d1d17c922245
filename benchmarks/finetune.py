"""Where one TeamTR stage on real LLM workers spends its time, next to this machine's matmul roofline.

    python benchmarks/finetune.py [--model smollm2] [--episodes 8] [--seed 0] [--threads 2] [--stage] [--compare]

In one run (docs/architecture.md §7: ratios against figures measured in the same run, absolute ones labelled with
the machine):

- **roofline**: dense fp32 matmul GFLOP/s at the model's shapes (tokens × hidden @ hidden × intermediate), the
  upper bound every phase below is compared with;
- **sampling**: one ``LLMTeam.sample`` of ``--episodes`` episodes — generated tok/s and the share of the roofline
  its FLOPs reach (2 · non-embedding parameters · tokens processed, prompts included, plus the output head at
  every generated token);
- **training**: one forward + backward of a worker's teacher-forced log-probs on that batch (the loss's cost) —
  tok/s and share of the roofline (FLOPs ≈ 2 forwards: the frozen base needs activation gradients, not weight
  gradients);
- **KL check**: one no-grad forward of the same turns (what each trust-region check costs);
- **stage** (``--stage``): one whole ``train`` stage of the CPU default trainer (``LLM_CPU_TRAINER``), wall time;
- ``--compare``: the same with every lever off (the stage as it was before them), and the speedup of each phase.

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

from orchestra.teamtr.config import LLM_CPU_TRAINER, seeded_generator  # noqa: E402
from orchestra.teamtr.llm import LLMTeam, LLMTeamConfig  # noqa: E402


def machine() -> str:
    """One line naming the machine the figures were measured on."""
    return f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}"


def matmul_roofline(m: int, k: int, n: int, seconds: float = 1.0) -> float:
    """Measured dense fp32 GFLOP/s of (m×k) @ (k×n), repeated for about ``seconds``."""
    a, b = torch.randn(m, k), torch.randn(k, n)
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
) -> dict[str, Any]:
    """The figures of one configuration: today's levers on, or (``baseline``) every lever off — the stage as it was
    before them (observation encoder on, no shared prefill, no shared training prompts, π_cur recomputed)."""
    if threads is not None:
        torch.set_num_threads(threads)
    torch.manual_seed(seed)
    cfg = LLMTeamConfig(model=model, workers=("solver",), group_size=4, max_tokens=64, num_envs=episodes,
                        max_batch_size=episodes, forward_batch_size=episodes, seed=seed,
                        share_prompts=not baseline, embedder="minilm" if baseline else None)  # fmt: skip
    t0 = time.perf_counter()
    team = LLMTeam(cfg)
    for backend in team.backends:
        backend.share_prefill = not baseline
    out: dict[str, Any] = {"perf/load_seconds": time.perf_counter() - t0, "perf/threads": torch.get_num_threads()}
    body, head = _sizes(team)
    hidden = int(team.model_of(0).config.hidden_size)
    inter = int(getattr(team.model_of(0).config, "intermediate_size", 4 * hidden))
    roof = matmul_roofline(512, hidden, inter)
    out["perf/roofline_gflops"] = roof

    t0 = time.perf_counter()
    batch = team.sample(episodes, seeded_generator(seed, 0))
    dt = time.perf_counter() - t0
    turns = batch.turns_of(0)
    generated = sum(len(t.token_ids) for t in turns)
    processed = sum(len(t.prompt_ids) + len(t.token_ids) for t in turns)
    out.update({
        "perf/sample_seconds": dt, "perf/sample_generated_tok_s": generated / dt,
        "perf/sample_roofline_share": flops(body, head, processed, generated, 1) / dt / 1e9 / roof,
        "perf/turns": len(turns), "perf/tokens_processed": processed,
    })  # fmt: skip

    t0 = time.perf_counter()
    logp = team.logprobs(0, batch)
    (-(logp * batch.mask[0]).sum()).backward()
    dt = time.perf_counter() - t0
    for p in team.parameters(0):
        p.grad = None
    out.update({"perf/train_seconds": dt, "perf/train_tok_s": processed / dt,
                "perf/train_roofline_share": flops(body, head, processed, generated, 2) / dt / 1e9 / roof})  # fmt: skip

    t0 = time.perf_counter()
    with torch.no_grad():
        team.logprobs(0, batch)
    dt = time.perf_counter() - t0
    share = flops(body, head, processed, generated, 1) / dt / 1e9 / roof
    out.update({"perf/kl_check_seconds": dt, "perf/kl_check_roofline_share": share})

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
    a = ap.parse_args(argv)
    res = run(a.model, a.episodes, a.seed, a.threads, a.stage)
    base = run(a.model, a.episodes, a.seed, a.threads, a.stage, baseline=True) if a.compare else {}
    print(f"machine: {machine()}")
    for k, v in res.items():
        line = f"{k:36s} {v:.3f}" if isinstance(v, float) else f"{k:36s} {v}"
        if k in base and k.endswith("_seconds") and k != "perf/load_seconds" and v > 0:
            line += f"   (levers off: {base[k]:.3f}; speedup {base[k] / v:.2f}×)"
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
