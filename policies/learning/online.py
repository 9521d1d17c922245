"""Online refinement of the conductor: sb3-contrib MaskablePPO, optionally warm-started by behaviour cloning.

``train_ppo`` runs the CleanRL-shaped loop "collect one rollout → one PPO update → log → checkpoint"
on any Gymnasium env whose ``action_masks()`` gives the legal actions (``orchestra.runtime.conductor_gym``
is the one this toolkit ships; this module imports no LLM code, docs/architecture.md §2). Before PPO, an optional
warm start fits the policy network to logged decisions (the BC conductor's data), so online learning
starts from the offline policy instead of from uniform (the issue's "optionally warm-started from the
BC policy").

Run folder (``out_dir``): ``ppo_config.json`` (resolved :class:`PPOConfig`), ``metrics.jsonl`` +
``metrics.csv`` (one row per rollout: ``rollout/…``, ``losses/…``, ``rails/…``, ``perf/…``; the warm
start is row 0), ``checkpoint/`` (``model.zip`` + ``conductor.json``), rewritten every
``checkpoint_every`` rollouts and at the end; ``resume=True`` continues from it.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from envs.config import TeamEnvConfig
from envs.observation import ObservationEncoder
from policies.base import PolicyError
from policies.learning.checkpoint import ConductorMeta, open_checkpoint
from trajectories.rundir import MetricsWriter, write_config

CHECKPOINT_DIR = "checkpoint"
MODEL_FILE = "model.zip"
CONFIG_FILE = "ppo_config.json"


@dataclass
class PPOConfig:
    """MaskablePPO and warm-start settings; every knob declared (SB3 names where SB3 has one)."""

    total_timesteps: int = 4096  # conductor decisions to train on (0 = warm start only)
    n_steps: int = 256  # decisions per rollout (one PPO update per rollout)
    batch_size: int = 64  # minibatch size of the PPO update
    n_epochs: int = 10  # passes over each rollout
    learning_rate: float = 3e-4  # Adam step size (constant)
    gamma: float = 0.99  # discount
    gae_lambda: float = 0.95  # GAE lambda
    clip_range: float = 0.2  # PPO clip epsilon
    ent_coef: float = 0.01  # entropy bonus (keeps exploring other workers)
    vf_coef: float = 0.5  # value loss weight
    max_grad_norm: float = 0.5  # gradient clipping
    net_arch: list[int] = field(default_factory=lambda: [64, 64])  # hidden sizes of the policy and value MLPs
    seed: int = 0  # seeds torch, the env's task stream and the action sampling
    warm_start_epochs: int = 20  # behaviour-cloning epochs over the warm-start data (0 = skip)
    warm_start_lr: float = 1e-3  # Adam step size of the warm start
    warm_start_batch_size: int = 64  # minibatch size of the warm start
    checkpoint_every: int = 10  # rollouts between checkpoints (the final one is always written)
    device: str = "cpu"  # torch device; a small MLP is fastest on CPU
    torch_threads: int = 1  # CPU threads while training: a small MLP only pays thread sync for more


class DecisionData(Protocol):
    """Logged conductor decisions (a :class:`policies.learning.dataset.ConductorDataset` is one)."""

    observations: np.ndarray  # (N, D) float32
    actions: np.ndarray  # (N,) int64
    masks: np.ndarray  # (N, A) int8, the legal actions at each decision


# -- warm start: behaviour cloning of the PPO policy -----------------------------------------------
def masked_bc_loss(
    policy: Any, obs: torch.Tensor, actions: torch.Tensor, masks: torch.Tensor
) -> tuple[torch.Tensor, dict[str, float]]:
    """Cross-entropy of the logged actions under the policy's *masked* action distribution.

    ``loss = -mean_i log pi(a_i | s_i, mask_i)``, with pi the softmax of the actor's logits after the
    illegal ones are set to -1e8 (exactly the distribution MaskablePPO samples from, Huang & Ontañón
    2020, "A closer look at invalid action masking"). Shapes: obs (B, D), actions (B,), masks (B, A).
    """
    dist = policy.get_distribution(obs, action_masks=masks)
    log_prob = dist.log_prob(actions)  # (B,)
    loss = -log_prob.mean()
    agree = (dist.mode() == actions).float().mean()
    return loss, {"loss": float(loss.detach()), "agreement": float(agree)}


def bc_agreement(model: Any, data: DecisionData) -> tuple[float, float]:
    """(loss, agreement) of the model's masked policy on the data: the share of decisions where its
    deterministic masked choice equals the logged action."""
    policy = model.policy
    policy.set_training_mode(False)
    with torch.no_grad():
        obs, act, masks = _tensors(policy, data)
        _, m = masked_bc_loss(policy, obs, act, masks)
    return m["loss"], m["agreement"]


def _tensors(policy: Any, data: DecisionData) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    obs = torch.as_tensor(np.asarray(data.observations, dtype=np.float32), device=policy.device)
    act = torch.as_tensor(np.asarray(data.actions, dtype=np.int64), device=policy.device)
    masks = torch.as_tensor(np.asarray(data.masks) > 0, device=policy.device)
    return obs, act, masks


def bc_warm_start(model: Any, data: DecisionData, cfg: PPOConfig) -> dict[str, float]:
    """Fit the actor of a MaskablePPO model to logged decisions; returns ``warm_start/…`` metrics.

    Only the actor (shared extractor, policy MLP, action head) gets gradients: the loss does not reach
    the value head, which PPO's first updates fit from the returns.
    """
    n = len(data.actions)
    if n == 0:
        raise PolicyError("warm start: the data has no decisions")
    masks = np.asarray(data.masks) > 0
    if not masks[np.arange(n), np.asarray(data.actions)].all():
        bad = int(np.flatnonzero(~masks[np.arange(n), np.asarray(data.actions)])[0])
        raise PolicyError(f"warm start: decision {bad} took action {int(data.actions[bad])}, which its mask forbids")
    loss0, agree0 = bc_agreement(model, data)
    policy = model.policy
    obs, act, m = _tensors(policy, data)
    optimizer = torch.optim.Adam(policy.parameters(), lr=cfg.warm_start_lr)
    gen = torch.Generator().manual_seed(cfg.seed)
    policy.set_training_mode(True)
    for _ in range(cfg.warm_start_epochs):
        for mb_inds in torch.randperm(n, generator=gen).split(cfg.warm_start_batch_size):
            loss, _ = masked_bc_loss(policy, obs[mb_inds], act[mb_inds], m[mb_inds])
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(policy.parameters(), cfg.max_grad_norm)
            optimizer.step()
    loss1, agree1 = bc_agreement(model, data)
    return {
        "warm_start/decisions": float(n),
        "warm_start/epochs": float(cfg.warm_start_epochs),
        "warm_start/loss_before": loss0,
        "warm_start/loss_after": loss1,
        "warm_start/agreement_before": agree0,
        "warm_start/agreement_after": agree1,
    }


# -- metrics -----------------------------------------------------------------------------------------
def aggregate_episode_metrics(episodes: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Per-rollout metrics from per-episode ``episode_metrics`` dicts: keys ending in ``_mean`` or
    ``_rate`` are averaged over the episodes, every other key (counters such as ``rails/denied``) summed."""
    out: dict[str, float] = {"rollout/episodes": float(len(episodes))}
    keys = sorted({k for e in episodes for k in e})
    for k in keys:
        vals = [float(e[k]) for e in episodes if k in e]
        out[k] = float(np.mean(vals)) if k.endswith(("_mean", "_rate")) else float(np.sum(vals))
    return out


def _episode_collector() -> Any:
    from stable_baselines3.common.callbacks import BaseCallback

    class EpisodeCollector(BaseCallback):
        """Keeps the ``episode_metrics`` an env puts in the info of each episode's last step."""

        def __init__(self) -> None:
            super().__init__()
            self.episodes: list[dict[str, float]] = []

        def _on_step(self) -> bool:
            for info, done in zip(self.locals["infos"], self.locals["dones"], strict=True):
                if done and "episode_metrics" in info:
                    self.episodes.append(dict(info["episode_metrics"]))
            return True

    return EpisodeCollector()


# -- loading without unpickling ---------------------------------------------------------------------
# the entries stable-baselines3 cloudpickles into a saved model's `data`, and what each is rebuilt from instead; the
# last four are rollout state, dropped (None): a resumed run resets its env and starts fresh episode buffers
_SB3_SERIALIZED = (
    "policy_class",
    "observation_space",
    "action_space",
    "rollout_buffer_class",
    "clip_range",
    "lr_schedule",
    "_last_obs",
    "_last_episode_starts",
    "ep_info_buffer",
    "ep_success_buffer",
)


def load_ppo(path: Path, observation_size: int, num_actions: int, ppo: Mapping[str, Any], env: Any = None) -> Any:
    """``MaskablePPO.load`` without unpickling anything: every cloudpickled entry of the zip's ``data`` is replaced
    by the object orchestra builds itself (its policy and buffer classes, the conductor's spaces, the constant
    schedules of the recorded config); an entry it does not know is refused. The weights are read with
    ``weights_only=True`` by stable-baselines3 itself."""
    import zipfile

    from gymnasium import spaces
    from sb3_contrib import MaskablePPO
    from sb3_contrib.common.maskable.buffers import MaskableRolloutBuffer
    from sb3_contrib.common.maskable.policies import MaskableActorCriticPolicy
    from stable_baselines3.common.utils import ConstantSchedule

    try:
        with zipfile.ZipFile(path) as z:
            data = json.loads(z.read("data"))
    except (OSError, KeyError, ValueError, zipfile.BadZipFile) as e:
        raise PolicyError(f"{path}: not a stable-baselines3 model ({type(e).__name__}: {e})") from e
    pickled = sorted(k for k, v in data.items() if isinstance(v, dict) and ":serialized:" in v)
    unknown = [k for k in pickled if k not in _SB3_SERIALIZED]
    if unknown:
        raise PolicyError(f"{path}: pickled entries orchestra does not rebuild: {unknown} (refused: loading runs code)")
    objects = {
        "policy_class": MaskableActorCriticPolicy,
        "observation_space": env.observation_space
        if env is not None
        else spaces.Box(-np.inf, np.inf, shape=(observation_size,), dtype=np.float32),
        "action_space": env.action_space if env is not None else spaces.Discrete(num_actions),
        "rollout_buffer_class": MaskableRolloutBuffer,
        "clip_range": ConstantSchedule(float(ppo.get("clip_range", PPOConfig.clip_range))),
        "lr_schedule": ConstantSchedule(float(ppo.get("learning_rate", PPOConfig.learning_rate))),
        **dict.fromkeys(_SB3_SERIALIZED[6:]),
    }
    device = str(ppo.get("device", "cpu"))
    return MaskablePPO.load(path, env=env, device=device, custom_objects=objects)


# -- training ----------------------------------------------------------------------------------------
def _new_model(env: Any, cfg: PPOConfig) -> Any:
    from sb3_contrib import MaskablePPO

    return MaskablePPO(
        "MlpPolicy",
        env,
        learning_rate=cfg.learning_rate,
        n_steps=cfg.n_steps,
        batch_size=cfg.batch_size,
        n_epochs=cfg.n_epochs,
        gamma=cfg.gamma,
        gae_lambda=cfg.gae_lambda,
        clip_range=cfg.clip_range,
        ent_coef=cfg.ent_coef,
        vf_coef=cfg.vf_coef,
        max_grad_norm=cfg.max_grad_norm,
        policy_kwargs={"net_arch": list(cfg.net_arch)},
        seed=cfg.seed,
        device=cfg.device,
        verbose=0,
    )


def _silent_logger(model: Any) -> None:
    """SB3's logger without outputs: we read ``train/*`` values from it and write our own files."""
    from stable_baselines3.common.logger import Logger

    model.set_logger(Logger(folder=None, output_formats=[]))


def _save_checkpoint(model: Any, meta: ConductorMeta, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    partial = folder / "model.partial.zip"
    model.save(partial)
    os.replace(partial, folder / MODEL_FILE)  # a killed save never leaves a half-written model.zip
    meta.save(folder)


def train_ppo(
    env: Any,
    cfg: PPOConfig,
    out_dir: str | Path,
    *,
    meta: ConductorMeta,
    warm_start: DecisionData | None = None,
    init_from: str | Path | None = None,
    resume: bool = False,
    progress: bool = False,
    tensorboard: bool = False,
) -> PPOConductor:
    """Train a MaskablePPO conductor on ``env`` (a Gymnasium env with ``action_masks()``).

    ``meta`` describes the layout (team, embedder, feature names, action labels); its ``config`` is
    extended with the resolved :class:`PPOConfig`. ``init_from`` (a PPO checkpoint folder) loads those
    weights first; ``warm_start`` data is then behaviour-cloned before PPO. With ``resume`` and a
    checkpoint in ``out_dir``, training continues from it (weights, optimizer, timestep count; the
    env's task stream restarts from a seed derived from the timestep count).
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(max(cfg.torch_threads, 1))
    try:
        return _train(env, cfg, Path(out_dir), meta, warm_start, init_from, resume, progress, tensorboard)
    finally:
        torch.set_num_threads(threads)


def _train(
    env: Any,
    cfg: PPOConfig,
    out: Path,
    meta: ConductorMeta,
    warm_start: DecisionData | None,
    init_from: str | Path | None,
    resume: bool,
    progress: bool,
    tensorboard: bool = False,
) -> PPOConductor:

    out.mkdir(parents=True, exist_ok=True)
    ckpt = out / CHECKPOINT_DIR
    meta = replace(meta, algo="ppo", config={**meta.config, "ppo": asdict(cfg)})
    summary = getattr(warm_start, "summary", None)
    if callable(summary):
        meta = replace(meta, dataset=dict(summary()))
    resolved = {"ppo": asdict(cfg), "team": meta.team, "embedder": meta.embedder, "action_labels": meta.action_labels}
    write_config(out, resolved, CONFIG_FILE)
    resumed = resume and (ckpt / MODEL_FILE).exists()
    log = MetricsWriter(out, resume=resumed, tensorboard=tensorboard)  # + tensorboard/metrics/ event files
    if resumed:
        ConductorMeta.load(ckpt).check_layout(meta.feature_names, meta.action_labels, where=str(ckpt))
        model = load_ppo(ckpt / MODEL_FILE, len(meta.feature_names), len(meta.action_labels), asdict(cfg), env=env)
        model.set_random_seed(cfg.seed + model.num_timesteps)  # a fresh task stream, reproducible
    else:
        model = _new_model(env, cfg)
        if init_from is not None:
            src = Path(init_from)
            ConductorMeta.load(src).check_layout(meta.feature_names, meta.action_labels, where=str(src))
            model.set_parameters(str(src / MODEL_FILE), exact_match=True, device=cfg.device)
        if warm_start is not None and cfg.warm_start_epochs > 0:
            log.write({"global_step": 0, "rollout": 0, **bc_warm_start(model, warm_start, cfg)})
    _silent_logger(model)
    collector = _episode_collector()
    rollout = sum(1 for r in log.rows if r.get("rollout", 0) > 0)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=cfg.total_timesteps, initial=model.num_timesteps, desc="ppo", unit="step")
    try:
        while model.num_timesteps < cfg.total_timesteps:
            t0, steps0 = time.perf_counter(), model.num_timesteps
            collector.episodes = []
            # one rollout of n_steps decisions and one PPO update (SB3's learn, kept to one iteration);
            # SB3 dumps (clears) its logger before the update, so what it holds afterwards is train/*
            model.learn(cfg.n_steps, callback=collector, reset_num_timesteps=False, log_interval=1)
            rollout += 1
            wall = max(time.perf_counter() - t0, 1e-9)
            losses = {
                "losses/" + k.removeprefix("train/"): float(v)
                for k, v in model.logger.name_to_value.items()
                if k.startswith("train/")
            }
            model.logger.name_to_value.clear()
            row = {
                "global_step": int(model.num_timesteps),
                "rollout": rollout,
                **aggregate_episode_metrics(collector.episodes),
                **losses,
                "perf/steps_per_s": round((model.num_timesteps - steps0) / wall, 2),
            }
            log.write(row)
            if bar is not None:
                bar.update(model.num_timesteps - steps0)
                bar.set_postfix(ret=f"{row.get('rollout/ep_return_mean', float('nan')):.3f}")
            if rollout % max(cfg.checkpoint_every, 1) == 0:
                _save_checkpoint(model, meta, ckpt)
        _save_checkpoint(model, meta, ckpt)
    finally:
        if bar is not None:
            bar.close()
    return PPOConductor(model, meta, name="ppo")


# -- the conductor -----------------------------------------------------------------------------------
class PPOConductor:
    """A trained MaskablePPO policy as a :class:`policies.base.ConductorPolicy` (deterministic, masked)."""

    def __init__(self, model: Any, meta: ConductorMeta, name: str = "ppo") -> None:
        self.model, self.meta, self.name = model, meta, name

    def reset(self, seed: int | None = None) -> None:
        pass  # deterministic: nothing to reseed

    def act(self, obs: np.ndarray, action_mask: np.ndarray, state: Mapping[str, Any] | None = None) -> int:
        legal = np.asarray(action_mask).astype(bool)
        if not legal.any():
            raise PolicyError("ppo conductor: no legal action (all-zero action mask)")
        action, _ = self.model.predict(np.asarray(obs, dtype=np.float32), action_masks=legal, deterministic=True)
        a = int(np.asarray(action).reshape(-1)[0])
        if not legal[a]:  # masked logits are -1e8, so this only happens on NaN weights: fail loudly
            raise PolicyError(f"ppo conductor: the network chose masked action {a} (weights corrupt?)")
        return a

    def save(self, folder: str | Path) -> Path:
        folder = Path(folder)
        _save_checkpoint(self.model, self.meta, folder)
        return folder

    @classmethod
    def load(
        cls, folder: str | Path, config: TeamEnvConfig, encoder: ObservationEncoder, name: str | None = None
    ) -> PPOConductor:
        """Load a checkpoint folder for this team and encoder (:class:`LayoutError` on another layout)."""
        folder = Path(folder)
        meta, path = open_checkpoint(folder, config, encoder, MODEL_FILE, ("ppo",))
        ppo = {**dict(meta.config.get("ppo", {})), "device": "cpu"}
        model = load_ppo(path, len(meta.feature_names), len(meta.action_labels), ppo)
        return cls(model, meta, name=name or f"ppo:{folder.name}")


__all__ = [
    "DecisionData",
    "PPOConductor",
    "PPOConfig",
    "aggregate_episode_metrics",
    "bc_agreement",
    "bc_warm_start",
    "masked_bc_loss",
    "train_ppo",
]
