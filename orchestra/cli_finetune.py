"""CLI: ``orchestra finetune`` — phase 2, fine-tune a team's LLM workers with TeamTR under a fixed conductor.

One LoRA adapter per trainable worker on a shared frozen base (:mod:`orchestra.teamtr.llm`), trained by the same
trainer as the telephone chain (:func:`orchestra.teamtr.trainer.train`; schemes teamtr | naive | joint | joint_indep
| happo). The run directory gets the resolved config, ``updates.csv/jsonl`` and ``stages.csv/jsonl`` (one row per
update / stage), resumable stage checkpoints (``checkpoints/``) and the final adapters as peft folders
(``adapters/{worker}/``, loadable by a team file's transformers backend).

Settings, lowest precedence first: the CPU defaults below (:data:`FINETUNE_TRAINER`, :data:`FINETUNE_TEAM_DEFAULTS`), then
``--config FILE`` (YAML or JSON: ``{"trainer": {TeamTRConfig fields}, "team": {LLMTeamConfig fields}}``), then the
flags given on the command line.

CPU (2 cores, fp32)::

    orchestra finetune --team arithmetic --conductor pipeline --pipeline solver:solve critic:check solver:revise \\
        --workers solver critic --stages 2 --batch-size 4 --group-size 2 --max-tokens 24 --out runs/finetune-cpu

GPU (the documented configuration, ``orchestra/teamtr/configs/smollm2_gpu.yaml``: bfloat16 on cuda, 64 episodes per
batch = 8 tasks × G = 8, max_tokens 128, 64 held-out tasks per stage)::

    orchestra finetune --config orchestra/teamtr/configs/smollm2_gpu.yaml --out runs/finetune-gpu
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from orchestra.teamtr.config import SCHEMES, TeamTRConfig

Handler = Callable[[argparse.Namespace], int]

DESCRIPTION = """\
Fine-tune the LLM workers of a team with TeamTR under a FIXED conductor: one LoRA adapter per trainable worker on
a shared frozen base (SmolLM2 by default), sampled at temperature > 0, updated on its own sampled tokens only with a
PPO-clip surrogate inside a per-token KL trust region (schemes: teamtr | naive | joint | joint_indep | happo).

Writes OUT/config.json (resolved config), OUT/updates.csv|jsonl and OUT/stages.csv|jsonl (metrics per update and
per stage), OUT/checkpoints/ (resumable: --resume) and OUT/adapters/WORKER/ (peft folders). Precedence: the CPU
defaults shown below, then --config FILE (YAML/JSON {trainer: TeamTRConfig fields, team: LLMTeamConfig fields}),
then the flags given.

CPU example (2 cores, fp32; ~1-2 min per stage):
  orchestra finetune --team arithmetic --conductor pipeline \\
      --pipeline solver:solve critic:check solver:revise --workers solver critic \\
      --stages 2 --batch-size 4 --group-size 2 --max-tokens 24 --embedder hash --out runs/finetune-cpu

GPU configuration (orchestra/teamtr/configs/smollm2_gpu.yaml): --dtype bfloat16 --device cuda, 64 episodes per
batch (8 tasks x G=8), --max-tokens 128, 64 held-out test tasks per stage (--eval-tasks):
  orchestra finetune --config orchestra/teamtr/configs/smollm2_gpu.yaml --out runs/finetune-gpu
"""

# CPU-sized trainer defaults of `orchestra finetune` (the TeamTRConfig defaults are the telephone chain's)
FINETUNE_TRAINER = TeamTRConfig(num_stages=2, batch_size=8, num_epochs=1, num_minibatches=1, lr=1e-4, delta=0.01)
FINETUNE_TEAM_DEFAULTS: dict[str, Any] = {"workers": ("solver",), "max_tokens": 48, "group_size": 4}
GPU_CONFIG = Path(__file__).parent / "teamtr" / "configs" / "smollm2_gpu.yaml"

# flag dest → (section, field): the flags that override a config field when given
_TRAINER_FLAGS = {
    "scheme": "scheme",
    "stages": "num_stages",
    "batch_size": "batch_size",
    "epochs": "num_epochs",
    "minibatches": "num_minibatches",
    "lr": "lr",
    "delta": "delta",
    "order": "order",
    "trust_region": "trust_region",
    "kl_estimator": "kl_estimator",
    "max_grad_norm": "max_grad_norm",
    "keep_checkpoints": "keep_checkpoints",
    "seed": "seed",
}
_TEAM_FLAGS = {
    "team": "team",
    "family": "family",
    "difficulty": "difficulty",
    "conductor": "conductor",
    "pipeline": "pipeline",
    "embedder": "embedder",
    "workers": "workers",
    "model": "model",
    "dtype": "dtype",
    "device": "device",
    "lora_r": "lora_r",
    "lora_alpha": "lora_alpha",
    "temperature": "temperature",
    "top_p": "top_p",
    "max_tokens": "max_tokens",
    "group_size": "group_size",
    "reward": "reward",
    "exact_kl": "has_logits",
    "eval_tasks": "eval_tasks",
    "num_envs": "num_envs",
    "max_batch_size": "max_batch_size",
    "forward_batch_size": "forward_batch_size",
    "seed": "seed",
}


def add_parsers(sub: Any, common: Callable[[argparse.ArgumentParser], None], epilog: str) -> dict[str, Handler]:
    """Add ``orchestra finetune``; returns its handler. (``common`` is not used: response caching and
    ``--num-envs`` semantics differ for sampled, trainable workers, so the flags are declared here.)"""
    p = sub.add_parser(
        "finetune",
        help="phase 2: fine-tune a team's LLM workers with TeamTR (one LoRA adapter each) under a fixed conductor",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=epilog,
    )
    g = p.add_argument_group("run")
    g.add_argument("--out", required=True, help="run directory (config, metrics CSV/JSONL, checkpoints/, adapters/)")
    g.add_argument("--resume", action="store_true", help="continue the run in --out from its latest checkpoint")
    g.add_argument("--config", default=None, help=f"YAML/JSON {{trainer: …, team: …}} (GPU preset: {GPU_CONFIG})")
    g.add_argument("--seed", type=int, default=None, help="seed of rollouts, orders, LoRA init (default 0)")
    g.add_argument("--quiet", action="store_true", help="no progress output (the final metrics are still printed)")

    g = p.add_argument_group("team")
    g.add_argument("--team", default=None, help="built-in team name or team YAML (default arithmetic)")
    g.add_argument("--family", default=None, help="task family (default: the team's); tasks from its train split")
    g.add_argument("--difficulty", type=int, default=None, help="one difficulty level (default: mixed)")
    g.add_argument(
        "--conductor",
        default=None,
        help="the FIXED conductor: a rule-based name or LABEL:CHECKPOINT (default pipeline)",
    )
    g.add_argument(
        "--pipeline", nargs="+", default=None, metavar="WORKER:INSTRUCTION", help="override the team's pipeline steps"
    )
    g.add_argument("--embedder", default=None, choices=["minilm", "hash", "none"], help="override the team's")
    g.add_argument(
        "--workers", nargs="+", default=None, help="trainable LLM workers, one adapter each (default solver)"
    )
    g.add_argument("--reward", default=None, choices=["return", "success"], help="episode reward (default return)")
    g.add_argument("--eval-tasks", type=int, default=None, help="held-out test tasks scored per stage (default 0)")

    g = p.add_argument_group("model and sampling")
    g.add_argument("--model", default=None, help="smollm2 (default), a .gguf file or a local HF folder")
    g.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"], help="default float32")
    g.add_argument("--device", default=None, help="torch device, e.g. cuda (default cpu)")
    g.add_argument("--lora-r", type=int, default=None, help="LoRA rank (default 8)")
    g.add_argument("--lora-alpha", type=int, default=None, help="LoRA alpha (default 16)")
    g.add_argument("--temperature", type=float, default=None, help="sampling temperature, > 0 (default 1.0)")
    g.add_argument("--top-p", type=float, default=None, help="nucleus mass (default 1.0; < 1 is off-policy)")
    g.add_argument("--max-tokens", type=int, default=None, help="tokens per turn of a trainable worker (default 48)")
    g.add_argument("--num-envs", type=int, default=None, help="envs stepped at once (default 16)")
    g.add_argument("--max-batch-size", type=int, default=None, help="rows per decoding forward (default 16)")
    g.add_argument("--forward-batch-size", type=int, default=None, help="turns per training forward (default 16)")

    g = p.add_argument_group("trainer")
    g.add_argument("--scheme", default=None, choices=list(SCHEMES), help="where each update's data comes from")
    g.add_argument("--stages", type=int, default=None, help="stages; a stage updates every worker once (default 2)")
    g.add_argument(
        "--batch-size", type=int, default=None, help="episodes per sampled batch, a multiple of G (default 8)"
    )
    g.add_argument("--group-size", type=int, default=None, help="G: episodes per task, the GRPO group (default 4)")
    g.add_argument("--epochs", type=int, default=None, help="PPO epochs per update (default 1)")
    g.add_argument("--minibatches", type=int, default=None, help="minibatches per epoch (default 1)")
    g.add_argument("--lr", type=float, default=None, help="Adam learning rate of the adapters (default 1e-4)")
    g.add_argument("--delta", type=float, default=None, help="per-token KL budget δ of every worker (default 0.01)")
    g.add_argument("--order", default=None, choices=["fixed", "random"], help="worker order per stage (default random)")
    g.add_argument("--trust-region", default=None, choices=["backtrack", "penalty", "none"], help="default backtrack")
    g.add_argument("--kl-estimator", default=None, choices=["auto", "exact", "k3", "k1"], help="default auto")
    g.add_argument("--exact-kl", action="store_const", const=True, default=None, help="offer logits: exact-vocab KL")
    g.add_argument("--max-grad-norm", type=float, default=None, help="per-worker gradient clip (default off)")
    g.add_argument("--keep-checkpoints", type=int, default=None, help="stage checkpoints kept (default 2)")
    return {"finetune": _cmd_finetune}


# ----------------------------------------------------------------------------------------------------------------
# config resolution


def _tuples(value: Any) -> Any:
    """JSON/YAML lists → tuples (every sequence field of the configs is a tuple)."""
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def _build(cls: Any, base: Any, updates: Mapping[str, Any], where: str) -> Any:
    """``dataclasses.replace(base, **updates)`` with unknown fields named (``where.field``)."""
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(updates) - names)
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {unknown} (known: {', '.join(sorted(names))})")
    return dataclasses.replace(base, **updates)


def read_config_file(path: str | Path) -> dict[str, dict[str, Any]]:
    """``{"trainer": {...}, "team": {...}}`` from a YAML or JSON file (lists become tuples)."""
    import yaml

    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"--config {file}: no such file")
    try:
        data = yaml.safe_load(file.read_text(encoding="utf-8")) or {}  # YAML is a superset of JSON
    except yaml.YAMLError as e:
        raise ValueError(f"--config {file}: not valid YAML/JSON: {e}") from e
    if not isinstance(data, dict) or set(data) - {"trainer", "team"}:
        raise ValueError(f"--config {file}: expected a mapping with the keys 'trainer' and/or 'team'")
    out: dict[str, dict[str, Any]] = {}
    for section in ("trainer", "team"):
        body = data.get(section) or {}
        if not isinstance(body, dict):
            raise ValueError(f"--config {file}: {section}: expected a mapping")
        out[section] = {k: _tuples(v) for k, v in body.items()}
    return out


def resolve_configs(a: argparse.Namespace) -> tuple[TeamTRConfig, Any]:
    """(TeamTRConfig, LLMTeamConfig): the CPU defaults, then ``--config``, then the flags given."""
    from orchestra.teamtr.llm import LLMTeamConfig, TinyModelConfig

    file = read_config_file(a.config) if a.config else {"trainer": {}, "team": {}}
    where = f"--config {a.config}"
    trainer_updates = dict(file["trainer"])
    team_updates = {**FINETUNE_TEAM_DEFAULTS, **file["team"]}
    if isinstance(team_updates.get("tiny"), dict):
        team_updates["tiny"] = _build(TinyModelConfig, TinyModelConfig(), team_updates["tiny"], f"{where}: team.tiny")
    for flag, name in _TRAINER_FLAGS.items():
        if getattr(a, flag) is not None:
            trainer_updates[name] = getattr(a, flag)
    for flag, name in _TEAM_FLAGS.items():
        value = getattr(a, flag)
        if value is not None:
            team_updates[name] = tuple(value) if isinstance(value, list) else value
    trainer = _build(TeamTRConfig, FINETUNE_TRAINER, trainer_updates, f"{where}: trainer")
    team = _build(LLMTeamConfig, LLMTeamConfig(), team_updates, f"{where}: team")
    if trainer.batch_size % team.group_size:
        raise ValueError(f"--batch-size {trainer.batch_size} must be a multiple of --group-size {team.group_size}")
    return trainer, team


# ----------------------------------------------------------------------------------------------------------------
# the command


def _fmt(row: Mapping[str, float], keys: Mapping[str, str]) -> str:
    parts = []
    for label, key in keys.items():
        if key in row:
            v = row[key]
            parts.append(f"{label} {v:.4g}" if isinstance(v, float) and not float(v).is_integer() else f"{label} {v:g}")
    return "  ".join(parts)


UPDATE_COLUMNS = {
    "reward": "rollout/reward_mean",
    "gain": "losses/surrogate_gain",
    "kl_k1": "kl/k1",
    "kl_k3": "kl/k3",
    "kl_exact": "kl/exact",
    "clip": "losses/clip_fraction",
    "entropy": "losses/entropy",
    "backtracks": "trust/backtracks",
    "steps": "trust/optimizer_steps",
    "tokens": "rollout/tokens",
    "episodes": "rollout/episodes",
    "wall_s": "perf/wall_seconds",
}
STAGE_COLUMNS = {
    "certificate": "certificate/proxy",
    "success": "perf/team_success",
    "Δsuccess": "perf/team_success_delta",
    "tokens": "rollout/tokens",
    "stage_s": "perf/stage_seconds",
}


def _update_line(row: Mapping[str, float], names: tuple[str, ...]) -> str:
    """One update's metrics on one line (the worker, or every worker for a joint update)."""
    agent = int(row["rollout/agent"])
    who = names[agent] if agent >= 0 else "+".join(names)
    return f"  stage {int(row['rollout/stage'])} {who:>12}: {_fmt(row, UPDATE_COLUMNS)}"


def _stage_line(row: Mapping[str, float]) -> str:
    return f"  stage {int(row['rollout/stage'])}: {_fmt(row, STAGE_COLUMNS)}"


def _cmd_finetune(a: argparse.Namespace) -> int:
    from orchestra.teamtr.checkpoint import CheckpointError
    from orchestra.teamtr.trainer import TrainHooks, train

    say: Callable[[str], None] = (lambda _line: None) if a.quiet else (lambda line: print(line, flush=True))
    try:
        trainer_cfg, team_cfg = resolve_configs(a)
    except ValueError as e:  # a bad field or value in the file or the flags (the configs' own checks)
        print(f"error: {e}", file=sys.stderr)
        return 2
    out = Path(a.out)
    if not a.resume and ((out / "config.json").exists() or (out / "checkpoints").exists()):
        print(f"error: {out} already holds a run: pass --resume to continue it, or use a new --out", file=sys.stderr)
        return 2
    say(
        f"finetune: team {team_cfg.team}, conductor {team_cfg.conductor}, workers {' '.join(team_cfg.workers)}, "
        f"scheme {trainer_cfg.scheme}, {trainer_cfg.num_stages} stages × batch {trainer_cfg.batch_size} "
        f"(G={team_cfg.group_size}), model {team_cfg.model} {team_cfg.dtype} on {team_cfg.device} → {out}"
    )
    from orchestra.teamtr.llm import LLMTeam

    t0 = time.perf_counter()
    try:
        team = LLMTeam(team_cfg, log=say)

        def before(stage: int, agents: tuple[int, ...], _batch: Any) -> None:
            say(f"stage {stage}: updating {', '.join(team.agent_names[i] for i in agents)}")

        hooks = TrainHooks(
            before_update=before,
            on_update=lambda row: say(_update_line(row, team.agent_names)),
            on_stage=lambda row: say(_stage_line(row)),
        )
        log = train(team, trainer_cfg, hooks=hooks, out_dir=out, resume=a.resume)
        adapters = team.save_adapters(out / "adapters")
    except (ValueError, CheckpointError) as e:  # LLMTeamError, ConfigMismatchError, a damaged checkpoint…
        print(f"error: {e}", file=sys.stderr)
        return 2
    print("per-update metrics:")
    for row in log.updates:
        print(_update_line(row, team.agent_names))
    print("per-stage metrics:")
    for row in log.stages:
        print(_stage_line(row))
    bad = [k for row in log.updates for k, v in row.items() if not math.isfinite(v)]
    if bad:
        print(f"warning: non-finite metrics: {sorted(set(bad))}", file=sys.stderr)
    files = ", ".join(p.name for p in sorted(out.iterdir()))
    print(f"run directory: {out} ({files}); adapters: {json.dumps({k: str(v) for k, v in adapters.items()})}")
    print(f"done in {time.perf_counter() - t0:.1f} s")
    return 0
