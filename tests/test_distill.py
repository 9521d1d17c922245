"""Decision-tree distillation: a shallow tree reproduces rule-based conductors exactly on real
arithmetic episodes (real calculator tool, scripted solver), and its rules read as named features
and action labels."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from envs.observation import ObservationEncoder
from envs.tasks.registry import get_family
from envs.team_env import CONDUCTOR, TeamEnv
from orchestra.runtime.team_file import load_team
from policies import ConductorPolicy, HeuristicConductor, HeuristicRules, PipelineConductor
from policies.base import PolicyError
from policies.learning.distill import (
    DistillConfig,
    DistillResult,
    distill,
    labels_from_conductor,
    masked_argmax,
    split_heldout,
)

TEAM = load_team("arithmetic")
CFG = dataclasses.replace(TEAM.env, embedder="hash")  # embeddings present, so "structural" has work to do
FAMILY = get_family("arithmetic")
CALC = FAMILY.tools()["calculator"]
NAMES = ObservationEncoder(CFG).feature_names()
LABELS = [CFG.action_label(a) for a in range(CFG.num_actions)]
KINDS = ("right", "wrong_then_right", "vague", "wrong", "no_arithmetic")


def solver_script(kind: str, task: Any) -> list[str]:
    """What the scripted solver says, turn by turn, for each kind of episode."""
    right = task.answer
    expr = task.metadata.get("solution_expression") or task.metadata["expression"]
    good, bad = f"{expr} = {right}. Answer: {right}", f"{expr} = {right}1. Answer: {right}1"
    return {
        "right": [good],
        "wrong_then_right": [bad, good],  # the calculator says FAIL, then PASS
        "vague": ["I am not sure.", good],  # no candidate: the heuristic falls back to revise
        "wrong": [bad, bad, bad],
        "no_arithmetic": ["Answer: -12345", good],  # the calculator cannot check it (n/a)
    }[kind]


@dataclasses.dataclass
class Rows:
    episode: np.ndarray  # (N,)
    obs: np.ndarray  # (N, D)
    masks: np.ndarray  # (N, A)
    states: list[dict[str, Any]]
    actions: np.ndarray  # (N,)


def play(make: Callable[[], ConductorPolicy], n: int = 40) -> Rows:
    """Run ``n`` episodes on train tasks and collect (obs, mask, state, action) of every decision."""
    ep, obs, masks, states, actions = [], [], [], [], []
    for i, task in enumerate(FAMILY.generate("train", n, 0)):
        env = TeamEnv(CFG, FAMILY)
        env.reset(seed=i, options={"task": task})
        policy = make()
        policy.reset(i)
        texts = iter(solver_script(KINDS[i % len(KINDS)], task))
        while env.agents and not (any(env.terminations.values()) or any(env.truncations.values())):
            if env.agent_selection == CONDUCTOR:
                o = env.observe(CONDUCTOR)
                state = env.infos[CONDUCTOR]["state"]
                a = policy.act(o["observation"], o["action_mask"], state)
                ep.append(i)
                obs.append(o["observation"])
                masks.append(o["action_mask"])
                states.append(state)
                actions.append(a)
                env.step(a)
            elif env.agent_selection == "calculator":
                r = CALC(task, env.transcript)
                env.step({"text": r.text, "tokens": 0, "verdict": r.verdict})
            else:
                env.step({"text": next(texts, "I am not sure."), "tokens": 7})
    return Rows(np.array(ep), np.stack(obs), np.stack(masks), states, np.array(actions))


@pytest.fixture(scope="module")
def heuristic_rows() -> Rows:
    # one revision: the depth-4 tree then has every decision the rules make (two need a count of FAILs)
    rules = HeuristicRules(**{**TEAM.conductors["heuristic"], "max_revisions": 1})
    return play(lambda: HeuristicConductor(CFG, rules))


def test_tree_reproduces_the_heuristic_conductor(heuristic_rows: Rows, tmp_path: Path) -> None:
    d = heuristic_rows
    assert {LABELS[a] for a in d.actions} == {"solver:solve", "calculator:check", "solver:revise", "submit"}
    # one revision: the depth-4 tree then has every decision the rules make (two need a count of FAILs)
    rules = HeuristicRules(**{**TEAM.conductors["heuristic"], "max_revisions": 1})
    replay = labels_from_conductor(HeuristicConductor(CFG, rules), d.obs, d.masks, d.states, d.episode)
    np.testing.assert_array_equal(replay, d.actions)

    res = distill(replay, d.obs, d.masks, NAMES, LABELS, DistillConfig(max_depth=4), episode_index=d.episode)
    assert res.n_heldout > 0 and res.n_train + res.n_heldout == len(d.actions)
    assert res.fidelity_train == res.fidelity_heldout == res.masked_fidelity == 1.0
    assert set(res.per_action.values()) == {1.0}
    assert not any(n.startswith("emb_") for n in res.feature_names)
    assert res.tree.get_depth() <= 4
    np.testing.assert_array_equal(res.predict(d.obs, d.masks), d.actions)
    # the rules name structural features and action labels, not column numbers
    assert sum(name in res.rules for name in res.feature_names) >= 2  # rules read named features
    for label in ("solver:solve", "calculator:check", "solver:revise", "submit"):
        assert f"→ {label}" in res.rules
    assert "feature_" not in res.rules and "emb_" not in res.rules

    folder = res.save(tmp_path / "distilled")
    assert {p.name for p in folder.iterdir()} == {"rules.txt", "tree.npz", "distill.json"}
    meta = json.loads((folder / "distill.json").read_text())
    assert meta["fidelity_heldout"] == 1.0 and meta["config"]["features"] == "structural"
    assert meta["feature_names"] == res.feature_names and meta["action_labels"] == LABELS
    back = DistillResult.load(folder)
    np.testing.assert_array_equal(back.predict(d.obs, d.masks), d.actions)
    assert back.rules == res.rules
    # the saved arrays are the fitted tree exactly: same probabilities on any input, same depth and leaves
    x = np.random.default_rng(0).normal(size=(500, len(res.feature_index))) * 2
    np.testing.assert_allclose(back.tree.predict_proba(x), res.tree.predict_proba(x), rtol=0, atol=1e-12)
    assert back.tree.get_depth() == res.tree.get_depth() and back.tree.get_n_leaves() == res.tree.get_n_leaves()
    # no pickle: a tampered tree (a child index pointing back up: an endless walk) is refused, not followed
    with np.load(folder / "tree.npz", allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    arrays["left"][0] = 0
    np.savez(folder / "tree.npz", **arrays)
    with pytest.raises(PolicyError, match="not a valid decision tree"):
        DistillResult.load(folder)


def test_tree_reproduces_the_pipeline_when_replayed_per_episode() -> None:
    steps = TEAM.conductors["pipeline"]["steps"]
    d = play(lambda: PipelineConductor(CFG, steps), n=30)
    replay = labels_from_conductor(PipelineConductor(CFG, steps), d.obs, d.masks, None, d.episode)
    np.testing.assert_array_equal(replay, d.actions)
    # without resets at episode boundaries the pipeline keeps counting and says something else
    assert not np.array_equal(labels_from_conductor(PipelineConductor(CFG, steps), d.obs, d.masks), d.actions)
    res = distill(replay, d.obs, d.masks, NAMES, LABELS, episode_index=d.episode)
    assert res.fidelity_heldout == res.masked_fidelity == 1.0


def test_all_features_keeps_embeddings(heuristic_rows: Rows) -> None:
    d = heuristic_rows
    res = distill(d.actions, d.obs, d.masks, NAMES, LABELS, DistillConfig(features="all"), episode_index=d.episode)
    # with every column the depth-4 tree may split on an embedding instead of a structural flag: near-perfect
    assert len(res.feature_names) == len(NAMES) and res.fidelity_train >= 0.98
    assert any(n.startswith("emb_") for n in res.feature_names)


# ----------------------------------------------------------------------------- without an env


def test_rules_name_features_and_actions_on_a_synthetic_policy() -> None:
    rng = np.random.default_rng(0)
    names = ["has_candidate", "turn_frac", "emb_task_0", "emb_task_1"]
    labels = ["solver:solve", "critic:check", "submit"]
    obs = np.column_stack(
        [rng.integers(0, 2, 300), rng.random(300), rng.normal(size=300), rng.normal(size=300)]
    ).astype(np.float32)
    masks = np.ones((300, 3), dtype=np.int8)

    def policy(o: np.ndarray, m: np.ndarray) -> int:
        if not o[0]:
            return 0
        return 2 if o[1] > 0.5 else 1

    res = distill(policy, obs, masks, names, labels, DistillConfig(max_depth=3, heldout_frac=0.3, seed=1))
    assert res.feature_names == ["has_candidate", "turn_frac"]
    assert res.fidelity_heldout >= 0.97 and res.n_heldout == 90
    assert "if not has_candidate:" in res.rules and "turn_frac <= 0.5" in res.rules
    assert all(f"→ {a}" in res.rules for a in labels)


def test_masked_prediction_takes_the_best_legal_class() -> None:
    proba = np.array([[0.6, 0.3, 0.1], [0.6, 0.3, 0.1], [0.5, 0.5, 0.0]])
    classes = np.array([0, 2, 3])  # the tree never saw action 1
    masks = np.array([[1, 1, 1, 1], [0, 1, 1, 1], [1, 1, 1, 1]])
    assert masked_argmax(proba, classes, masks).tolist() == [0, 2, 0]  # ties: lower action id, as predict


def test_heldout_split_keeps_episodes_whole() -> None:
    episode = np.repeat(np.arange(20), 4)
    train, held = split_heldout(len(episode), 0.25, 3, episode)
    assert (train ^ held).all() and held.sum() == 5 * 4
    assert not set(episode[train]) & set(episode[held])
    assert split_heldout(10, 0.0, 0)[1].sum() == 0
