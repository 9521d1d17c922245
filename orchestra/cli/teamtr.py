"""``orchestra finetune | align``: phase 2, TeamTR (:mod:`orchestra.jobs.finetune`, :mod:`orchestra.jobs.align`).
The experiments that compare its schemes are ``orchestra experiment`` (:mod:`orchestra.cli.experiment`)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from orchestra.cli.options import Command, ConfigError, Opt, add_options, build, flatten, replace_paths


def _say(quiet: bool) -> Callable[[str], None]:
    return (lambda _line: None) if quiet else (lambda line: print(line, flush=True))


# ----------------------------------------------------------------------------------------------------------------
# finetune

FINETUNE_DESCRIPTION = """\
Fine-tune the LLM workers of a team with TeamTR under a FIXED conductor: one LoRA adapter per trainable worker on
a shared frozen base (SmolLM2 by default), sampled at temperature > 0, updated on its own sampled tokens only with a
PPO-clip surrogate inside a per-token KL trust region (schemes: teamtr | naive | joint | joint_indep | happo |
stale_indep).

Writes OUT/config.json (resolved config), OUT/updates.csv|jsonl and OUT/stages.csv|jsonl (metrics per update and
per stage), OUT/checkpoints/ (resumable: --resume) and OUT/adapters/WORKER/ (peft folders). Precedence: the CPU
defaults shown below, then --config FILE (YAML/JSON {{trainer: TeamTRConfig fields, team: LLMTeamConfig fields}}),
then the flags given.

CPU example (2 cores, fp32; ~1-2 min per stage):
  orchestra finetune --team arithmetic --conductor pipeline \\
      --pipeline solver:solve critic:check solver:revise --workers solver critic \\
      --stages 2 --batch-size 4 --group-size 2 --max-tokens 24 --embedder hash --out runs/finetune-cpu

GPU configuration (orchestra/teamtr/configs/smollm2_gpu.yaml): --dtype bfloat16 --device cuda, 64 episodes
per batch (8 tasks x G=8), --max-tokens 128, 64 held-out test tasks per stage (--eval-tasks):
  orchestra finetune --config orchestra/teamtr/configs/smollm2_gpu.yaml --out runs/finetune-gpu
"""


def team_options(prefix: str) -> list[Opt]:
    """The team-file, conductor and model flags of an LLM team config at ``prefix`` (finetune and align llm)."""
    return [
        Opt(f"{prefix}.team", "--team"),
        Opt(f"{prefix}.family", "--family"),
        Opt(f"{prefix}.difficulty", "--difficulty"),
        Opt(f"{prefix}.conductor", "--conductor"),
        Opt(f"{prefix}.pipeline", "--pipeline", metavar="WORKER:INSTRUCTION"),
        Opt(f"{prefix}.embedder", "--embedder"),
    ]


def model_options(prefix: str) -> list[Opt]:
    from orchestra.teamtr.llm_config import DTYPES

    return [
        Opt(f"{prefix}.model", "--model"),
        Opt(f"{prefix}.dtype", "--dtype", choices=tuple(DTYPES)),
        Opt(f"{prefix}.device", "--device"),
        Opt(f"{prefix}.lora_r", "--lora-r"),
        Opt(f"{prefix}.lora_alpha", "--lora-alpha"),
        Opt(f"{prefix}.temperature", "--temperature"),
    ]


def engine_options(prefix: str) -> list[Opt]:
    return [
        Opt(f"{prefix}.max_tokens", "--max-tokens"),
        Opt(f"{prefix}.num_envs", "--num-envs"),
        Opt(f"{prefix}.max_batch_size", "--max-batch-size"),
        Opt(f"{prefix}.forward_batch_size", "--forward-batch-size"),
    ]


def _finetune(p: argparse.ArgumentParser, epilog: str) -> None:
    from orchestra.jobs.finetune import GPU_CONFIG_NAME, FinetuneConfig

    p.description, p.formatter_class = FINETUNE_DESCRIPTION, argparse.RawDescriptionHelpFormatter
    g = p.add_argument_group("run")
    g.add_argument("--out", required=True, help="run directory (config, metrics CSV/JSONL, checkpoints/, adapters/)")
    g.add_argument("--resume", action="store_true", help="continue the run in --out from its latest checkpoint")
    g.add_argument(
        "--tensorboard",
        action="store_true",
        help="also write the metrics as TensorBoard event files (OUT/tensorboard/)",
    )
    g.add_argument("--config", default=None, help=f"YAML/JSON {{trainer: …, team: …}} (GPU preset: {GPU_CONFIG_NAME})")
    root = FinetuneConfig()
    add_options(
        g, root, [Opt("trainer.seed", "--seed", also=("team.seed",), help="seed of rollouts, orders, LoRA init")]
    )
    g.add_argument("--quiet", action="store_true", help="no progress output (the final metrics are still printed)")
    add_options(
        p.add_argument_group("team"),
        root,
        [
            *team_options("team"),
            Opt("team.workers", "--workers"),
            Opt("team.reward", "--reward"),
            Opt("team.eval_tasks", "--eval-tasks"),
        ],
    )
    add_options(
        p.add_argument_group("model and sampling"),
        root,
        [*model_options("team"), Opt("team.top_p", "--top-p"), *engine_options("team")],
    )
    add_options(
        p.add_argument_group("trainer"),
        root,
        [
            Opt("trainer.scheme", "--scheme"),
            Opt("trainer.num_stages", "--stages"),
            Opt("trainer.batch_size", "--batch-size"),
            Opt("team.group_size", "--group-size"),
            Opt("trainer.num_epochs", "--epochs"),
            Opt("trainer.num_minibatches", "--minibatches"),
            Opt("trainer.lr", "--lr"),
            Opt("trainer.delta", "--delta", type=float, help="per-token KL budget δ of every worker"),
            Opt("trainer.order", "--order"),
            Opt("trainer.trust_region", "--trust-region"),
            Opt("trainer.kl_estimator", "--kl-estimator"),
            Opt("team.has_logits", "--exact-kl"),
            Opt("trainer.max_grad_norm", "--max-grad-norm"),
            Opt("trainer.keep_checkpoints", "--keep-checkpoints"),
        ],
    )
    add_options(
        p.add_argument_group("sampling server (vLLM)"),
        root,
        [
            Opt("team.sampler_url", "--sampler-url", metavar="URL"),
            Opt("team.sampler_model", "--sampler-model"),
            Opt("team.sampler_adapter_dir", "--sampler-adapter-dir", metavar="DIR"),
            Opt("team.sampler_concurrency", "--sampler-concurrency"),
        ],
    )


def _align(p: argparse.ArgumentParser, epilog: str) -> None:
    from orchestra.jobs.align import AlignChainConfig, AlignLLMConfig

    p.description = (
        "Replace one worker of a team by a newcomer model. The newcomer is first trained to minimise the per-token "
        "reverse KL(newcomer ‖ incumbent) on contexts harvested from the current team's rollouts at that worker's "
        "turns, until it is ≤ δ_0 on held-out contexts. Reports team success before the swap, after a direct "
        "(unaligned) swap and after the aligned swap."
    )
    asub = p.add_subparsers(dest="align_mode", required=True, metavar="MODE")
    q = asub.add_parser(
        "chain",
        help="the telephone-chain testbed: warm-started (optionally TeamTR-trained) chain, exact team success",
        description="Build a warm-started telephone chain (optionally fine-tuned --train-stages TeamTR stages, so the "
        "incumbent is a trained agent), swap agent --agent for a differently initialised newcomer, align it, and "
        "report exact J before / direct / aligned.",
        epilog=epilog,
    )
    chain = AlignChainConfig()
    add_options(
        q.add_argument_group("team"),
        chain,
        [Opt("n_agents", "--n"), "vocab_size", Opt("swap.agent", "--agent"), "train_stages"],
    )
    add_options(
        q.add_argument_group("newcomer"),
        chain,
        [
            Opt("swap.newcomer", "--newcomer"),
            Opt("swap.newcomer_seed", "--newcomer-seed"),
            Opt("swap.train_params", "--train-params"),
            "newcomer_hidden_size",
            "newcomer_layers",
        ],
    )
    add_options(q.add_argument_group("baselines"), chain, [Opt("compare", "--compare"), "compare_seeds"])
    _align_options(q, chain)

    q = asub.add_parser(
        "llm",
        help="an LLM team: swap worker --worker for a newcomer model aligned on the team's probe contexts",
        description=ALIGN_LLM_DESCRIPTION,
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    llm = AlignLLMConfig()
    add_options(
        q.add_argument_group("team (the incumbent's)"),
        llm,
        [
            *team_options("team"),
            Opt("swap.worker", "--worker"),
            Opt("team.frozen_workers", "--frozen-workers"),
            Opt("team.eval_tasks", "--eval-tasks"),
        ],
    )
    add_options(
        q.add_argument_group("incumbent"),
        llm,
        [Opt("team.model", "--model"), Opt("swap.incumbent_adapter", "--incumbent-adapter", metavar="DIR")],
    )
    add_options(
        q.add_argument_group("newcomer"),
        llm,
        [
            Opt("swap.newcomer", "--newcomer", required=True),
            Opt("swap.newcomer_seed", "--newcomer-seed"),
            Opt("swap.newcomer_adapter", "--newcomer-adapter", metavar="DIR"),
            Opt("swap.train_params", "--train-params"),
            "newcomer_hidden_size",
            "newcomer_layers",
        ],
    )
    add_options(
        q.add_argument_group("models and sampling"),
        llm,
        [*model_options("team")[1:], *engine_options("team"), Opt("swap.cache_limit_mb", "--cache-limit-mb")],
    )
    _align_options(q, llm)


ALIGN_LLM_DESCRIPTION = """\
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


def _align_options(q: argparse.ArgumentParser, root: Any) -> None:
    """Flags of every align mode: the alignment loop's knobs (AlignConfig), output, seed, progress."""
    add_options(
        q.add_argument_group("alignment (Stage 0)"),
        root,
        [
            Opt("align.delta_0", "--delta0"),
            Opt("align.lr", "--lr"),
            Opt("align.max_steps", "--max-steps"),
            Opt("align.batch_size", "--batch-size"),
            Opt("align.num_train_probes", "--probes"),
            Opt("align.num_heldout_probes", "--heldout-probes"),
            Opt("align.check_every", "--check-every"),
            Opt("align.divergence", "--divergence"),
        ],
    )
    add_options(
        q,
        root,
        [
            "out",
            Opt("plot", "--no-plot", help="do not draw kl_curve.png"),
            Opt("seed", also=("align.seed",)),
            Opt("progress", "--quiet", help="no progress output"),
        ],
    )


def finetune_config(a: argparse.Namespace) -> Any:
    """``orchestra finetune``'s resolved FinetuneConfig: the CPU defaults, then ``--config FILE``, then the flags given
    (ConfigError naming the file and field)."""
    from orchestra.jobs.finetune import FinetuneConfig, read_config_file

    try:
        base = FinetuneConfig()
        if a.config:
            base = replace_paths(base, flatten(read_config_file(a.config)), where=f"--config {a.config}: ")
        return build(base, a)
    except ValueError as e:  # a bad field or value in the file or the flags (the configs' own checks)
        raise ConfigError(str(e)) from e


def _cmd_finetune(a: argparse.Namespace) -> int:
    from orchestra.jobs.finetune import describe, finetune
    from orchestra.teamtr.checkpoint import CheckpointError

    say = _say(a.quiet)
    cfg = finetune_config(a)
    try:
        res = finetune(cfg, a.out, resume=a.resume, say=say, tensorboard=a.tensorboard)
    except (ValueError, CheckpointError) as e:  # LLMTeamError, ConfigMismatchError, a damaged checkpoint…
        print(f"error: {e}", file=sys.stderr)
        return 2
    print("\n".join(describe(res, Path(a.out))))
    bad = res.non_finite()
    if bad:
        print(f"warning: non-finite metrics: {bad}", file=sys.stderr)
    return 0


def _cmd_align(a: argparse.Namespace) -> int:
    from orchestra.jobs.align import AlignChainConfig, AlignLLMConfig, align_chain, align_llm

    if a.align_mode == "chain":
        cfg: Any = build(AlignChainConfig(), a)
        job: Any = align_chain
    else:
        cfg, job = build(AlignLLMConfig(), a), align_llm
    try:
        res = job(cfg)
    except ValueError as e:  # AlignError, LLMTeamError: named before anything is built or written
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(res.markdown)
    print("written: " + "  ".join(str(p) for p in res.written))
    return 0


COMMANDS = {
    "finetune": Command(
        "phase 2: fine-tune a team's LLM workers with TeamTR (one LoRA adapter each) under a fixed conductor",
        _finetune,
        _cmd_finetune,
    ),
    "align": Command(
        "Stage-0 alignment: swap a worker's model for a newcomer aligned by reverse KL; report the swap shock",
        _align,
        _cmd_align,
    ),
}
