"""``orchestra finetune``: phase 2, fine-tune a team's LLM workers with TeamTR under a fixed conductor (not to be
confused with ``orchestra finetune-conductor``, the conductor's online PPO: :mod:`orchestra.jobs.conductor_ppo`).

One LoRA adapter per trainable worker on a shared frozen base (:mod:`orchestra.teamtr.llm`), trained by the same
trainer as the telephone chain (:func:`orchestra.teamtr.trainer.train`; schemes teamtr | naive | joint | joint_indep
| happo). The run directory gets the resolved config, ``updates.csv/jsonl`` and ``stages.csv/jsonl`` (one row per
update / stage), resumable stage checkpoints (``checkpoints/``) and the final adapters as peft folders
(``adapters/{worker}/``, loadable by a team file's transformers backend).

Settings, lowest precedence first: :class:`FinetuneConfig`'s CPU defaults (:data:`~orchestra.teamtr.config.
LLM_CPU_TRAINER`, :data:`~orchestra.teamtr.llm_config.LLM_CPU_TEAM`), then a config file (YAML or JSON:
``{"trainer": {TeamTRConfig fields}, "team": {LLMTeamConfig fields}}``, :func:`read_config_file`), then the flags.

GPU (the documented configuration, ``orchestra/teamtr/configs/smollm2_gpu.yaml``: bfloat16 on cuda, 64 episodes per
batch = 8 tasks × G = 8, max_tokens 128, 64 held-out tasks per stage)::

    orchestra finetune --config orchestra/teamtr/configs/smollm2_gpu.yaml --out runs/finetune-gpu
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestra.teamtr.config import LLM_CPU_TRAINER, TeamTRConfig
from orchestra.teamtr.llm_config import LLM_CPU_TEAM, LLMTeamConfig

GPU_CONFIG = Path(__file__).parent.parent / "teamtr" / "configs" / "smollm2_gpu.yaml"
GPU_CONFIG_NAME = GPU_CONFIG.relative_to(
    Path(__file__).parents[2]
).as_posix()  # as help and docs name it: no machine path


@dataclass(frozen=True)
class FinetuneConfig:
    """Every knob of ``orchestra finetune``: the trainer and the LLM team (written into the run directory and its
    checkpoints, compared on resume)."""

    trainer: TeamTRConfig = field(default_factory=lambda: LLM_CPU_TRAINER)  # where each update's data comes from…
    team: LLMTeamConfig = field(default_factory=lambda: LLM_CPU_TEAM)  # the team file, conductor, model, sampling

    def __post_init__(self) -> None:
        if self.trainer.batch_size % self.team.group_size:
            raise ValueError(
                f"trainer.batch_size {self.trainer.batch_size} must be a multiple of team.group_size "
                f"{self.team.group_size} (G episodes per task)"
            )


def read_config_file(path: str | Path) -> dict[str, Any]:
    """``{"trainer": {...}, "team": {...}}`` from a YAML or JSON file (ValueError naming the file if it is not)."""
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
    for section in ("trainer", "team"):
        if not isinstance(data.get(section) or {}, dict):
            raise ValueError(f"--config {file}: {section}: expected a mapping")
    return data


# ----------------------------------------------------------------------------------------------------------------
# live lines


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


def update_line(row: Mapping[str, float], names: tuple[str, ...]) -> str:
    """One update's metrics on one line (the worker, or every worker for a joint update)."""
    agent = int(row["rollout/agent"])
    who = names[agent] if agent >= 0 else "+".join(names)
    return f"  stage {int(row['rollout/stage'])} {who:>12}: {_fmt(row, UPDATE_COLUMNS)}"


def stage_line(row: Mapping[str, float]) -> str:
    return f"  stage {int(row['rollout/stage'])}: {_fmt(row, STAGE_COLUMNS)}"


# ----------------------------------------------------------------------------------------------------------------
# the job


@dataclass(frozen=True)
class FinetuneResult:
    log: Any  # the trainer's TrainLog (per-update and per-stage metrics)
    agent_names: tuple[str, ...]
    adapters: dict[str, Path]  # worker → peft folder
    seconds: float

    def non_finite(self) -> list[str]:
        """Metric names with a non-finite value in any update."""
        return sorted({k for row in self.log.updates for k, v in row.items() if not math.isfinite(v)})


def finetune(
    cfg: FinetuneConfig,
    out: str | Path,
    *,
    resume: bool = False,
    say: Callable[[str], None] = print,
    tensorboard: bool = False,
) -> FinetuneResult:
    """Train ``cfg`` into the run directory ``out`` (``resume``: continue its latest checkpoint); ``say`` gets the
    live lines. A directory that holds a run already needs ``resume`` (FileExistsError)."""
    out = Path(out)
    if not resume and ((out / "config.json").exists() or (out / "checkpoints").exists()):
        raise FileExistsError(f"{out} already holds a run: pass --resume to continue it, or use a new --out")
    trainer_cfg, team_cfg = cfg.trainer, cfg.team
    say(
        f"finetune: team {team_cfg.team}, conductor {team_cfg.conductor}, workers {' '.join(team_cfg.workers)}, "
        f"scheme {trainer_cfg.scheme}, {trainer_cfg.num_stages} stages × batch {trainer_cfg.batch_size} "
        f"(G={team_cfg.group_size}), model {team_cfg.model} {team_cfg.dtype} on {team_cfg.device} → {out}"
    )
    from orchestra.teamtr.llm import LLMTeam
    from orchestra.teamtr.trainer import TrainHooks, train

    t0 = time.perf_counter()
    team = LLMTeam(team_cfg, log=say)

    def before(stage: int, agents: tuple[int, ...], _batch: Any) -> None:
        say(f"stage {stage}: updating {', '.join(team.agent_names[i] for i in agents)}")

    hooks = TrainHooks(
        before_update=before,
        on_update=lambda row: say(update_line(row, team.agent_names)),
        on_stage=lambda row: say(stage_line(row)),
    )
    log = train(team, trainer_cfg, hooks=hooks, out_dir=out, resume=resume, tensorboard=tensorboard)
    adapters = team.save_adapters(out / "adapters")
    return FinetuneResult(log, team.agent_names, adapters, time.perf_counter() - t0)


def describe(result: FinetuneResult, out: Path) -> list[str]:
    """The closing lines: every update's and stage's metrics, the run directory and the adapters."""
    lines = ["per-update metrics:", *(update_line(row, result.agent_names) for row in result.log.updates)]
    lines += ["per-stage metrics:", *(stage_line(row) for row in result.log.stages)]
    files = ", ".join(p.name for p in sorted(out.iterdir()))
    lines.append(
        f"run directory: {out} ({files}); adapters: {json.dumps({k: str(v) for k, v in result.adapters.items()})}"
    )
    lines.append(f"done in {result.seconds:.1f} s")
    return lines


__all__ = [
    "GPU_CONFIG",
    "GPU_CONFIG_NAME",
    "FinetuneConfig",
    "FinetuneResult",
    "describe",
    "finetune",
    "read_config_file",
    "stage_line",
    "update_line",
]
