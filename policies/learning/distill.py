"""Distil a conductor into a shallow decision tree over named observation features.

A learned conductor is a black box; a depth-4 tree that agrees with it on most held-out states is a
readable account of what it does ("if a tool said FAIL on the current candidate → solver:revise"),
and the gap (1 − fidelity) says how much of the policy the account leaves out. This is the
"VIPER-lite" recipe without DAgger resampling: fit a CART classifier (Breiman et al. 1984;
scikit-learn's ``DecisionTreeClassifier``) on the conductor's own decisions on logged states
(Bastani et al. 2018, "Verifiable Reinforcement Learning via Policy Extraction", §3 — behaviour
cloning of the oracle, their baseline).

* **fidelity** = fraction of states on which the tree's action equals the conductor's;
  ``fidelity_heldout`` is measured on states of held-out *episodes* when episode ids are given
  (states of one episode are correlated, so a row split would flatter the tree).
* **masked fidelity**: the tree's action restricted to legal actions — if its top class is masked,
  the legal class with the highest ``predict_proba`` — which is what a deployed tree would play.
* ``features="structural"`` drops the sentence-embedding features (``emb_*``) so the rules read as
  facts about the transcript; ``"all"`` keeps them (higher fidelity, unreadable thresholds).

Labels are the conductor's decisions on the given states; ``labels_from_conductor`` computes them,
replaying each episode's states in order with a ``reset`` at every episode boundary, since
rule-based conductors are stateful within an episode (a pipeline counts its steps).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from policies.base import ConductorPolicy, PolicyError, action_id
from trajectories.rundir import atomic_path

FeatureSet = Literal["structural", "all"]
LabelFn = Callable[[np.ndarray, np.ndarray], int]  # (obs, mask) -> action id


@dataclass(frozen=True)
class DistillConfig:
    """Settings of one distillation; written into ``distill.json``."""

    max_depth: int = 4  # tree depth: 4 → at most 16 leaves, still readable
    min_samples_leaf: int = 1  # smallest leaf; raise it (e.g. 5) to smooth a noisy learned conductor
    heldout_frac: float = 0.25  # share of episodes (or rows, without episode ids) held out for fidelity
    seed: int = 0  # split and tree tie-breaking seed
    features: FeatureSet = "structural"  # "structural" drops the emb_* sentence-embedding features


@dataclass(frozen=True)
class TreeArrays:
    """A fitted CART tree as plain arrays (nodes in scikit-learn's pre-order), saved without pickle.

    ``left``/``right`` child index per node (-1 at a leaf), ``feature``/``threshold`` of the split (go left when
    ``x[feature] <= threshold``), ``value`` (nodes, classes) the class weights at each node, ``classes`` the action
    id of each class column. :meth:`check` refuses what a damaged or hostile file could hold (an index out of range,
    a child that does not come after its parent, so a walk always ends), because unlike sklearn's own tree, nothing
    here indexes without a bound check."""

    left: np.ndarray
    right: np.ndarray
    feature: np.ndarray
    threshold: np.ndarray
    value: np.ndarray
    classes_: np.ndarray

    @classmethod
    def of(cls, tree: Any) -> TreeArrays:
        t = tree.tree_
        return cls(
            left=np.asarray(t.children_left, dtype=np.int64),
            right=np.asarray(t.children_right, dtype=np.int64),
            feature=np.asarray(t.feature, dtype=np.int64),
            threshold=np.asarray(t.threshold, dtype=np.float64),
            value=np.asarray(t.value[:, 0, :], dtype=np.float64),
            classes_=np.asarray(tree.classes_, dtype=np.int64),
        )

    def check(self, n_features: int, where: str) -> TreeArrays:
        n = len(self.left)
        ok = n >= 1 and all(len(a) == n for a in (self.right, self.feature, self.threshold, self.value))
        ok = ok and self.value.ndim == 2 and self.value.shape[1] == len(self.classes_) >= 1
        if ok:
            inner = self.left != -1
            idx = np.arange(n)
            ok = bool(
                np.all((self.left == -1) == (self.right == -1))
                and np.all(self.left[inner] > idx[inner])
                and np.all(self.right[inner] > idx[inner])
                and np.all(self.left[inner] < n)
                and np.all(self.right[inner] < n)
                and np.all((self.feature[inner] >= 0) & (self.feature[inner] < n_features))
                and np.all(np.isfinite(self.threshold[inner]))
                and np.all(np.isfinite(self.value))
            )
        if not ok:
            raise PolicyError(f"{where}: not a valid decision tree (damaged file?)")
        return self

    def predict_proba(self, x: np.ndarray) -> np.ndarray:
        node = np.zeros(len(x), dtype=np.int64)
        rows = np.arange(len(x))
        while True:
            inner = self.left[node] != -1
            if not inner.any():
                break
            go_left = x[rows, np.where(inner, self.feature[node], 0)] <= self.threshold[node]
            node = np.where(inner, np.where(go_left, self.left[node], self.right[node]), node)
        v = self.value[node]
        return v / np.maximum(v.sum(axis=1, keepdims=True), 1e-300)

    def predict(self, x: np.ndarray) -> np.ndarray:
        return self.classes_[np.argmax(self.predict_proba(x), axis=1)]

    def get_depth(self) -> int:
        depth = np.zeros(len(self.left), dtype=np.int64)
        for i in range(len(self.left)):  # pre-order: a parent comes before its children
            if self.left[i] != -1:
                depth[self.left[i]] = depth[self.right[i]] = depth[i] + 1
        return int(depth.max())

    def get_n_leaves(self) -> int:
        return int(np.sum(self.left == -1))


def select_features(feature_names: Sequence[str], features: FeatureSet) -> np.ndarray:
    """Indices of the observation features the tree may split on."""
    if features not in ("structural", "all"):
        raise PolicyError(f"distill.features: expected 'structural' or 'all', got {features!r}")
    keep = [i for i, n in enumerate(feature_names) if features == "all" or not n.startswith("emb_")]
    if not keep:
        raise PolicyError("distill: no features left to split on")
    return np.asarray(keep, dtype=np.int64)


def split_heldout(
    n_rows: int, heldout_frac: float, seed: int, episode_index: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Boolean masks (train, heldout) over rows; whole episodes go to one side when ids are given."""
    if not 0.0 <= heldout_frac < 1.0:
        raise PolicyError(f"distill.heldout_frac: expected a value in [0, 1), got {heldout_frac}")
    rng = np.random.default_rng(seed)
    if episode_index is None:
        units = np.arange(n_rows)
        unit_of_row = units
    else:
        units, unit_of_row = np.unique(np.asarray(episode_index), return_inverse=True)
    # at least one unit held out and one to learn from, when anything is held out at all
    n_held = min(max(round(heldout_frac * len(units)), 1), len(units) - 1) if heldout_frac > 0 else 0
    held_units = rng.permutation(len(units))[:n_held]
    heldout = np.isin(unit_of_row, held_units)
    return ~heldout, heldout


def masked_argmax(proba: np.ndarray, classes: np.ndarray, masks: np.ndarray) -> np.ndarray:
    """Best legal action per row: ``proba`` (B, C) over the tree's ``classes`` (C,) is scattered into
    the full action space (B, A), masked actions get −inf, argmax. Ties go to the lower action id,
    like ``predict``'s argmax over sorted classes, so an unmasked top class is always kept."""
    from policies.learning.offline import masked_argmax as masked_argmax_scores

    masks = np.atleast_2d(np.asarray(masks))  # (B, A)
    full = np.zeros(masks.shape, dtype=np.float64)  # (B, A)
    full[:, classes] = proba
    return masked_argmax_scores(full, masks)


@dataclass
class DistillResult:
    """A fitted tree, its readable rules and its agreement with the conductor."""

    tree: Any  # sklearn.tree.DecisionTreeClassifier when fitted, TreeArrays when loaded (both predict alike)
    rules: str
    feature_names: list[str]  # names of the features the tree sees (after selection)
    feature_index: np.ndarray  # their positions in the observation vector
    action_labels: list[str]  # action id -> "worker:instruction" / "submit"
    fidelity_train: float
    fidelity_heldout: float  # nan when nothing was held out
    masked_fidelity: float  # held-out agreement of the legal-action prediction (train rows if none held out)
    n_train: int
    n_heldout: int
    config: DistillConfig
    per_action: dict[str, float] = field(default_factory=dict)  # held-out fidelity per conductor action

    def predict(self, obs: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
        """Action ids for observations (B, D) or (D,); with ``mask`` (B, A) only legal ones."""
        x = np.atleast_2d(np.asarray(obs, dtype=np.float32))[:, self.feature_index]  # (B, F)
        if mask is None:
            return np.asarray(self.tree.predict(x), dtype=np.int64)
        return masked_argmax(self.tree.predict_proba(x), self.tree.classes_, mask)

    def save(self, folder: str | Path) -> Path:
        """Write ``rules.txt``, ``tree.npz`` (the tree's arrays: no pickle) and ``distill.json``."""
        import sklearn

        out = Path(folder)
        out.mkdir(parents=True, exist_ok=True)
        (out / "rules.txt").write_text(self.rules, encoding="utf-8")
        arrays = self.tree if isinstance(self.tree, TreeArrays) else TreeArrays.of(self.tree)
        with atomic_path(out / "tree.npz", "decision tree") as tmp, tmp.open("wb") as f:
            np.savez(f, **asdict(arrays))
        meta = {
            "fidelity_train": self.fidelity_train,
            "fidelity_heldout": None if np.isnan(self.fidelity_heldout) else self.fidelity_heldout,
            "masked_fidelity": None if np.isnan(self.masked_fidelity) else self.masked_fidelity,
            "per_action": self.per_action,
            "n_train": self.n_train,
            "n_heldout": self.n_heldout,
            "depth": int(self.tree.get_depth()),
            "leaves": int(self.tree.get_n_leaves()),
            "config": asdict(self.config),
            "feature_names": self.feature_names,
            "feature_index": self.feature_index.tolist(),
            "action_labels": self.action_labels,
            "sklearn_version": sklearn.__version__,
        }
        (out / "distill.json").write_text(json.dumps(meta, indent=2), encoding="utf-8")
        return out

    @classmethod
    def load(cls, folder: str | Path) -> DistillResult:
        """Read back a folder written by ``save``; the tree is plain arrays, checked before use (no pickle)."""
        src = Path(folder)
        try:
            meta = json.loads((src / "distill.json").read_text(encoding="utf-8"))
            with np.load(src / "tree.npz", allow_pickle=False) as z:
                arrays = {k: np.asarray(z[k]) for k in TreeArrays.__dataclass_fields__}
            tree = TreeArrays(**arrays).check(len(meta["feature_index"]), str(src / "tree.npz"))
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise PolicyError(f"{src}: not a distilled tree ({type(e).__name__}: {e})") from e

        def num(x: float | None) -> float:
            return float("nan") if x is None else float(x)

        return cls(
            tree=tree,
            rules=(src / "rules.txt").read_text(encoding="utf-8"),
            feature_names=list(meta["feature_names"]),
            feature_index=np.asarray(meta["feature_index"], dtype=np.int64),
            action_labels=list(meta["action_labels"]),
            fidelity_train=float(meta["fidelity_train"]),
            fidelity_heldout=num(meta["fidelity_heldout"]),
            masked_fidelity=num(meta["masked_fidelity"]),
            n_train=int(meta["n_train"]),
            n_heldout=int(meta["n_heldout"]),
            config=DistillConfig(**meta["config"]),
            per_action=dict(meta["per_action"]),
        )


def format_rules(tree: Any, feature_names: Sequence[str], action_labels: Sequence[str], x: np.ndarray) -> str:
    """Readable nested if/else rules of a fitted tree.

    Features that take only the values 0/1 in the training rows ``x`` (flags, one-hots) read as
    ``if not has_candidate`` / ``else`` instead of ``<= 0.5``; other thresholds are printed to 3
    decimals. A subtree whose leaves all name the same action is printed as that one leaf (CART keeps
    splits that purify the class mix without changing the argmax). Leaves show the action, the
    training rows that reach them and the share of those on which the conductor chose that action.
    """
    t = tree.tree_
    binary = [bool(np.isin(x[:, j], (0.0, 1.0)).all()) for j in range(x.shape[1])]

    def label(node: int) -> str:
        return action_labels[int(tree.classes_[int(np.argmax(t.value[node][0]))])]

    def leaf_labels(node: int) -> set[str]:
        if t.children_left[node] == -1:
            return {label(node)}
        return leaf_labels(t.children_left[node]) | leaf_labels(t.children_right[node])

    lines: list[str] = []

    def walk(node: int, depth: int) -> None:
        pad = "    " * depth
        if t.children_left[node] == -1 or len(leaf_labels(node)) == 1:
            dist = t.value[node][0]
            share = float(dist.max() / dist.sum()) if dist.sum() > 0 else 0.0
            lines.append(f"{pad}→ {label(node)}  [n={int(t.n_node_samples[node])}, {100 * share:.0f}% agree]")
            return
        j, thr = int(t.feature[node]), float(t.threshold[node])
        name = feature_names[j]
        if binary[j]:
            lines.append(f"{pad}if not {name}:")
            walk(t.children_left[node], depth + 1)
            lines.append(f"{pad}else:  # {name}")
        else:
            lines.append(f"{pad}if {name} <= {thr:.3f}:")
            walk(t.children_left[node], depth + 1)
            lines.append(f"{pad}else:  # {name} > {thr:.3f}")
        walk(t.children_right[node], depth + 1)

    walk(0, 0)
    return "\n".join(lines) + "\n"


def _agree(pred: np.ndarray, y: np.ndarray) -> float:
    return float(np.mean(pred == y)) if y.size else float("nan")


def distill(
    labels: np.ndarray | Sequence[int] | LabelFn,
    observations: np.ndarray,
    masks: np.ndarray,
    feature_names: Sequence[str],
    action_labels: Sequence[str],
    cfg: DistillConfig | None = None,
    episode_index: np.ndarray | Sequence[int] | None = None,
) -> DistillResult:
    """Fit a decision tree to a conductor's decisions.

    ``labels`` (N,) are the conductor's action ids on ``observations`` (N, D) with legal ``masks``
    (N, A); or a function ``(obs, mask) -> action`` called on every row (a stateless policy).
    ``feature_names`` (D,) name the observation features (``ObservationEncoder.feature_names()``),
    ``action_labels`` (A,) the actions (``TeamEnvConfig.action_label``). ``episode_index`` (N,) makes
    the held-out split episode-wise.
    """
    from sklearn.tree import DecisionTreeClassifier

    cfg = cfg or DistillConfig()
    obs = np.atleast_2d(np.asarray(observations, dtype=np.float32))  # (N, D)
    masks = np.atleast_2d(np.asarray(masks))  # (N, A)
    n, d = obs.shape
    if len(feature_names) != d:
        raise PolicyError(f"distill: {len(feature_names)} feature names for observations of size {d}")
    if masks.shape != (n, len(action_labels)):
        raise PolicyError(f"distill: masks have shape {masks.shape}, expected ({n}, {len(action_labels)})")
    if n == 0:
        raise PolicyError("distill: no states to distil from")
    if callable(labels):
        y = np.array([labels(obs[i], masks[i]) for i in range(n)], dtype=np.int64)
    else:
        y = np.asarray(labels, dtype=np.int64)
    if y.shape != (n,):
        raise PolicyError(f"distill: {y.shape[0]} labels for {n} states")
    ep = None if episode_index is None else np.asarray(episode_index)
    if ep is not None and ep.shape != (n,):
        raise PolicyError(f"distill: episode_index has shape {ep.shape}, expected ({n},)")

    cols = select_features(feature_names, cfg.features)
    x = obs[:, cols]  # (N, F)
    train, held = split_heldout(n, cfg.heldout_frac, cfg.seed, ep)
    tree = DecisionTreeClassifier(max_depth=cfg.max_depth, min_samples_leaf=cfg.min_samples_leaf, random_state=cfg.seed)
    tree.fit(x[train], y[train])

    names = [feature_names[i] for i in cols]
    pred = np.asarray(tree.predict(x), dtype=np.int64)  # (N,)
    masked = masked_argmax(tree.predict_proba(x), tree.classes_, masks)  # (N,)
    eval_rows = held if held.any() else train
    per_action = {
        action_labels[a]: _agree(pred[held & (y == a)], y[held & (y == a)]) for a in np.unique(y[held]).tolist()
    }
    return DistillResult(
        tree=tree,
        rules=format_rules(tree, names, action_labels, x[train]),
        feature_names=names,
        feature_index=cols,
        action_labels=list(action_labels),
        fidelity_train=_agree(pred[train], y[train]),
        fidelity_heldout=_agree(pred[held], y[held]),
        masked_fidelity=_agree(masked[eval_rows], y[eval_rows]),
        n_train=int(train.sum()),
        n_heldout=int(held.sum()),
        config=cfg,
        per_action=per_action,
    )


def labels_from_conductor(
    conductor: ConductorPolicy,
    observations: np.ndarray,
    masks: np.ndarray,
    states: Sequence[Mapping[str, Any] | None] | None = None,
    episode_index: np.ndarray | Sequence[int] | None = None,
    reset_seed: int = 0,
) -> np.ndarray:
    """The conductor's action on every row, shape (N,) int64.

    Rows must be in episode order (each episode's states in turn order). The conductor is reset with
    ``reset_seed`` before the first row and whenever ``episode_index`` changes, so a stateful
    rule-based conductor replays each episode from its start; without ``episode_index`` all rows
    count as one episode. ``states`` are the structured states (needed by ``heuristic``)."""
    obs = np.atleast_2d(np.asarray(observations, dtype=np.float32))
    masks = np.atleast_2d(np.asarray(masks))
    n = obs.shape[0]
    ep = None if episode_index is None else np.asarray(episode_index)
    if states is not None and len(states) != n:
        raise PolicyError(f"labels_from_conductor: {len(states)} states for {n} observations")
    out = np.empty(n, dtype=np.int64)
    for i in range(n):
        if i == 0 or (ep is not None and ep[i] != ep[i - 1]):
            conductor.reset(reset_seed)
        out[i] = action_id(conductor.act(obs[i], masks[i], states[i] if states is not None else None), conductor.name)
    return out


__all__ = [
    "DistillConfig",
    "DistillResult",
    "distill",
    "format_rules",
    "labels_from_conductor",
    "masked_argmax",
    "select_features",
    "split_heldout",
]
