"""Offline datasets for the conductor, built from recorded trajectories (docs/architecture.md §4).

Every conductor decision of every kept episode becomes one row: the stored structured state is
re-encoded with the *current* observation encoder (so the encoder can change without re-recording),
the reward is re-scalarised from the stored named reward vector with weights chosen now, and episode
boundaries are kept with terminal and timeout apart.

Conversion to d3rlpy (``ConductorDataset.to_mdp``) follows d3rlpy's own convention:

* a terminated episode ends with ``terminals = 1`` on its last decision (next value 0);
* a truncated episode (turn budget spent) gets one extra row holding the *final observation* with
  ``timeouts = 1``; d3rlpy never samples that row as a transition, only uses it as the last
  ``next_observation``. A step both terminated and truncated counts as terminated.
* ``truncation="terminal"`` (the default) treats a spent turn budget as the end it is in this env:
  the observation carries the turns left, so running out of them is a state of the task, not an
  artificial cut (Pardo et al. 2018, "Time limits in reinforcement learning"); no bootstrap from the
  final state, in which no action is legal.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np

from envs.config import REWARD_COMPONENTS, TeamEnvConfig
from envs.observation import ObservationEncoder
from policies.learning.checkpoint import LayoutError, check_same_embedder, check_same_layout, team_layout
from trajectories import Episode, read_trajectories
from trajectories.rundir import atomic_path

Truncation = Literal["terminal", "bootstrap"]
FeatureSet = Literal["structural", "all"]


def feature_columns(feature_names: Sequence[str], which: FeatureSet) -> list[int]:
    """Column indices of a feature set: ``all``, or ``structural`` (every feature but the sentence
    embeddings ``emb_*``: 768 embedding dims drown a few hundred episodes, and rules over them are
    unreadable)."""
    if which == "all":
        return list(range(len(feature_names)))
    if which == "structural":
        return [i for i, n in enumerate(feature_names) if not n.startswith("emb_")]
    raise DatasetError(f"features: expected 'structural' or 'all', got {which!r}")


class DatasetError(ValueError):
    """The trajectories cannot make a dataset (empty, damaged, other layout, bad action)."""


@dataclass(frozen=True)
class DatasetFilter:
    """Which episodes to keep (an empty tuple keeps all)."""

    families: tuple[str, ...] = ()  # task families
    splits: tuple[str, ...] = ()  # train / test
    conductors: tuple[str, ...] = ()  # source conductor names (as recorded)
    success_only: bool = False  # keep only solved episodes (filtered BC)
    min_return: float | None = None  # keep episodes whose re-scalarised return is at least this
    include_errors: bool = False  # keep episodes a backend fault ended (Episode.error); their last step is cut off

    def keep(self, e: Episode, ret: float) -> bool:
        return (
            (self.include_errors or e.error is None)
            and (not self.families or e.task.family in self.families)
            and (not self.splits or e.task.split in self.splits)
            and (not self.conductors or e.conductor.name in self.conductors)
            and (not self.success_only or e.success)
            and (self.min_return is None or ret >= self.min_return)
        )

    def keep_info(self, e: EpisodeInfo) -> bool:
        """The same test on a dataset's episode summary."""
        return (
            (not self.families or e.family in self.families)
            and (not self.splits or e.split in self.splits)
            and (not self.conductors or e.conductor in self.conductors)
            and (not self.success_only or e.success)
            and (self.min_return is None or e.return_ >= self.min_return)
        )


@dataclass(frozen=True)
class EpisodeInfo:
    episode_id: str
    conductor: str
    family: str
    split: str
    task_id: str
    success: bool
    return_: float
    truncated: bool
    length: int  # conductor decisions


@dataclass
class ConductorDataset:
    """Conductor decisions of many episodes as arrays (row i = one decision; N rows, E episodes)."""

    observations: np.ndarray  # (N, D) float32, re-encoded from the stored state
    actions: np.ndarray  # (N,) int64 action ids
    rewards: np.ndarray  # (N,) float32, scalarised with ``weights``
    terminals: np.ndarray  # (N,) float32: 1 on the last decision of a terminated episode
    timeouts: np.ndarray  # (N,) float32: 1 on the last decision of a truncated episode
    masks: np.ndarray  # (N, A) int8, the action mask the conductor saw
    episode_index: np.ndarray  # (N,) int64 into ``episodes``
    final_observations: np.ndarray  # (E, D) float32: observation after the last decision
    episodes: list[EpisodeInfo]
    states: list[dict[str, Any]]  # (N,) the structured states (rule-based conductors read these)
    feature_names: list[str]
    action_labels: list[str]
    weights: dict[str, float]  # reward scalarisation used for ``rewards``
    team: str
    embedder: str
    sources: list[str] = field(default_factory=list)  # files read
    # the team's action preconditions, per action id: "" none, "message" or "candidate" (team file
    # ``requires``); empty when unknown (datasets saved before they existed): no preconditions
    action_requires: list[str] = field(default_factory=list)
    give_up: bool = False  # the team lets submit end an episode before any candidate exists
    # per row, the conductor's own instruction text when it wrote one (``envs.Instruct``: a human expert's, an
    # instruction-writing LLM's), else None; ``actions`` holds the nearest declared instruction's id either way.
    # Empty = none in the data (datasets saved before this field existed, too)
    instruction_texts: list[str | None] = field(default_factory=list)
    instruction_similarity: list[float | None] = field(default_factory=list)

    # -- shape -----------------------------------------------------------------------------------
    @property
    def num_actions(self) -> int:
        return len(self.action_labels)

    def __len__(self) -> int:
        return int(self.actions.shape[0])

    def subset(self, episode_ids: Iterable[int]) -> ConductorDataset:
        """The rows of the given episode indices (renumbered), e.g. a held-out split."""
        keep = sorted(set(episode_ids))
        remap = {old: new for new, old in enumerate(keep)}
        rows = np.flatnonzero(np.isin(self.episode_index, keep))
        return ConductorDataset(
            observations=self.observations[rows],
            actions=self.actions[rows],
            rewards=self.rewards[rows],
            terminals=self.terminals[rows],
            timeouts=self.timeouts[rows],
            masks=self.masks[rows],
            episode_index=np.array([remap[int(i)] for i in self.episode_index[rows]], dtype=np.int64),
            final_observations=self.final_observations[keep],
            episodes=[self.episodes[i] for i in keep],
            states=[self.states[int(r)] for r in rows],
            feature_names=self.feature_names,
            action_labels=self.action_labels,
            weights=self.weights,
            team=self.team,
            embedder=self.embedder,
            sources=self.sources,
            action_requires=self.action_requires,
            give_up=self.give_up,
            instruction_texts=[self.instruction_texts[int(r)] for r in rows] if self.instruction_texts else [],
            instruction_similarity=[self.instruction_similarity[int(r)] for r in rows]
            if self.instruction_texts
            else [],
        )

    def select_features(self, which: FeatureSet) -> ConductorDataset:
        """The same rows with only some observation columns (``structural``: no sentence embeddings)."""
        cols = feature_columns(self.feature_names, which)
        if len(cols) == len(self.feature_names):
            return self
        return replace(
            self,
            observations=self.observations[:, cols],
            final_observations=self.final_observations[:, cols],
            feature_names=[self.feature_names[i] for i in cols],
        )

    def legal_mask(self, observations: np.ndarray) -> np.ndarray:
        """Action masks recovered from observations, as ``ObservationEncoder.legal_mask`` does, without
        the team: worker actions need turns left and their precondition (``action_requires``), submit a
        candidate unless the team allows giving up; an action never legal anywhere in the data (an
        instruction its worker does not take) stays illegal."""
        obs = np.atleast_2d(np.asarray(observations, dtype=np.float32))
        turns_left_frac = obs[:, self.feature_names.index("turns_left_frac")]
        has_cand = obs[:, self.feature_names.index("has_candidate")] > 0.5
        met = {"": np.ones(obs.shape[0], bool), "candidate": has_cand, "message": turns_left_frac < 1.0 - 1e-6}
        declared = np.asarray(self.masks.any(axis=0) if len(self) else np.ones(self.num_actions), dtype=bool)
        mask = np.zeros((obs.shape[0], self.num_actions), dtype=np.int8)
        mask[:, :-1] = (turns_left_frac > 1e-6)[:, None] & declared[None, :-1]
        for a, req in enumerate(self.action_requires[:-1]):
            mask[:, a] *= met[req]
        mask[:, -1] = has_cand | self.give_up
        return mask

    def split_episodes(self, heldout_frac: float, seed: int = 0) -> tuple[ConductorDataset, ConductorDataset]:
        """(train, held-out) by whole episodes, shuffled with ``seed``."""
        n = len(self.episodes)
        order = np.random.default_rng(seed).permutation(n)
        k = int(round(n * heldout_frac))
        if n >= 2:
            k = min(max(k, 1), n - 1)
        return self.subset(order[k:].tolist()), self.subset(order[:k].tolist())

    # -- d3rlpy ------------------------------------------------------------------------------------
    def to_mdp(self, truncation: Truncation = "terminal") -> Any:
        """A d3rlpy ``MDPDataset`` (discrete actions) with episode boundaries kept (see module doc)."""
        from d3rlpy.constants import ActionSpace
        from d3rlpy.dataset import MDPDataset

        arrays = self.mdp_arrays(truncation)
        return MDPDataset(
            observations=arrays["observations"],
            actions=arrays["actions"],
            rewards=arrays["rewards"],
            terminals=arrays["terminals"],
            timeouts=arrays["timeouts"],
            action_space=ActionSpace.DISCRETE,
            action_size=self.num_actions,
        )

    def mdp_arrays(self, truncation: Truncation = "terminal") -> dict[str, np.ndarray]:
        """The flat arrays ``to_mdp`` hands to d3rlpy (final-observation rows inserted)."""
        if truncation not in ("terminal", "bootstrap"):
            raise DatasetError(f"truncation: expected 'terminal' or 'bootstrap', got {truncation!r}")
        obs, act, rew, term, tout = [], [], [], [], []
        for e in range(len(self.episodes)):
            rows = np.flatnonzero(self.episode_index == e)
            if rows.size == 0:
                continue
            obs.append(self.observations[rows])
            act.append(self.actions[rows])
            rew.append(self.rewards[rows])
            t = self.terminals[rows].copy()
            o = np.zeros_like(t)
            last_timeout = bool(self.timeouts[rows[-1]]) and not bool(t[-1])
            if last_timeout and truncation == "bootstrap":
                # the final observation as one extra row: only ever a next_observation
                obs.append(self.final_observations[e][None])
                act.append(np.array([self.num_actions - 1], dtype=np.int64))
                rew.append(np.zeros(1, dtype=np.float32))
                term.append(t)
                tout.append(o)
                t, o = np.zeros(1, np.float32), np.ones(1, np.float32)
            elif last_timeout:
                t[-1] = 1.0
            elif not t[-1]:  # neither ended nor cut: the episode was not finished when recorded
                o[-1] = 1.0
            term.append(t)
            tout.append(o)
        if not obs:
            raise DatasetError("the dataset has no transitions")
        return {
            "observations": np.concatenate(obs).astype(np.float32),
            "actions": np.concatenate(act).astype(np.int64),
            "rewards": np.concatenate(rew).astype(np.float32),
            "terminals": np.concatenate(term).astype(np.float32),
            "timeouts": np.concatenate(tout).astype(np.float32),
        }

    # -- summary -------------------------------------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        """Episodes, transitions, action histogram, and returns per source conductor."""
        hist = Counter(int(a) for a in self.actions)
        by_cond: dict[str, list[EpisodeInfo]] = defaultdict(list)
        for info in self.episodes:
            by_cond[info.conductor].append(info)
        per_conductor = {}
        for name, infos in sorted(by_cond.items()):
            r = np.array([i.return_ for i in infos], dtype=np.float64)
            per_conductor[name] = {
                "episodes": len(infos),
                "success_rate": round(float(np.mean([i.success for i in infos])), 4),
                "return_mean": round(float(r.mean()), 4),
                "return_std": round(float(r.std()), 4),
                "return_min": round(float(r.min()), 4),
                "return_p50": round(float(np.median(r)), 4),
                "return_max": round(float(r.max()), 4),
            }
        own = [
            {
                "text": text,
                "action": int(self.actions[i]),
                "label": self.action_labels[int(self.actions[i])],
                "similarity": self.instruction_similarity[i],
            }
            for i, text in enumerate(self.instruction_texts)
            if text is not None
        ]
        return {
            "team": self.team,
            "episodes": len(self.episodes),
            "transitions": len(self),
            "observation_size": int(self.observations.shape[1]) if self.observations.ndim == 2 else 0,
            "num_actions": self.num_actions,
            "families": dict(Counter(i.family for i in self.episodes)),
            "success_rate": round(float(np.mean([i.success for i in self.episodes])), 4) if self.episodes else 0.0,
            "truncated_episodes": sum(i.truncated for i in self.episodes),
            "action_histogram": {self.action_labels[a]: hist.get(a, 0) for a in range(self.num_actions)},
            "per_conductor": per_conductor,
            "own_instructions": own,
            "weights": self.weights,
            "sources": self.sources,
            "digest": self.digest(),
        }

    def digest(self) -> str:
        """sha256 of the arrays a learner trains on (observations, actions, rewards, ends, masks): a run that
        reuses a trained model checks with it that the dataset is the one the model was trained on."""
        h = hashlib.sha256()
        for a in (
            self.observations,
            self.actions,
            self.rewards,
            self.terminals,
            self.timeouts,
            self.masks,
            self.episode_index,
            self.final_observations,
        ):
            h.update(np.ascontiguousarray(a).tobytes())
        return h.hexdigest()

    # -- persistence -----------------------------------------------------------------------------------
    def save(self, path: str | Path) -> Path:
        """``.npz`` arrays plus a JSON header (layout, weights, episodes, states)."""
        path = Path(path)
        if path.suffix != ".npz":
            path = path.with_suffix(".npz")
        path.parent.mkdir(parents=True, exist_ok=True)
        header = {
            "format": "orchestra-dataset/1",
            "feature_names": self.feature_names,
            "action_labels": self.action_labels,
            "weights": self.weights,
            "team": self.team,
            "embedder": self.embedder,
            "sources": self.sources,
            "action_requires": self.action_requires,
            "give_up": self.give_up,
            "instruction_texts": self.instruction_texts,
            "instruction_similarity": self.instruction_similarity,
            "episodes": [asdict(i) for i in self.episodes],
            "states": self.states,
        }
        with atomic_path(path, "dataset") as tmp, tmp.open("wb") as f:  # a full disk leaves no half-written .npz
            np.savez_compressed(
                f,
                observations=self.observations,
                actions=self.actions,
                rewards=self.rewards,
                terminals=self.terminals,
                timeouts=self.timeouts,
                masks=self.masks,
                episode_index=self.episode_index,
                final_observations=self.final_observations,
                header=np.frombuffer(json.dumps(header).encode(), dtype=np.uint8),
            )
        return path

    @classmethod
    def load(cls, path: str | Path) -> ConductorDataset:
        path = Path(path)
        if not path.exists():
            raise DatasetError(f"{path}: no such dataset file (build one with `orchestra dataset build`)")
        with path.open("rb") as f:
            if f.read(4) != b"PK\x03\x04":  # not a zip archive: numpy would take it for a pickle and say so
                raise DatasetError(f"{path}: not an orchestra dataset (not a .npz archive)")
        try:
            with np.load(path, allow_pickle=False) as z:
                header = json.loads(bytes(z["header"]).decode())
                arrays = {k: z[k] for k in z.files if k != "header"}
        except Exception as e:  # noqa: BLE001 - whatever the zip / .npy parsers raise on a damaged file
            raise DatasetError(f"{path}: not an orchestra dataset ({type(e).__name__}: {e})") from e
        if not isinstance(header, dict) or header.get("format") != "orchestra-dataset/1":
            got = header.get("format") if isinstance(header, dict) else type(header).__name__
            raise DatasetError(f"{path}: format {got!r}, expected 'orchestra-dataset/1'")
        try:
            ds = cls(
                **arrays,
                episodes=[EpisodeInfo(**i) for i in header["episodes"]],
                states=header["states"],
                feature_names=header["feature_names"],
                action_labels=header["action_labels"],
                weights=header["weights"],
                team=header["team"],
                embedder=header["embedder"],
                sources=header["sources"],
                action_requires=header.get("action_requires", []),
                give_up=bool(header.get("give_up", False)),
                instruction_texts=list(header.get("instruction_texts", [])),
                instruction_similarity=list(header.get("instruction_similarity", [])),
            )
            n, width = ds.observations.shape
            rows = (ds.actions, ds.rewards, ds.terminals, ds.timeouts, ds.masks, ds.episode_index)
            consistent = all(len(a) == n for a in rows) and ds.masks.shape[1:] == (len(ds.action_labels),)
            consistent = consistent and width == len(ds.feature_names) and len(ds.states) == n
            texts = (ds.instruction_texts, ds.instruction_similarity)
            consistent = consistent and all(len(t) in (0, n) for t in texts)
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
            raise DatasetError(f"{path}: damaged dataset header or arrays ({type(e).__name__}: {e})") from e
        if not consistent:
            raise DatasetError(f"{path}: damaged dataset (its arrays, states and labels disagree in length)")
        return ds

    def check_layout(self, config: TeamEnvConfig, encoder: ObservationEncoder, where: str = "dataset") -> None:
        check_same_layout((self.feature_names, self.action_labels), team_layout(config, encoder), where)
        check_same_embedder(self.embedder, encoder, where)


def resolve_weights(config: TeamEnvConfig, weights: Mapping[str, float] | None) -> dict[str, float]:
    """The scalarisation weights: the team's, overridden component by component."""
    out = {k: float(config.reward_weights.get(k, 0.0)) for k in REWARD_COMPONENTS}
    for k, v in (weights or {}).items():
        if k not in REWARD_COMPONENTS:
            raise DatasetError(f"reward weight {k!r}: unknown component (known: {', '.join(REWARD_COMPONENTS)})")
        out[k] = float(v)
    return out


def build_dataset(
    paths: Sequence[str | Path] | None,
    config: TeamEnvConfig,
    encoder: ObservationEncoder,
    *,
    episodes: Sequence[Episode] | None = None,
    weights: Mapping[str, float] | None = None,
    filters: DatasetFilter | None = None,
    strict: bool = False,
) -> ConductorDataset:
    """Trajectory files (or episodes) of one team → a :class:`ConductorDataset`.

    Damaged lines are reported and skipped (``strict`` makes them an error); a file with no valid
    episode, an episode of another team or action space, or an action id outside the team's action
    space is an error naming the file and episode.
    """
    w = resolve_weights(config, weights)
    flt = filters or DatasetFilter()
    feature_names, action_labels = team_layout(config, encoder)
    loaded: list[tuple[str, Episode]] = [("<episodes>", e) for e in (episodes or [])]
    sources: list[str] = []
    for p in paths or []:
        p = Path(p)
        if not p.exists():
            raise DatasetError(f"{p}: no such trajectory file")
        report = read_trajectories(p, strict=strict)
        if not report.episodes:
            why = f"; {len(report.problems)} damaged line(s), first: {report.problems[0]}" if report.problems else ""
            raise DatasetError(f"{p}: no valid episode in this file{why}")
        sources.append(str(p))
        loaded.extend((str(p), e) for e in report.episodes)
    if not loaded:
        raise DatasetError("no trajectories given")

    rows_state: list[dict[str, Any]] = []
    actions: list[int] = []
    rewards: list[float] = []
    terminals: list[float] = []
    timeouts: list[float] = []
    masks: list[list[int]] = []
    texts: list[str | None] = []
    sims: list[float | None] = []
    ep_index: list[int] = []
    final_states: list[dict[str, Any]] = []
    infos: list[EpisodeInfo] = []
    seen: set[str] = set()
    for src, e in loaded:
        where = f"{src}: episode {e.episode_id}"
        if e.team.workers != list(config.worker_names):
            raise LayoutError(
                f"{where}: recorded with team {e.team.name!r} workers {e.team.workers}, but the dataset is "
                f"built for team {config.name!r} workers {list(config.worker_names)}"
            )
        if e.episode_id in seen:
            continue  # the same episode in two files (e.g. a copied file): count it once
        ret = float(sum(sum(w[k] * st.reward.named.get(k, 0.0) for k in w) for st in e.steps))
        if not flt.keep(e, ret):
            continue
        if not e.steps:
            if e.error is not None:
                continue  # a fault at the first worker turn: no decision on record
            raise DatasetError(f"{where}: the episode has no steps")
        seen.add(e.episode_id)
        final_state = e.metadata.get("final_state")
        if not isinstance(final_state, dict):
            raise DatasetError(f"{where}: metadata.final_state is missing (recorded by an older orchestra?)")
        idx = len(infos)
        for st in e.steps:
            if len(st.action_mask) != config.num_actions:
                raise LayoutError(
                    f"{where} step {st.t}: action_mask has {len(st.action_mask)} entries, team {config.name!r} "
                    f"has {config.num_actions} actions"
                )
            if not 0 <= st.action.id < config.num_actions:
                raise DatasetError(f"{where} step {st.t}: action id {st.action.id} outside [0, {config.num_actions})")
            label = config.action_label(st.action.id)
            if st.action.label != label:
                raise LayoutError(
                    f"{where} step {st.t}: action {st.action.id} is {st.action.label!r} there, {label!r} here"
                )
            rows_state.append(st.state)
            actions.append(st.action.id)
            rewards.append(sum(w[k] * st.reward.named.get(k, 0.0) for k in w))
            terminals.append(float(st.terminated))
            timeouts.append(float(st.truncated and not st.terminated))
            masks.append(st.action_mask)
            texts.append(st.action.text)
            sims.append(st.action.similarity)
            ep_index.append(idx)
        final_states.append(final_state)
        infos.append(
            EpisodeInfo(
                episode_id=e.episode_id,
                conductor=e.conductor.name,
                family=e.task.family,
                split=e.task.split,
                task_id=e.task.id,
                success=e.success,
                return_=ret,
                truncated=bool(e.truncated and not e.terminated),
                length=len(e.steps),
            )
        )
    if not infos:
        raise DatasetError(f"no episode passed the filters {flt} (read {len(loaded)} episodes)")
    observations = encoder.encode_many(rows_state)
    finals = encoder.encode_many(final_states)
    return ConductorDataset(
        observations=observations.astype(np.float32),
        actions=np.asarray(actions, dtype=np.int64),
        rewards=np.asarray(rewards, dtype=np.float32),
        terminals=np.asarray(terminals, dtype=np.float32),
        timeouts=np.asarray(timeouts, dtype=np.float32),
        masks=np.asarray(masks, dtype=np.int8),
        episode_index=np.asarray(ep_index, dtype=np.int64),
        final_observations=finals.astype(np.float32),
        episodes=infos,
        states=rows_state,
        feature_names=feature_names,
        action_labels=action_labels,
        weights=w,
        team=config.name,
        embedder=encoder.embedder.name,
        sources=sources,
        action_requires=action_requires(config),
        give_up=config.give_up,
        instruction_texts=texts if any(t is not None for t in texts) else [],
        instruction_similarity=sims if any(t is not None for t in texts) else [],
    )


def action_requires(config: TeamEnvConfig) -> list[str]:
    """Per action id, the precondition of its instruction ("", "message" or "candidate"); submit ""."""
    out: list[str] = []
    for a in range(config.num_actions):
        worker, instruction = config.decode_action(a)
        spec = next((w for w in config.workers if w.name == worker), None)
        out.append(dict(spec.requires).get(instruction or "", "") if spec is not None else "")
    return out
