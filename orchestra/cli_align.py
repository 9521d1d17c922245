"""CLI: ``orchestra align`` — Stage-0 alignment of a newcomer to a team's worker, with the swap-shock report
(phase 2; the method: :mod:`orchestra.teamtr.align`).

One subcommand per kind of team (``align_mode``), each a parser in :func:`add_parsers` and a runner in
:data:`MODES`, all reusing :func:`orchestra.teamtr.align.swap_shock`,
:func:`~orchestra.teamtr.align.check_tokenizer_family` and :func:`~orchestra.teamtr.align.write_report` with their
own probes and policies:

* ``chain`` — the telephone-chain testbed, exact team success (:mod:`orchestra.teamtr.align_chain`);
* ``llm`` — worker ``--worker`` of an LLM team (team file + fixed conductor, as ``orchestra finetune``), optionally
  with its fine-tuned adapter (``--incumbent-adapter RUN/adapters/WORKER``), replaced by ``--newcomer MODEL`` of the
  same tokenizer family with a fresh (or ``--newcomer-adapter``) LoRA adapter; team success = held-out greedy
  success on ``--eval-tasks`` test tasks (:mod:`orchestra.teamtr.align_llm`).

Every mode writes to ``--out``: ``config.json`` (resolved), ``metrics.jsonl`` / ``metrics.csv`` (one row per KL
check), ``report.json``, ``report.md``, ``kl_curve.png`` and the newcomer's aligned weights (chain:
``newcomer.safetensors``; llm: the peft folder ``adapters/WORKER/``, plus the merged model ``newcomer_model/`` when
all its weights were trained).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

Handler = Callable[[argparse.Namespace], int]
FORMAT = "orchestra.teamtr.align/1"


def _shared(p: argparse.ArgumentParser, out_default: str) -> None:
    """Flags of every align mode: the alignment loop's knobs (AlignConfig), output, seed, progress."""
    g = p.add_argument_group("alignment (Stage 0)")
    g.add_argument("--delta0", type=float, default=0.01, help="stop once held-out per-token KL(new‖inc) ≤ this")
    g.add_argument("--lr", type=float, default=1e-2, help="Adam learning rate of the newcomer")
    g.add_argument("--max-steps", type=int, default=1000, help="Adam steps at most")
    g.add_argument("--batch-size", type=int, default=256, help="probe contexts per Adam step")
    g.add_argument("--probes", type=int, default=1024, help="rollouts harvested for training probes")
    g.add_argument("--heldout-probes", type=int, default=1024, help="independent rollouts for the held-out test")
    g.add_argument("--check-every", type=int, default=10, help="Adam steps between KL checks (metrics rows)")
    p.add_argument("--out", default=out_default, help="run directory (must not hold a finished align run)")
    p.add_argument("--no-plot", action="store_true", help="do not draw kl_curve.png")
    p.add_argument("--seed", type=int, default=0, help="root seed (team, training, probes, newcomer; exact on CPU)")
    p.add_argument("--quiet", action="store_true", help="no progress output")


def add_parsers(sub: Any, common: Callable[[argparse.ArgumentParser], None], epilog: str) -> dict[str, Handler]:
    """Add ``orchestra align``; returns its handler by command name. (``common`` — the recording flags — does not
    apply here: no env, no cache.)"""
    p = sub.add_parser(
        "align",
        help="Stage-0 alignment: swap a worker's model for a newcomer aligned by reverse KL; report the swap shock",
        description="Replace one worker of a team by a newcomer model. The newcomer is first trained to minimise "
        "the per-token reverse KL(newcomer ‖ incumbent) on contexts harvested from the current team's rollouts at "
        "that worker's turns, until it is ≤ δ_0 on held-out contexts. Reports team success before the swap, after a "
        "direct (unaligned) swap and after the aligned swap.",
        epilog=epilog,
    )
    asub = p.add_subparsers(dest="align_mode", required=True, metavar="MODE")
    q = asub.add_parser(
        "chain",
        help="the telephone-chain testbed: warm-started (optionally TeamTR-trained) chain, exact team success",
        description="Build a warm-started telephone chain (optionally fine-tuned --train-stages TeamTR stages, so the "
        "incumbent is a trained agent), swap agent --agent for a differently initialised newcomer, align it, and "
        "report exact J before / direct / aligned.",
        epilog=epilog,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    t = q.add_argument_group("team")
    t.add_argument("--n", type=int, default=4, help="chain length (agents)")
    t.add_argument("--vocab-size", type=int, default=8, help="V message symbols")
    t.add_argument("--agent", type=int, default=1, help="the swapped worker, 0-based")
    t.add_argument("--train-stages", type=int, default=3, help="TeamTR stages before the swap (0 = warm start only)")
    w = q.add_argument_group("newcomer")
    w.add_argument(
        "--newcomer",
        choices=["random", "warm"],
        default="random",
        help="random: its own random-init base + fresh LoRA; warm: that, warm-started to the noisy pass-through",
    )
    w.add_argument("--newcomer-seed", type=int, default=None, help="its init seed (None: derived, ≠ the team's)")
    w.add_argument(
        "--train-params", choices=["adapter", "all"], default="adapter", help="train its LoRA only, or all weights"
    )
    w.add_argument("--newcomer-hidden-size", type=int, default=None, help="its base width (None: the team's)")
    w.add_argument("--newcomer-layers", type=int, default=None, help="its base depth (None: the team's)")
    _shared(q, "runs/align_chain")
    _add_llm_parser(asub, epilog)
    return {"align": _cmd_align}


LLM_DESCRIPTION = """\
Swap worker --worker of an LLM team (team file + FIXED conductor, as in `orchestra finetune`) for a newcomer model
of the same tokenizer family. The incumbent is the team's base (--model) with its adapter from a finetune run
(--incumbent-adapter RUN/adapters/WORKER) or a fresh one (= the base). Probe contexts are the worker's turns in the
CURRENT team's sampled rollouts (exact prompt ids + the incumbent's sampled ids; --probes / --heldout-probes
episodes from independent streams). The newcomer (--newcomer: smollm2, a .gguf, a local HF folder or tiny; a fresh
LoRA adapter or --newcomer-adapter) minimises the per-token reverse KL(newcomer || incumbent) over the full
vocabulary at the incumbent's sampled positions until the held-out KL <= --delta0 (or --max-steps). Team success
(held-out greedy success on --eval-tasks test tasks) is reported before the swap, after a direct swap and after the
aligned swap.

Writes OUT/config.json, OUT/report.json|md, OUT/metrics.csv|jsonl, OUT/kl_curve.png and the aligned newcomer's
adapter OUT/adapters/WORKER/ (peft folder; with --train-params all also the merged model OUT/newcomer_model/).
--seed is also the team's seed (tiny base, LoRA init, held-out tasks): an incumbent adapter fine-tuned on the tiny
model needs its finetune run's --seed (checked when RUN/config.json is next to RUN/adapters/).

CPU example (SmolLM2 base -> the incumbent fine-tuned by a finetune run):
  orchestra align llm --team arithmetic --embedder hash --worker solver --conductor pipeline \\
      --incumbent-adapter runs/finetune-cpu/adapters/solver --newcomer smollm2 --eval-tasks 4 \\
      --probes 8 --heldout-probes 4 --max-tokens 24 --out runs/align-llm
"""


def _add_llm_parser(asub: Any, epilog: str) -> None:
    """``orchestra align llm`` (:mod:`orchestra.teamtr.align_llm`)."""
    q = asub.add_parser(
        "llm",
        help="an LLM team: swap worker --worker for a newcomer model aligned on the team's probe contexts",
        description=LLM_DESCRIPTION,
        epilog=epilog,
        formatter_class=_RawDefaults,
    )
    t = q.add_argument_group("team (the incumbent's)")
    t.add_argument("--team", default="arithmetic", help="built-in team name or team YAML")
    t.add_argument("--family", default=None, help="task family; None = the team's")
    t.add_argument("--difficulty", type=int, default=None, help="one difficulty level; None = mixed")
    t.add_argument("--conductor", default="pipeline", help="the FIXED conductor: a rule-based name or LABEL:CHECKPOINT")
    t.add_argument(
        "--pipeline", nargs="+", default=None, metavar="WORKER:INSTRUCTION", help="override the team's pipeline steps"
    )
    t.add_argument(
        "--embedder", default=None, choices=["minilm", "hash", "none"], help="override the team's; None = keep"
    )
    t.add_argument("--worker", default="solver", help="the swapped LLM worker")
    t.add_argument(
        "--frozen-workers",
        choices=["base", "team"],
        default="base",
        help="the other LLM workers: the incumbent's base with adapters off, or the team file's backends",
    )
    t.add_argument("--eval-tasks", type=int, default=8, help="held-out test tasks scoring team success (≥ 1)")
    i = q.add_argument_group("incumbent")
    i.add_argument("--model", default="smollm2", help="the team's base model: smollm2, a .gguf, an HF folder or tiny")
    i.add_argument(
        "--incumbent-adapter",
        default=None,
        metavar="DIR",
        help="peft folder of the worker's adapter (e.g. RUN/adapters/solver of orchestra finetune); None = fresh",
    )
    w = q.add_argument_group("newcomer")
    w.add_argument(
        "--newcomer",
        required=True,
        default=argparse.SUPPRESS,
        help="its base: smollm2, a .gguf, a local HF folder or tiny",
    )
    w.add_argument("--newcomer-seed", type=int, default=None, help="tiny-base and LoRA init seed; None = derived")
    w.add_argument(
        "--newcomer-adapter", default=None, metavar="DIR", help="peft folder to start its adapter from; None = fresh"
    )
    w.add_argument(
        "--train-params", choices=["adapter", "all"], default="adapter", help="train its LoRA only, or all weights"
    )
    w.add_argument("--newcomer-hidden-size", type=int, default=None, help="tiny newcomer's width; None = the team's")
    w.add_argument("--newcomer-layers", type=int, default=None, help="tiny newcomer's depth; None = the team's")
    m = q.add_argument_group("models and sampling")
    m.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"], help="model dtype")
    m.add_argument("--device", default="cpu", help="torch device, e.g. cuda")
    m.add_argument("--lora-r", type=int, default=8, help="LoRA rank of fresh adapters (a given folder sets its own)")
    m.add_argument("--lora-alpha", type=int, default=16, help="LoRA alpha of fresh adapters")
    m.add_argument("--temperature", type=float, default=1.0, help="sampling temperature of the probes, > 0")
    m.add_argument("--max-tokens", type=int, default=48, help="tokens per turn of the worker")
    m.add_argument("--num-envs", type=int, default=16, help="envs stepped at once by the rollout engine")
    m.add_argument("--max-batch-size", type=int, default=16, help="rows per decoding forward")
    m.add_argument("--forward-batch-size", type=int, default=16, help="probe turns per teacher-forced forward")
    m.add_argument(
        "--cache-limit-mb",
        type=float,
        default=2048.0,
        help="cache the incumbent's (N, T, V) float32 logits if both probe sets fit, else recompute them",
    )
    _shared(q, "runs/align_llm")
    # LLM-sized defaults of the shared flags (probes are episodes; a step is a few teacher-forced forwards)
    q.set_defaults(lr=1e-3, max_steps=200, batch_size=8, probes=16, heldout_probes=8, check_every=10)


class _RawDefaults(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Keep the description's layout and show every default."""


def _progress(quiet: bool) -> Callable[[str], None]:
    def say(msg: str) -> None:
        if not quiet:
            print(msg, file=sys.stderr, flush=True)

    return say


def _align_config(a: argparse.Namespace) -> Any:
    from orchestra.teamtr.align import AlignConfig

    return AlignConfig(
        delta_0=a.delta0,
        lr=a.lr,
        max_steps=a.max_steps,
        batch_size=a.batch_size,
        num_train_probes=a.probes,
        num_heldout_probes=a.heldout_probes,
        check_every=a.check_every,
        seed=a.seed,
    )


def _fresh_out(out: Path) -> None:
    for name in ("report.json", "config.json"):
        if (out / name).exists():
            raise FileExistsError(f"{out / name} exists: {out} holds an align run already; use another --out")


def _run_chain(a: argparse.Namespace) -> int:
    import torch
    from safetensors.torch import save_file

    from orchestra.teamtr.align import AlignError, report_markdown, write_report
    from orchestra.teamtr.align_chain import ChainSwapConfig, build_chain_newcomer, chain_swap_shock, newcomer_config
    from orchestra.teamtr.bench import derived_seed
    from orchestra.teamtr.chain import ChainConfig, ChainTeam, team_success, warm_start
    from orchestra.teamtr.config import TeamTRConfig
    from orchestra.teamtr.team import ChainTrainable
    from orchestra.teamtr.trainer import train

    say = _progress(a.quiet)
    out = Path(a.out)
    try:  # every input error surfaces here, before anything is built or trained
        if a.train_stages < 0:
            raise ValueError(f"--train-stages must be ≥ 0, got {a.train_stages}")
        align_cfg = _align_config(a)
        team_cfg = ChainConfig(
            n_agents=a.n,
            vocab_size=a.vocab_size,
            lora_r=max(8, a.vocab_size - 1),  # r ≥ V − 1: lm_head's LoRA can express any V×V policy
            lora_targets=("lm_head",),
            seed=derived_seed(a.seed, 0),
        )
        sizes = {"hidden_size": a.newcomer_hidden_size, "num_layers": a.newcomer_layers}
        sizes = {k: v for k, v in sizes.items() if v is not None}
        swap = ChainSwapConfig(
            agent=a.agent,
            newcomer=a.newcomer,
            newcomer_seed=a.newcomer_seed,
            train_params=a.train_params,
            newcomer_model=dataclasses.replace(team_cfg.model, **sizes) if sizes else None,
        )
        new_cfg = newcomer_config(team_cfg, swap)
        trainer_cfg = TeamTRConfig(
            scheme="teamtr",
            order="fixed",
            num_stages=a.train_stages,
            batch_size=128,
            num_epochs=2,
            lr=3e-2,
            delta=0.03,
            seed=derived_seed(a.seed, 1),
        )  # the benchmark's settings (orchestra.teamtr.bench.BenchConfig)
    except ValueError as e:  # AlignError included
        print(f"error: {e}", file=sys.stderr)
        return 2
    _fresh_out(out)
    out.mkdir(parents=True, exist_ok=True)
    config = {
        "format": FORMAT,
        "mode": "chain",
        "align": dataclasses.asdict(align_cfg),
        "swap": dataclasses.asdict(swap),
        "team": dataclasses.asdict(team_cfg),
        "newcomer": dataclasses.asdict(new_cfg),
        "trainer": dataclasses.asdict(trainer_cfg) if a.train_stages > 0 else None,
    }
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")

    torch.set_num_threads(1)  # tiny models are dispatch-bound
    t0 = time.perf_counter()
    team = ChainTeam(team_cfg)
    warm_start(team)
    say(f"align chain: n={a.n} V={a.vocab_size}, warm-started team J = {team_success(team):.3f}")
    if a.train_stages > 0:
        log = train(ChainTrainable(team), trainer_cfg, out_dir=out / "incumbent_team")
        curve = " → ".join(f"{s['perf/team_success']:.3f}" for s in log.stages)
        say(f"align chain: {a.train_stages} TeamTR stages, J {curve} (run: {out / 'incumbent_team'})")
    newcomer = build_chain_newcomer(team_cfg, swap)

    def on_check(row: dict[str, float]) -> None:
        say(
            f"align step {int(row['align/step']):5d}: KL(new‖inc) train {row['kl/train']:.4f} "
            f"held-out {row['kl/heldout']:.4f} (δ_0 {align_cfg.delta_0:g})"
        )

    try:
        report = chain_swap_shock(team, swap, align_cfg, newcomer=newcomer, on_check=on_check)
    except AlignError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    meta = {**report.meta, "total_seconds": time.perf_counter() - t0}
    report = dataclasses.replace(report, meta=meta)
    paths = write_report(report, out, plot=not a.no_plot)
    params = (
        newcomer.adapter_parameters(0)
        if swap.train_params == "adapter"
        else dict(newcomer.models[0].named_parameters())
    )
    save_file({k: p.detach().contiguous() for k, p in params.items()}, str(out / "newcomer.safetensors"))
    print(report_markdown(report))
    print("written: " + "  ".join(str(p) for p in [out / "config.json", *paths.values(), out / "newcomer.safetensors"]))
    return 0


def _llm_configs(a: argparse.Namespace) -> tuple[Any, Any, Any]:
    """(AlignConfig, LLMTeamConfig of the incumbent's team, LLMSwapConfig) from the flags (ValueError if bad)."""
    from orchestra.teamtr.align_llm import LLMSwapConfig
    from orchestra.teamtr.llm import LLMTeamConfig, TinyModelConfig

    if a.eval_tasks < 1:
        raise ValueError(f"--eval-tasks must be ≥ 1 (team success is measured on held-out tasks), got {a.eval_tasks}")
    align_cfg = dataclasses.replace(_align_config(a), eval_batch_size=a.batch_size)
    team_cfg = LLMTeamConfig(
        team=a.team,
        family=a.family,
        difficulty=a.difficulty,
        conductor=a.conductor,
        pipeline=tuple(a.pipeline or ()),
        embedder=a.embedder,
        workers=(a.worker,),
        frozen_workers=a.frozen_workers,
        model=a.model,
        dtype=a.dtype,
        device=a.device,
        lora_r=a.lora_r,
        lora_alpha=a.lora_alpha,
        temperature=a.temperature,
        max_tokens=a.max_tokens,
        group_size=1,  # probe episodes: one per task
        num_envs=a.num_envs,
        max_batch_size=a.max_batch_size,
        forward_batch_size=a.forward_batch_size,
        eval_tasks=a.eval_tasks,
        seed=a.seed,
    )
    sizes = {"hidden_size": a.newcomer_hidden_size, "num_layers": a.newcomer_layers}
    sizes = {k: v for k, v in sizes.items() if v is not None}
    if sizes and a.newcomer != "tiny":
        raise ValueError("--newcomer-hidden-size / --newcomer-layers size a tiny newcomer only (--newcomer tiny)")
    swap = LLMSwapConfig(
        worker=a.worker,
        incumbent_adapter=a.incumbent_adapter,
        newcomer=a.newcomer,
        newcomer_seed=a.newcomer_seed,
        newcomer_adapter=a.newcomer_adapter,
        newcomer_tiny=dataclasses.replace(TinyModelConfig(), **sizes) if sizes else None,
        train_params=a.train_params,
        cache_limit_mb=a.cache_limit_mb,
    )
    return align_cfg, team_cfg, swap


def _run_llm(a: argparse.Namespace) -> int:
    import torch

    from orchestra.backends.hf import quiet_loading
    from orchestra.teamtr.align import AlignError, report_markdown, write_report
    from orchestra.teamtr.align_llm import (
        build_incumbent_team,
        build_llm_newcomer,
        check_newcomer_tokenizer,
        incumbent_team_config,
        llm_swap_shock,
        newcomer_config,
    )
    from orchestra.teamtr.llm_models import load_tokenizer

    say = _progress(a.quiet)
    out = Path(a.out)
    t0 = time.perf_counter()
    try:  # every input error surfaces here, before anything is written or trained
        align_cfg, team_cfg, swap = _llm_configs(a)
        _fresh_out(out)
        team_cfg = incumbent_team_config(team_cfg, swap)  # the incumbent adapter's LoRA layout (missing folder…)
        new_cfg = newcomer_config(team_cfg, swap)
        check_newcomer_tokenizer(team_cfg, swap)  # another tokenizer family: refused before any model loads
        if team_cfg.device == "cpu":
            torch.set_num_threads(1)  # small models are dispatch-bound on a busy CPU
        say(
            f"align llm: team {team_cfg.team}, worker {swap.worker}, incumbent {team_cfg.model}, newcomer {swap.newcomer}"
        )
        team = build_incumbent_team(team_cfg, swap, log=say)  # unknown / tool worker, bad model path…
        newcomer = build_llm_newcomer(team_cfg, swap, log=say)
    except ValueError as e:  # AlignError, LLMTeamError included
        print(f"error: {e}", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    config = {
        "format": FORMAT,
        "mode": "llm",
        "align": dataclasses.asdict(align_cfg),
        "swap": dataclasses.asdict(swap),
        "team": dataclasses.asdict(team_cfg),
        "newcomer": dataclasses.asdict(new_cfg),
    }
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")

    def on_check(row: dict[str, float]) -> None:
        say(
            f"align step {int(row['align/step']):5d}: KL(new‖inc) train {row['kl/train']:.4f} "
            f"held-out {row['kl/heldout']:.4f} (δ_0 {align_cfg.delta_0:g}), {row['perf/wall_seconds']:.0f} s"
        )

    try:
        report = llm_swap_shock(team, swap, align_cfg, newcomer=newcomer, on_check=on_check, log=say)
    except AlignError as e:  # e.g. the worker never speaks under this conductor
        print(f"error: {e}", file=sys.stderr)
        return 2
    report = dataclasses.replace(report, meta={**report.meta, "total_seconds": time.perf_counter() - t0})
    paths = write_report(report, out, plot=not a.no_plot)
    written = [out / "config.json", *paths.values(), *newcomer.save_adapters(out / "adapters").values()]
    if swap.train_params == "all":  # the base moved too: the merged model is a local HF folder (--model DIR)
        tokenizer = load_tokenizer(new_cfg.model)
        merged = newcomer.model_of(0).merge_and_unload()
        with quiet_loading():
            merged.save_pretrained(str(out / "newcomer_model"))
            tokenizer.save_pretrained(str(out / "newcomer_model"))
        written.append(out / "newcomer_model")
    print(report_markdown(report))
    print("written: " + "  ".join(str(p) for p in written))
    return 0


MODES: dict[str, Handler] = {"chain": _run_chain, "llm": _run_llm}


def _cmd_align(a: argparse.Namespace) -> int:
    return MODES[a.align_mode](a)
