"""``orchestra finetune-conductor``: refine a conductor online with MaskablePPO, inside safety rails (phase 1; not to be
confused with ``orchestra finetune``, which fine-tunes the workers with TeamTR: :mod:`orchestra.jobs.finetune`).

One job = one team on one task family: load the team and its workers (as recording does), wrap them in
:class:`orchestra.runtime.conductor_gym.ConductorGymEnv` with :class:`SafetyRails`, optionally warm-start, and
run :func:`policies.learning.online.train_ppo`. The run directory holds ``config.json`` (this job's resolved
config and the team file), ``ppo_config.json``, ``metrics.jsonl``/``metrics.csv``, ``summary.json`` and
``checkpoint/`` (``model.zip`` + ``conductor.json``, loadable by ``policies.learning.learned.load_conductor``).

Warm start (``warm_start``), by what the string names:

* a dataset file (``orchestra dataset build`` output, ``.npz``) → behaviour cloning on its decisions;
* a PPO checkpoint folder → continue from its weights;
* another learned checkpoint folder (BC/CQL…) or a rule-based conductor name (``heuristic``…) → a
  teacher: its decisions on ``warm_start_episodes`` episodes of this env are cloned (distillation).
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from envs.config import Embedder
from envs.observation import ObservationEncoder
from envs.tasks.base import SPLITS, Split
from orchestra.runtime.conductor_gym import Approval, ConductorGymEnv, SafetyRails, terminal_approval
from orchestra.runtime.conductors import conductor_factory
from orchestra.runtime.session import Session
from policies import RULE_BASED
from policies.base import ConductorPolicy, action_id
from policies.learning.checkpoint import META_FILE, ConductorMeta, team_layout
from policies.learning.dataset import ConductorDataset
from policies.learning.learned import load_conductor
from policies.learning.online import CHECKPOINT_DIR, PPOConfig, train_ppo
from trajectories.rundir import provenance, write_config


@dataclass
class ConductorPPOConfig:
    """Resolved settings of one online fine-tuning run; written to the run directory."""

    team: str  # built-in team name or team file path
    family: str | None = None  # task family (default: the team's)
    split: Split = "train"  # task split the env draws from
    difficulty: int | None = None  # one difficulty level, or None to mix them
    seed: int = 0  # seeds the task stream, the workers' sampling and PPO
    timesteps: int = 4096  # conductor decisions to train on
    n_steps: int = 256  # decisions per rollout (one PPO update each)
    batch_size: int = 64  # PPO minibatch size
    n_epochs: int = 10  # PPO passes over each rollout
    learning_rate: float = 3e-4  # PPO Adam step size
    gamma: float = 0.99  # discount
    ent_coef: float = 0.01  # entropy bonus
    net_arch: list[int] = field(default_factory=lambda: [64, 64])  # hidden sizes of the policy/value MLPs
    checkpoint_every: int = 10  # rollouts between checkpoints
    warm_start: str | None = None  # dataset .npz, checkpoint folder, or rule-based conductor name (module doc)
    warm_start_epochs: int = 20  # behaviour-cloning epochs of the warm start
    warm_start_episodes: int = 64  # teacher episodes collected when warm_start names a conductor
    allow: list[str] = field(default_factory=list)  # rails: allowed action labels/patterns (empty = all)
    max_turns: int | None = None  # rails: worker turns per episode before truncation
    max_tokens: int | None = None  # rails: worker completion tokens per episode before truncation
    risky: list[str] = field(default_factory=lambda: ["submit"])  # rails: labels needing approval
    approve: bool = False  # rails: ask on the terminal before each risky action
    on_illegal: str = "raise"  # rails: a masked action raises, or is refused ("refuse")
    embedder: Embedder | None = None  # override the team's observation embedder (None: the team file's)
    use_cache: bool = True  # response cache for temperature-0 worker calls
    cache_path: str | None = None  # default: $ORCHESTRA_CACHE_DIR/responses.sqlite
    resume: bool = False  # continue from the checkpoint in the run directory, if any
    progress: bool = True  # progress bar on stderr
    tensorboard: bool = False  # also write the metrics as TensorBoard event files (OUT/tensorboard/metrics/)

    def ppo_config(self) -> PPOConfig:
        return PPOConfig(
            total_timesteps=self.timesteps,
            n_steps=self.n_steps,
            batch_size=self.batch_size,
            n_epochs=self.n_epochs,
            learning_rate=self.learning_rate,
            gamma=self.gamma,
            ent_coef=self.ent_coef,
            net_arch=list(self.net_arch),
            seed=self.seed,
            warm_start_epochs=self.warm_start_epochs,
            checkpoint_every=self.checkpoint_every,
        )

    def rails(self, approve: Approval | None = None) -> SafetyRails:
        if self.on_illegal not in ("raise", "refuse"):
            raise ValueError(f"on_illegal: expected 'raise' or 'refuse', got {self.on_illegal!r}")
        hook = approve if approve is not None else (terminal_approval() if self.approve else None)
        return SafetyRails(
            allow=tuple(self.allow),
            max_turns=self.max_turns,
            max_tokens=self.max_tokens,
            risky=tuple(self.risky),
            approve=hook,
            on_illegal="raise" if self.on_illegal == "raise" else "refuse",
        )


@dataclass
class Decisions:
    """Conductor decisions collected from a teacher (same fields as a dataset's, for the warm start)."""

    observations: np.ndarray  # (N, D) float32
    actions: np.ndarray  # (N,) int64
    masks: np.ndarray  # (N, A) int8
    teacher: str
    episodes: int
    successes: int

    def summary(self) -> dict[str, Any]:
        return {
            "teacher": self.teacher,
            "episodes": self.episodes,
            "transitions": int(len(self.actions)),
            "success_rate": round(self.successes / max(self.episodes, 1), 4),
            "action_histogram": dict(Counter(int(a) for a in self.actions)),
        }


def collect_decisions(env: ConductorGymEnv, teacher: ConductorPolicy, episodes: int, seed: int) -> Decisions:
    """Run ``teacher`` for ``episodes`` episodes of ``env`` and keep every (observation, action, mask)."""
    obs_l: list[np.ndarray] = []
    act_l: list[int] = []
    mask_l: list[np.ndarray] = []
    successes = 0
    obs, info = env.reset(seed=seed)
    for _ in range(episodes):
        teacher.reset(info["episode_seed"])
        done = False
        while not done:
            mask = env.action_masks().astype(np.int8)
            a = action_id(teacher.act(obs, mask, info["state"]), teacher.name)
            obs_l.append(obs)
            act_l.append(a)
            mask_l.append(mask)
            obs, _, term, trunc, info = env.step(a)
            done = term or trunc
        successes += int(info["episode_metrics"]["rollout/success_rate"])
        obs, info = env.reset()
    return Decisions(
        observations=np.asarray(obs_l, dtype=np.float32),
        actions=np.asarray(act_l, dtype=np.int64),
        masks=np.asarray(mask_l, dtype=np.int8),
        teacher=teacher.name,
        episodes=episodes,
        successes=successes,
    )


def train_conductor_ppo(
    cfg: ConductorPPOConfig, out_dir: str | Path, *, session: Session | None = None, approve: Approval | None = None
) -> Path:
    """Run one online fine-tuning job (module docstring); returns the run directory.

    ``session`` reuses loaded workers; ``approve`` replaces the terminal approval hook (tests, GUIs).
    """
    run_dir = Path(out_dir)
    if cfg.split not in SPLITS:
        raise ValueError(f"split: expected one of {', '.join(SPLITS)}, got {cfg.split!r}")
    split: Split = cfg.split
    session = session or Session(cfg.team, cfg.family, cfg.use_cache, cfg.cache_path)
    team = session.team
    if cfg.embedder is not None:
        team = dataclasses.replace(team, env=dataclasses.replace(team.env, embedder=cfg.embedder))
    write_config(run_dir, {"config": asdict(cfg), "team_file": str(team.path), "team": team.raw, **provenance()})
    rails = cfg.rails(approve)
    env = ConductorGymEnv(
        team, session.family, session.workers, rails, split=split, difficulty=cfg.difficulty, seed=cfg.seed
    )
    encoder: ObservationEncoder = env.encoder
    feature_names, labels = team_layout(team.env, encoder)
    meta = ConductorMeta(
        algo="ppo",
        team=team.name,
        embedder=encoder.embedder.name,
        feature_names=feature_names,
        action_labels=labels,
        config={"finetune": asdict(cfg)},
    )
    warm_data, init_from = None, None
    resuming = cfg.resume and (run_dir / CHECKPOINT_DIR / "model.zip").exists()
    if cfg.warm_start is not None and not resuming:
        warm_data, init_from = _warm_start(cfg, env, team, session, encoder)
    conductor = train_ppo(
        env,
        cfg.ppo_config(),
        run_dir,
        meta=meta,
        warm_start=warm_data,
        init_from=init_from,
        resume=cfg.resume,
        progress=cfg.progress,
        tensorboard=cfg.tensorboard,
    )
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines() if line]
    summary = {
        "checkpoint": str(run_dir / CHECKPOINT_DIR),
        "timesteps": int(conductor.model.num_timesteps),
        "rails_totals": dict(env.rail_totals),
        "last": next((r for r in reversed(rows) if r.get("rollout", 0) > 0), {}),
        "warm_start": next((r for r in rows if r.get("rollout") == 0), {}),
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2), encoding="utf-8")
    return run_dir


def _warm_start(
    cfg: ConductorPPOConfig, env: ConductorGymEnv, team: Any, session: Session, encoder: ObservationEncoder
) -> tuple[Any, Path | None]:
    """(decisions to clone, PPO checkpoint to start from) for ``cfg.warm_start`` (module docstring)."""
    assert cfg.warm_start is not None
    src = Path(cfg.warm_start)
    if src.is_file():
        ds = ConductorDataset.load(src)
        ds.check_layout(team.env, encoder, where=str(src))
        return ds, None
    if (src / META_FILE).exists():
        if ConductorMeta.load(src).algo == "ppo":
            return None, src
        teacher: ConductorPolicy = load_conductor(src, team.env, encoder, name=f"teacher:{src.name}")
    elif cfg.warm_start in RULE_BASED:
        teacher = conductor_factory(cfg.warm_start, team, cfg.seed, session.backends())()
    else:
        raise ValueError(
            f"warm_start {cfg.warm_start!r}: not a dataset file, a conductor checkpoint folder ({META_FILE}), "
            f"or a rule-based conductor ({', '.join(RULE_BASED)})"
        )
    # the teacher plays inside the same rails, but is never put to a person for approval
    collect_env = ConductorGymEnv(
        team,
        session.family,
        session.workers,
        dataclasses.replace(env.rails, approve=None),
        split=env.team_env.split,
        difficulty=cfg.difficulty,
        seed=cfg.seed + 1,
        encoder=encoder,
    )
    return collect_decisions(collect_env, teacher, cfg.warm_start_episodes, cfg.seed + 1), None


__all__ = ["Decisions", "ConductorPPOConfig", "collect_decisions", "train_conductor_ppo"]
