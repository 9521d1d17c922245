"""CLI: ``orchestra align`` — Stage-0 alignment of a newcomer to a team's worker, with the swap-shock report
(phase 2; the method: :mod:`orchestra.teamtr.align`).

One subcommand per kind of team (``align_mode``): ``chain`` (the telephone-chain testbed, exact team success) now;
an ``llm`` mode (``--team … --worker … --incumbent ADAPTER_DIR --newcomer MODEL_OR_ADAPTER``) plugs in by adding a
parser in :func:`add_parsers` and a runner in :data:`MODES`; it reuses :func:`orchestra.teamtr.align.swap_shock`,
:func:`~orchestra.teamtr.align.check_tokenizer_family` and :func:`~orchestra.teamtr.align.write_report` with its own
probes and policies. Every mode writes to ``--out``: ``config.json`` (resolved), ``metrics.jsonl`` /
``metrics.csv`` (one row per KL check), ``report.json``, ``report.md``, ``kl_curve.png`` and the newcomer's aligned
weights (``newcomer.safetensors``).
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
    w.add_argument("--newcomer-seed", type=int, default=None, help="its init seed (default: derived, ≠ the team's)")
    w.add_argument(
        "--train-params", choices=["adapter", "all"], default="adapter", help="train its LoRA only, or all weights"
    )
    w.add_argument("--newcomer-hidden-size", type=int, default=None, help="its base width (default: the team's)")
    w.add_argument("--newcomer-layers", type=int, default=None, help="its base depth (default: the team's)")
    _shared(q, "runs/align_chain")
    # an `llm` mode goes here: asub.add_parser("llm", …) with --team --worker --incumbent --newcomer, + MODES["llm"]
    return {"align": _cmd_align}


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


MODES: dict[str, Handler] = {"chain": _run_chain}  # + "llm" (orchestra.teamtr.llm) next


def _cmd_align(a: argparse.Namespace) -> int:
    return MODES[a.align_mode](a)
