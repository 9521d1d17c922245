"""Offline conductor learning with d3rlpy: DiscreteBC, filtered BC, DQN, DoubleDQN, DiscreteBCQ, DiscreteCQL, and
off-policy evaluation with DiscreteFQE. The algorithms are d3rlpy's own; this module builds them from
a typed config, trains them on a :class:`~policies.learning.dataset.ConductorDataset`, and wraps the result as
a conductor that respects the action mask.

Masking. d3rlpy's discrete algorithms know nothing of action masks. At decision time
(:class:`OfflineConductor`) the per-action scores are computed and illegal actions get ``-inf``, so an
illegal action is never emitted:

* BC / filtered BC: the imitator's logits (Torabi et al. 2018; filtered BC keeps only successful
  episodes, as in "%BC", Chen et al. 2021).
* BCQ (Fujimoto et al. 2019, discrete version): the Q-values restricted to legal actions whose
  imitator probability is at least ``action_flexibility`` times that of the most likely *legal* action.
* DQN (Mnih et al. 2015), DoubleDQN (van Hasselt et al. 2016): the Q-values, no conservatism (the
  baselines that show what CQL's penalty buys on logs this small).
* CQL (Kumar et al. 2020): the Q-values.

The same holds for the DoubleDQN and CQL bootstrap target: d3rlpy's DoubleDQN target takes the argmax over *all*
next actions, and actions that are never legal (never in the data) then inflate the values they are
bootstrapped into. With ``masked_targets`` (default) the target's next action is the best legal one,
the mask read off the next observation (``ConductorDataset.legal_mask``).

FQE (Le et al. 2019) evaluates the same masked greedy policy: its target network asks the policy for
``a' = π(s')`` on logged next-observations, and the mask there is recovered from the observation
itself (``ObservationEncoder.legal_mask``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from envs.config import TeamEnvConfig
from envs.observation import ObservationEncoder
from policies.base import PolicyError
from policies.learning import train_state
from policies.learning.checkpoint import ConductorMeta, open_checkpoint
from policies.learning.dataset import ConductorDataset, DatasetFilter, FeatureSet, Truncation, feature_columns
from trajectories.rundir import CONFIG_FILE, MetricsWriter, atomic_path, check_config, same_config, write_config

D3RLPY_ALGOS = ("bc", "fbc", "dqn", "ddqn", "bcq", "cql")
Q_ALGOS = ("dqn", "ddqn", "cql")  # act by argmax of the Q-function alone
# a checkpoint's weights (torch state dicts, read back with weights_only=True) and its algorithm (d3rlpy's own JSON
# of the config and shapes): d3rlpy's model.d3 pickles both, and loading a pickle runs code (docs/robustness.md)
MODEL_FILE = "model.pt"
ALGO_FILE = "algo.json"


@dataclass
class OfflineConfig:
    """Every knob of an offline training run (written into the run directory and checkpoint)."""

    # bc | fbc (filtered BC: successful episodes only) | dqn | ddqn (DoubleDQN; no conservatism) | bcq | cql
    algo: str = "cql"
    n_steps: int = 4000  # gradient steps
    n_steps_per_epoch: int = 500  # steps between metric rows and checkpoints
    batch_size: int = 64  # minibatch size
    learning_rate: float = 3e-4  # Adam step size
    hidden_units: tuple[int, ...] = (128, 128)  # MLP encoder widths
    gamma: float = 0.99  # discount (episodes last a handful of decisions)
    target_update_interval: int = 200  # steps between target-network syncs (DQN, DoubleDQN, BCQ, CQL)
    cql_alpha: float = 1.0  # CQL conservatism weight (logsumexp Q − Q(s, a_data))
    n_critics: int = 1  # Q-network ensemble size (DQN, DoubleDQN, BCQ, CQL); targets take the ensemble minimum
    bcq_action_flexibility: float = 0.3  # BCQ: keep actions with p(a|s) ≥ this × max_a p(a|s)
    bc_beta: float = 0.5  # BC / BCQ imitator logit-norm regulariser (d3rlpy's beta)
    fbc_min_return: float | None = None  # filtered BC: also keep episodes with at least this return
    truncation: Truncation = "terminal"  # spent turn budget: terminal (default) or bootstrap
    # DoubleDQN, CQL: bootstrap from the best *legal* next action (module doc). DQN's target is d3rlpy's
    # max over all actions of the target network, with no hook to mask it: plain DQN, unmasked
    masked_targets: bool = True
    features: FeatureSet = "structural"  # observation columns the network sees: structural | all
    seed: int = 0  # torch / numpy / d3rlpy seed
    keep_epochs: bool = False  # also keep every epoch's checkpoint in epochs/N/ (policies for OPE model selection)
    torch_threads: int = 1  # small MLPs: one thread is many times faster than two on a busy 2-core box

    def __post_init__(self) -> None:
        if self.algo not in D3RLPY_ALGOS:
            raise PolicyError(f"algo: expected one of {', '.join(D3RLPY_ALGOS)}, got {self.algo!r}")
        if self.n_steps < 1 or self.n_steps_per_epoch < 1:
            raise PolicyError("n_steps and n_steps_per_epoch must be positive")
        self.hidden_units = tuple(int(h) for h in self.hidden_units)


def quiet_d3rlpy() -> None:
    """d3rlpy logs every epoch through structlog at INFO; keep warnings and errors only."""
    import logging

    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))


def make_algo(cfg: OfflineConfig) -> Any:
    """The d3rlpy algorithm object of a config (CPU)."""
    import d3rlpy

    quiet_d3rlpy()
    from d3rlpy.models.encoders import VectorEncoderFactory

    enc = VectorEncoderFactory(hidden_units=list(cfg.hidden_units))
    base: dict[str, Any] = {"batch_size": cfg.batch_size, "learning_rate": cfg.learning_rate, "encoder_factory": enc}
    if cfg.algo in ("bc", "fbc"):
        return d3rlpy.algos.DiscreteBCConfig(**base, beta=cfg.bc_beta).create(device=False)
    # the value-based learners share the Q-learning knobs
    q = {**base, "gamma": cfg.gamma, "n_critics": cfg.n_critics, "target_update_interval": cfg.target_update_interval}
    if cfg.algo == "bcq":
        return d3rlpy.algos.DiscreteBCQConfig(
            **q, action_flexibility=cfg.bcq_action_flexibility, beta=cfg.bc_beta
        ).create(device=False)
    if cfg.algo == "dqn":
        return d3rlpy.algos.DQNConfig(**q).create(device=False)
    if cfg.algo == "ddqn":
        return d3rlpy.algos.DoubleDQNConfig(**q).create(device=False)
    return d3rlpy.algos.DiscreteCQLConfig(**q, alpha=cfg.cql_alpha).create(device=False)


def masked_argmax(scores: np.ndarray, masks: np.ndarray) -> np.ndarray:
    """argmax over legal actions per row; a row with no legal action falls back to the last id."""
    s = np.where(masks.astype(bool), scores, -np.inf)
    out = s.argmax(axis=1)
    none = ~masks.astype(bool).any(axis=1)
    out[none] = scores.shape[1] - 1
    return out.astype(np.int64)


def action_scores(algo: Any, kind: str, observations: np.ndarray, masks: np.ndarray) -> np.ndarray:
    """Per-action scores (B, A) of a trained d3rlpy algorithm, illegal actions at ``-inf``.

    Reads the algorithm's own torch modules (d3rlpy 2.8): the imitator of BC/BCQ, the Q-function
    forwarder of BCQ/CQL.
    """
    import torch
    import torch.nn.functional as F

    impl = algo.impl
    if impl is None:
        raise PolicyError("the algorithm is not built yet (train or load it first)")
    legal = torch.as_tensor(np.asarray(masks, dtype=bool))
    with torch.no_grad():
        x = torch.as_tensor(np.asarray(observations, dtype=np.float32))
        if kind in ("bc", "fbc"):
            scores = F.log_softmax(impl._modules.imitator(x).logits, dim=1)
        elif kind == "bcq":
            q = impl._q_func_forwarder.compute_expected_q(x)
            logp = F.log_softmax(impl._modules.imitator(x).logits, dim=1)
            logp = logp.masked_fill(~legal, -math.inf)
            best = logp.max(dim=1, keepdim=True).values
            keep = (logp - best) >= math.log(algo.config.action_flexibility)
            scores = q.masked_fill(~keep, -math.inf)
        elif kind in Q_ALGOS:
            scores = impl._q_func_forwarder.compute_expected_q(x)
        else:
            raise PolicyError(f"unknown algo {kind!r}")
        scores = scores.masked_fill(~legal, -math.inf)
    return scores.cpu().numpy()


class OfflineConductor:
    """A d3rlpy-trained conductor: masked greedy decisions, deterministic, stateless."""

    def __init__(self, algo: Any, meta: ConductorMeta, name: str | None = None) -> None:
        self.algo, self.meta = algo, meta
        self.name = name or meta.algo
        self.checkpoint: str | None = None
        self.columns = np.asarray(feature_columns(meta.feature_names, meta.config.get("features", "all")))

    def reset(self, seed: int | None = None) -> None:
        """Stateless: nothing to reset."""

    def scores(self, observations: np.ndarray, masks: np.ndarray) -> np.ndarray:
        """(B, A) scores; ``observations`` are full encoder vectors or already the trained columns."""
        x = np.atleast_2d(observations)
        if x.shape[1] == len(self.meta.feature_names) and len(self.columns) != x.shape[1]:
            x = x[:, self.columns]
        return action_scores(self.algo, self.meta.algo, x, np.atleast_2d(masks))

    def predict(self, observations: np.ndarray, masks: np.ndarray) -> np.ndarray:
        """Batched masked decisions (B,)."""
        masks = np.atleast_2d(masks)
        return masked_argmax(self.scores(observations, masks), masks)

    def act(self, obs: np.ndarray, action_mask: np.ndarray, state: Mapping[str, Any] | None = None) -> int:
        if not np.asarray(action_mask).any():
            raise PolicyError("no legal action: the env offered an all-zero action mask")
        return int(self.predict(np.asarray(obs, dtype=np.float32)[None], np.asarray(action_mask)[None])[0])

    def save(self, folder: str | Path) -> Path:
        folder = Path(folder)
        from d3rlpy.base import LearnableConfigWithShape

        folder.mkdir(parents=True, exist_ok=True)
        impl = self.algo.impl
        spec = LearnableConfigWithShape(
            observation_shape=impl.observation_shape, action_size=impl.action_size, config=self.algo.config
        )
        with atomic_path(folder / ALGO_FILE, "conductor algorithm") as tmp:  # a full disk keeps the old one whole
            tmp.write_text(spec.serialize(), encoding="utf-8")
        with atomic_path(folder / MODEL_FILE, "conductor model") as tmp:
            self.algo.save_model(str(tmp))
        self.meta.save(folder)
        return folder

    @classmethod
    def load(
        cls, folder: str | Path, config: TeamEnvConfig, encoder: ObservationEncoder, name: str | None = None
    ) -> OfflineConductor:
        import torch
        from d3rlpy.base import LearnableConfigWithShape

        folder = Path(folder)
        meta, path = open_checkpoint(folder, config, encoder, MODEL_FILE, D3RLPY_ALGOS)
        try:
            spec = LearnableConfigWithShape.deserialize((folder / ALGO_FILE).read_text(encoding="utf-8"))
            algo = spec.create(device=False)
            state = torch.load(path, map_location="cpu", weights_only=True)  # tensors and numbers only: no pickle
            for key, module in algo.impl.modules.create_checkpointer("cpu:0").modules.items():
                module.load_state_dict(state[key])
        except Exception as e:  # d3rlpy and torch raise bare exceptions on a foreign or damaged file
            raise PolicyError(f"{folder}: cannot load the d3rlpy model ({type(e).__name__}: {e})") from e
        c = cls(algo, meta, name=name)
        c.checkpoint = str(folder)
        return c


def mask_target_actions(algo: Any, mask_fn: Callable[[np.ndarray], np.ndarray]) -> None:
    """Make a built DiscreteCQL pick its bootstrap action among legal ones only.

    DoubleDQN's target (d3rlpy ``DoubleDQNImpl.compute_target``) evaluates the target network at
    ``argmax_a Q(s', a)`` computed by ``inner_predict_best_action``; that one method is replaced on
    this instance by a masked argmax. Saved models are unaffected (decisions are masked anyway)."""
    import torch

    impl = algo.impl
    unmasked = impl.inner_predict_best_action

    def masked(x: Any) -> Any:
        q = impl._q_func_forwarder.compute_expected_q(x)
        legal = torch.as_tensor(mask_fn(x.detach().cpu().numpy()).astype(bool), device=q.device)
        best = q.masked_fill(~legal, -math.inf).argmax(dim=1)
        none = ~legal.any(dim=1)  # no legal action: an end state whose value is never used
        return torch.where(none, unmasked(x), best)

    impl.inner_predict_best_action = masked


@dataclass
class TrainResult:
    conductor: OfflineConductor
    run_dir: Path
    metrics: list[dict[str, Any]] = field(default_factory=list)  # one row per epoch


def agreement(conductor: OfflineConductor, ds: ConductorDataset) -> float:
    """Share of dataset decisions the conductor reproduces (masked)."""
    if len(ds) == 0:
        return float("nan")
    return float(np.mean(conductor.predict(ds.observations, ds.masks) == ds.actions))


def training_data(ds: ConductorDataset, cfg: OfflineConfig) -> ConductorDataset:
    """Filtered BC trains on successful (or high-return) episodes only; the rest use everything."""
    if cfg.algo != "fbc":
        return ds
    flt = DatasetFilter(success_only=cfg.fbc_min_return is None, min_return=cfg.fbc_min_return)
    keep = [i for i, e in enumerate(ds.episodes) if flt.keep_info(e)]
    if not keep:
        raise PolicyError("filtered BC: no episode of the dataset is successful (or above fbc_min_return)")
    return ds.subset(keep)


def train_offline(
    ds: ConductorDataset,
    cfg: OfflineConfig,
    out_dir: str | Path,
    *,
    progress: bool = False,
    on_epoch: Callable[[dict[str, Any]], None] | None = None,
    resume: bool | Literal["if_same"] = False,
    tensorboard: bool = False,
) -> TrainResult:
    """Train one d3rlpy algorithm; checkpoint every epoch into ``out_dir`` (conductor.json, algo.json, model.pt),
    write ``metrics.csv`` / ``metrics.jsonl`` (losses and dataset agreement per epoch; with ``tensorboard`` also
    event files in ``tensorboard/metrics/``) and ``config.json``. Repeats exactly on CPU for a given ``cfg.seed``.

    Every epoch also leaves the full training state in ``out_dir/resume/`` (:mod:`policies.learning.train_state`);
    ``resume=True`` continues a killed run from its last finished epoch, bit-identical to an uninterrupted run
    (the same config and dataset are required; with no saved state it starts from scratch). ``resume="if_same"``
    resumes (or, when every epoch is done, reuses) a run of the same config and dataset digest and trains from
    scratch otherwise: what a long multi-model job such as phase 1 passes, so a rerun redoes no finished model."""
    import d3rlpy
    import torch
    from d3rlpy.logging import NoopAdapterFactory

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    data = training_data(ds, cfg).select_features(cfg.features)
    d3rlpy.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    threads = torch.get_num_threads()
    torch.set_num_threads(cfg.torch_threads)
    algo = make_algo(cfg)
    meta = ConductorMeta(
        algo=cfg.algo,
        team=ds.team,
        embedder=ds.embedder,
        feature_names=ds.feature_names,
        action_labels=ds.action_labels,
        config=asdict(cfg),
        dataset={k: v for k, v in data.summary().items() if k != "sources"} | {"sources": ds.sources},
    )
    run_config = {"offline": asdict(cfg), "dataset": meta.dataset}
    if resume == "if_same" and not same_config(out / CONFIG_FILE, run_config):
        resume = False
    if resume and (out / CONFIG_FILE).exists():
        check_config(out / CONFIG_FILE, run_config)
    else:
        train_state.clear_state(out)
        write_config(out, run_config)
    conductor = OfflineConductor(algo, meta)
    mdp = data.to_mdp(cfg.truncation)
    algo.build_with_dataset(mdp)  # built here, not inside fit, so a resumed run can load its state first
    if cfg.algo in ("ddqn", "cql") and cfg.masked_targets:
        mask_target_actions(algo, data.legal_mask)
    saved = train_state.load_state(out) if resume else None  # restores the RNGs as they were after that epoch
    done = saved.epoch if saved is not None else 0
    rows: list[dict[str, Any]] = list(saved.rows) if saved is not None else []
    if saved is not None:
        train_state.restore_modules(algo, saved)
    metrics = MetricsWriter(out, rows=rows, tensorboard=tensorboard)  # holds exactly the epochs kept
    n_epochs = cfg.n_steps // cfg.n_steps_per_epoch
    try:
        if n_epochs > done:
            fitter = algo.fitter(
                mdp,
                n_steps=(n_epochs - done) * cfg.n_steps_per_epoch,
                n_steps_per_epoch=cfg.n_steps_per_epoch,
                logger_adapter=NoopAdapterFactory(),
                show_progress=progress,
            )
            for fit_epoch, losses in fitter:  # d3rlpy counts the epochs of this call from 1
                epoch = done + fit_epoch
                row: dict[str, Any] = {"epoch": epoch, "step": epoch * cfg.n_steps_per_epoch}
                row.update({f"losses/{k}": float(v) for k, v in losses.items()})
                row["perf/agreement"] = agreement(conductor, ds)  # with the logged actions
                rows.append(row)
                metrics.append([row])
                conductor.save(out)  # checkpoint each epoch: a killed run keeps its last epoch
                if cfg.keep_epochs:
                    conductor.save(out / "epochs" / str(epoch))
                train_state.save_state(out, algo, epoch, rows)  # last: the RNGs as the next epoch finds them
    finally:
        torch.set_num_threads(threads)
        metrics.close()
    for r in rows:
        if on_epoch is not None:
            on_epoch(r)
    conductor.save(out)
    conductor.checkpoint = str(out)
    return TrainResult(conductor, out, rows)


# -- off-policy evaluation ---------------------------------------------------------------------------


@dataclass
class FQEConfig:
    """Fitted Q Evaluation (d3rlpy DiscreteFQE) of a policy from logged data alone."""

    n_steps: int = 2000  # gradient steps
    n_steps_per_epoch: int = 500
    batch_size: int = 64
    learning_rate: float = 3e-4
    hidden_units: tuple[int, ...] = (128, 128)
    gamma: float = 1.0  # 1.0: the undiscounted episode return, comparable with measured returns
    target_update_interval: int = 100  # steps between target-network syncs
    truncation: Truncation = "terminal"  # as in OfflineConfig
    features: FeatureSet = "structural"  # observation columns FQE's Q-network sees (as in OfflineConfig)
    seed: int = 0
    torch_threads: int = 1  # as in OfflineConfig


PolicyFn = Callable[[np.ndarray, np.ndarray], np.ndarray]  # (obs (B,D), masks (B,A)) -> actions (B,)


class _MaskedPolicyImpl:
    """What DiscreteFQE needs of the evaluated algorithm: ``impl.predict_best_action(x)``.

    d3rlpy calls it on logged next-observations; the legal mask is read off the observation."""

    def __init__(self, policy: PolicyFn, mask_fn: Callable[[np.ndarray], np.ndarray]) -> None:
        self._policy, self._mask_fn = policy, mask_fn

    def predict_best_action(self, x: Any) -> Any:
        import torch

        obs = x.detach().cpu().numpy()
        a = self._policy(obs, self._mask_fn(obs))
        return torch.as_tensor(np.asarray(a, dtype=np.int64), device=x.device)


class _PolicyAlgo:
    def __init__(self, impl: _MaskedPolicyImpl) -> None:
        self.impl = impl


@dataclass
class FQEResult:
    estimate: float  # mean estimated value of the initial states (FQE, discounted by gamma)
    behaviour_return: float  # mean discounted return of the logged episodes (what the data did)
    episodes: int
    metrics: list[dict[str, Any]]


def discounted_returns(ds: ConductorDataset, gamma: float) -> np.ndarray:
    """Discounted return of each logged episode (E,)."""
    out = np.zeros(len(ds.episodes))
    for e in range(len(ds.episodes)):
        r = ds.rewards[ds.episode_index == e]
        out[e] = float(np.sum(r * gamma ** np.arange(r.size)))
    return out


def fqe_evaluate(
    policy: PolicyFn,
    ds: ConductorDataset,
    mask_fn: Callable[[np.ndarray], np.ndarray],
    cfg: FQEConfig | None = None,
    progress: bool = False,
    initial: tuple[np.ndarray, np.ndarray] | None = None,
) -> FQEResult:
    """Estimate the value of ``policy`` from the logged data ``ds`` with d3rlpy's DiscreteFQE.

    ``mask_fn`` maps observations to legal masks (``ObservationEncoder.legal_mask``). The estimate is
    the mean of ``Q_fqe(s0, π(s0))`` over the logged initial states, or over ``initial`` = (observations,
    masks) in the full feature layout: the initial states of the tasks the policy's return is measured
    on, so that estimate and measurement share one initial-state distribution."""
    import d3rlpy
    import torch
    from d3rlpy.logging import NoopAdapterFactory
    from d3rlpy.models.encoders import VectorEncoderFactory
    from d3rlpy.ope import DiscreteFQE
    from d3rlpy.ope import FQEConfig as D3FQEConfig

    cfg = cfg or FQEConfig()
    full = ds
    asked = policy
    ds = ds.select_features(cfg.features)
    cols = np.asarray(feature_columns(full.feature_names, cfg.features))
    if len(cols) != len(full.feature_names):
        # FQE's Q-network sees the subset; the policy is asked on the full logged rows they came from
        rows = np.concatenate([full.observations, full.final_observations])
        full_row = {r[cols].tobytes(): r for r in rows}
        inner = policy

        def policy(obs: np.ndarray, masks: np.ndarray) -> np.ndarray:
            x = np.stack(
                [full_row.get(o.astype(np.float32).tobytes(), np.zeros(rows.shape[1], np.float32)) for o in obs]
            )
            return inner(x, masks)

        mask_fn = ds.legal_mask
    quiet_d3rlpy()
    d3rlpy.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    threads = torch.get_num_threads()
    torch.set_num_threads(cfg.torch_threads)
    impl = _MaskedPolicyImpl(policy, mask_fn)
    fqe = DiscreteFQE(
        algo=_PolicyAlgo(impl),  # duck-typed: DiscreteFQE only reads .impl
        config=D3FQEConfig(
            learning_rate=cfg.learning_rate,
            batch_size=cfg.batch_size,
            gamma=cfg.gamma,
            target_update_interval=cfg.target_update_interval,
            encoder_factory=VectorEncoderFactory(hidden_units=list(cfg.hidden_units)),
        ),
        device=False,
    )
    try:
        history = fqe.fit(
            ds.to_mdp(cfg.truncation),
            n_steps=cfg.n_steps,
            n_steps_per_epoch=cfg.n_steps_per_epoch,
            logger_adapter=NoopAdapterFactory(),
            show_progress=progress,
        )
    finally:
        torch.set_num_threads(threads)
    if initial is not None:
        s0_full, m0 = np.atleast_2d(np.asarray(initial[0], np.float32)), np.atleast_2d(initial[1])
        a0 = np.asarray(asked(s0_full, m0), dtype=np.int64)
        s0 = s0_full[:, cols]
    else:
        first = np.array([np.flatnonzero(ds.episode_index == e)[0] for e in range(len(ds.episodes))])
        s0, m0 = ds.observations[first], ds.masks[first]
        a0 = np.asarray(policy(s0, m0), dtype=np.int64)
    values = fqe.predict_value(s0, a0)
    metrics = [{"epoch": ep, **{f"losses/{k}": float(v) for k, v in d.items()}} for ep, d in history]
    return FQEResult(
        estimate=float(np.mean(values)),
        behaviour_return=float(np.mean(discounted_returns(ds, cfg.gamma))),
        episodes=len(ds.episodes),
        metrics=metrics,
    )


def conductor_policy_fn(conductor: OfflineConductor) -> PolicyFn:
    return conductor.predict


__all__ = [
    "D3RLPY_ALGOS",
    "FQEConfig",
    "FQEResult",
    "OfflineConductor",
    "OfflineConfig",
    "TrainResult",
    "action_scores",
    "agreement",
    "discounted_returns",
    "fqe_evaluate",
    "make_algo",
    "masked_argmax",
    "train_offline",
]
