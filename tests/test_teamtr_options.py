"""The TeamTR options a config reaches (issue: "wire or withdraw every claimed option"): Dr. MAS agent-wise
advantages, the DAPO informative-group filter, dual clip, the KL estimators and directions of the trust region, the
penalty rules, leave-one-out / Shapley credit, SGD. Each test shows the option changes what the trainer does."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pytest
import torch
from torch import Tensor

from orchestra.teamtr.chain import exact_success, policy_matrices
from orchestra.teamtr.chain_team import ChainRollout
from orchestra.teamtr.losses import kl_exact
from orchestra.teamtr.trainer import (
    TeamTRConfig,
    TrainHooks,
    agent_advantages,
    compute_advantages,
    credit_weights,
    penalty_update,
    train,
)
from orchestra.teamtr.trust_region import token_kl
from tests.test_teamtr_trainer import BASE, _params, _team

pytestmark = pytest.mark.usefixtures("one_thread")


@dataclass(frozen=True)
class _Batch:
    """A hand-made two-agent batch: agent 1 speaks only in some episodes."""

    rewards: Tensor
    group_ids: Tensor
    mask: Tensor  # (2, B, 1)

    @property
    def batch_size(self) -> int:
        return len(self.rewards)


def test_drmas_normalises_per_group_and_agent_over_the_episodes_it_spoke_in() -> None:
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0, 1.0])
    groups = torch.tensor([0, 0, 0, 0, 1, 1])
    spoke1 = torch.tensor([True, True, False, False, True, False])  # agent 1 skipped episodes 2, 3, 5
    mask = torch.stack([torch.ones(6, dtype=torch.bool), spoke1]).unsqueeze(-1)
    batch: Any = _Batch(rewards, groups, mask)
    cfg = TeamTRConfig(advantage="drmas", adv_max=None)
    seq = compute_advantages(batch, cfg)
    adv = agent_advantages(batch, cfg, [0, 1], seq)
    # agent 0 spoke everywhere: its statistics are the group's, as GRPO's
    assert torch.allclose(adv[0], compute_advantages(batch, replace(cfg, advantage="grpo")))
    # agent 1 in group 0 spoke in episodes 0 (R=1) and 1 (R=0): mean ½, unbiased std √½
    assert adv[1][0] == pytest.approx(0.5 / np.sqrt(0.5), rel=1e-5)
    assert adv[1][1] == pytest.approx(-0.5 / np.sqrt(0.5), rel=1e-5)
    assert float(adv[1][2]) == float(adv[1][3]) == float(adv[1][5]) == 0.0  # no tokens: no advantage
    assert float(adv[1][4]) == 1.0  # a one-sample (group, agent): its raw reward, the GRPO singleton rule
    # GRPO's per-group statistics for the same episodes differ (group 0 has mean ½ over four episodes, std 0.577)
    assert not torch.allclose(adv[1][:2], seq[:2])


def test_credit_weights_scale_each_agents_advantage() -> None:
    batch: Any = _Batch(torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), torch.ones(2, 2, 1, dtype=torch.bool))
    cfg = TeamTRConfig(adv_max=None)
    seq = compute_advantages(batch, cfg)
    adv = agent_advantages(batch, cfg, [0, 1], seq, credit={0: 2.0, 1: 0.0})
    assert torch.equal(adv[0], 2 * seq) and torch.equal(adv[1], torch.zeros(2))


def test_dapo_filter_trains_on_informative_groups_only() -> None:
    """The cold chain succeeds about 1 time in V: with groups of about 3 episodes most are all-failure. The filter
    drops them (and counts every sampled episode), so the trained batch is smaller and every group left has two
    distinct rewards."""
    seen: list[ChainRollout] = []

    def before(stage: int, agents: tuple[int, ...], batch: ChainRollout) -> None:
        seen.append(batch)

    cfg = replace(BASE, scheme="naive", dapo_filter=True, num_stages=2, batch_size=24, num_minibatches=1)
    log = train(_team(3, warm=False), cfg, hooks=TrainHooks(before_update=before))
    for b in seen:
        for g in b.group_ids.unique():
            assert len(b.rewards[b.group_ids == g].unique()) == 2
    assert all(u["rollout/batch_episodes"] < cfg.batch_size for u in log.updates)
    assert all(0 < u["rollout/informative_fraction"] < 1 for u in log.updates)
    assert log.updates[-1]["rollout/episodes"] >= 2 * cfg.batch_size  # sampled episodes, not trained ones
    unfiltered = train(_team(3, warm=False), replace(cfg, dapo_filter=False))
    assert all(u["rollout/batch_episodes"] == cfg.batch_size for u in unfiltered.updates)


@pytest.mark.parametrize("direction", ["cur_theta", "theta_cur"])
@pytest.mark.parametrize("estimator", ["exact", "k1", "k2", "k3"])
def test_trust_region_in_either_direction_and_every_estimator(
    direction: Literal["cur_theta", "theta_cur"], estimator: Literal["exact", "k1", "k2", "k3"]
) -> None:
    """Every accepted update keeps the configured estimate ≤ δ; the exact estimate of each direction is the exact
    KL of that direction (checked against kl_exact with the arguments swapped)."""
    team = _team(2)
    cfg = replace(BASE, num_stages=1, kl_estimator=estimator, kl_direction=direction, delta=0.01, lr=5e-2)
    log = train(team, cfg)
    for u in log.updates:
        name = f"agent/agent_{int(u['rollout/agent'])}"
        assert u[f"{name}/kl_trust"] <= cfg.deltas(2)[0] + 1e-6
    assert sum(u["trust/backtracks"] for u in log.updates) > 0  # the budget bound
    # exact direction check on a fresh batch with perturbed parameters
    other = _team(2)
    batch = other.sample(64, torch.Generator().manual_seed(0))
    old_logits = other.logits(0, batch).detach()
    old_logp = other.logprobs(0, batch).detach()
    with torch.no_grad():
        for p in other.parameters(0):
            p.add_(0.3 * torch.randn(p.shape, generator=torch.Generator().manual_seed(1)))
    with torch.no_grad():
        got = float(token_kl(other, 0, batch, old_logp, old_logits, "exact", direction=direction))
        new_logits = other.logits(0, batch)
        mask = batch.mask[0]
        want = (
            kl_exact(new_logits, old_logits, mask)
            if direction == "cur_theta"
            else kl_exact(old_logits, new_logits, mask)
        )
    assert got == pytest.approx(float(want), rel=1e-6)
    assert got > 0


def test_sampled_reverse_estimators_are_unbiased_for_the_reverse_kl() -> None:
    """From π_cur's own samples, mean swapped-k3 and mean r·log r converge to KL(π_θ‖π_cur), not KL(π_cur‖π_θ)."""
    team = _team(2)
    batch = team.sample(20000, torch.Generator().manual_seed(0))
    old_logits, old_logp = team.logits(0, batch).detach(), team.logprobs(0, batch).detach()
    with torch.no_grad():
        for p in team.parameters(0):
            p.add_(0.3 * torch.randn(p.shape, generator=torch.Generator().manual_seed(1)))
        new_logits = team.logits(0, batch)
        mask = batch.mask[0]
        reverse = float(kl_exact(old_logits, new_logits, mask))
        forward = float(kl_exact(new_logits, old_logits, mask))
        assert abs(reverse - forward) > 0.1 * forward  # the two directions differ here
        for est in ("k1", "k3"):
            got = float(token_kl(team, 0, batch, old_logp, old_logits, est, direction="theta_cur"))  # type: ignore[arg-type]
            assert got == pytest.approx(reverse, rel=0.1), est


def test_penalty_rules() -> None:
    cfg = TeamTRConfig(trust_region="penalty")
    assert penalty_update(1.0, 0.1, 0.01, 8, cfg) == 2.0  # PPO: above 1.5δ → ×2
    prop = replace(cfg, kl_penalty_rule="proportional", kl_penalty_horizon=100)
    assert penalty_update(1.0, 0.1, 0.01, 8, prop) == pytest.approx(1.0 + 0.2 * 8 / 100)  # error clipped at +0.2
    lag = replace(cfg, kl_penalty_rule="lagrangian", kl_penalty_lr=10.0)
    assert penalty_update(1.0, 0.1, 0.01, 8, lag) == pytest.approx(1.0 + 10.0 * 0.09)
    assert penalty_update(0.1, 0.0, 0.02, 8, lag) == 0.0  # projected onto β ≥ 0
    # and the trainer applies the configured rule
    log = train(_team(2), replace(BASE, num_stages=2, trust_region="penalty", kl_penalty_rule="lagrangian", delta=1e-4))
    betas = [u["agent/agent_0/kl_coef"] for u in log.updates if u["rollout/agent"] == 0.0]
    kls = [u["agent/agent_0/kl_trust"] for u in log.updates if u["rollout/agent"] == 0.0]
    assert betas[0] == pytest.approx(max(0.0, 1.0 + 10.0 * (kls[0] - 1e-4)))


def test_dual_clip_bounds_the_loss_of_exploding_negative_advantage_tokens() -> None:
    """With a large step the two runs differ only through the dual clip."""
    cfg = replace(BASE, num_stages=1, trust_region="none", lr=0.3, num_epochs=4)
    a, b = _team(2), _team(2)
    train(a, cfg)
    train(b, replace(cfg, dual_clip_c=1.5))
    pa, pb = _params(a), _params(b)
    assert any(not torch.equal(pa[i][k], pb[i][k]) for i in range(2) for k in pa[i])


@pytest.mark.parametrize("null", ["drop", "uniform", "reference"])
def test_chain_coalition_values_and_credit(null: str) -> None:
    team = _team(3)
    mats = policy_matrices(team.team)
    v = team.team.vocab_size
    assert team.coalition_value(frozenset({0, 1, 2}), null) == pytest.approx(exact_success(mats))
    replaced = {"drop": np.eye(v), "uniform": np.full((v, v), 1 / v), "reference": team.reference[1]}[null]
    assert team.coalition_value(frozenset({0, 2}), null) == pytest.approx(exact_success([mats[0], replaced, mats[2]]))
    cfg = TeamTRConfig(credit="shapley", credit_null=null)  # type: ignore[arg-type]
    phi, w = credit_weights(team, cfg, 0)
    empty = team.coalition_value(frozenset(), null)
    assert sum(phi.values()) == pytest.approx(exact_success(mats) - empty)  # Shapley efficiency
    assert all(0 <= x <= cfg.credit_max_weight for x in w.values())


def test_credit_reaches_the_update_and_needs_a_coalition_team() -> None:
    log = train(_team(3), replace(BASE, credit="loo", num_stages=1))
    u = log.updates[0]
    assert {f"credit/agent_{i}/weight" for i in range(3)} <= u.keys()
    assert not all(u[f"credit/agent_{i}/weight"] == 1.0 for i in range(3))
    mc = train(_team(3), replace(BASE, credit="shapley", credit_samples=8, num_stages=1))
    assert {f"credit/agent_{i}/phi" for i in range(3)} <= mc.updates[0].keys()
    plain = train(_team(3), replace(BASE, num_stages=1))
    assert "credit/agent_0/weight" not in plain.updates[0]

    class NoCoalitions:
        agent_names = ("a",)

    with pytest.raises(ValueError, match="coalition"):
        credit_weights(NoCoalitions(), TeamTRConfig(credit="loo"), 0)  # type: ignore[arg-type]


def test_joint_refuses_per_agent_advantages() -> None:
    with pytest.raises(ValueError, match="joint"):
        TeamTRConfig(scheme="joint", advantage="drmas")
    with pytest.raises(ValueError, match="joint"):
        TeamTRConfig(scheme="joint", credit="loo")


# Every option docs/finetuning.md names, the config that reaches it, and the config it must differ from after two stages on
# the chain (None: no such check — Dr. MAS equals GRPO there, every agent speaking in every episode; the loss
# aggregations coincide, every message being one token; backtracking is the default).
DEFAULTS: dict[str, Any] = {}
DOC_OPTIONS: list[tuple[str, dict[str, Any], dict[str, Any] | None]] = [
    ("backtracking", {"trust_region": "backtrack"}, None),
    ("adaptive penalty", {"trust_region": "penalty"}, DEFAULTS),
    ("proportional", {"trust_region": "penalty", "kl_penalty_rule": "proportional"}, {"trust_region": "penalty"}),
    ("Lagrangian", {"trust_region": "penalty", "kl_penalty_rule": "lagrangian"}, {"trust_region": "penalty"}),
    ("or none", {"trust_region": "none"}, DEFAULTS),
    ("exact, k1, k2, k3", {"kl_estimator": "k1"}, DEFAULTS),
    ("exact, k1, k2, k3", {"kl_estimator": "k2"}, DEFAULTS),
    ("exact, k1, k2, k3", {"kl_estimator": "k3"}, DEFAULTS),
    ("KL(π_θ‖π_cur)", {"kl_direction": "theta_cur"}, DEFAULTS),
    ("KL to the frozen reference", {"ref_kl_coef": 0.5}, DEFAULTS),
    ("batch-mean", {"advantage": "batch_mean"}, DEFAULTS),
    ("Dr. MAS", {"advantage": "drmas"}, None),
    ("DAPO informative-group filter", {"dapo_filter": True}, DEFAULTS),
    (
        "ε_low/ε_high",
        {"epsilon_low": 0.01, "epsilon_high": 0.01, "trust_region": "none", "lr": 0.3},
        {"trust_region": "none", "lr": 0.3},
    ),
    ("dual clip", {"dual_clip_c": 1.2, "trust_region": "none", "lr": 0.3}, {"trust_region": "none", "lr": 0.3}),
    ("four loss aggregations", {"aggregation": "seq-mean-token-mean"}, None),
    ("Adam or SGD", {"optimizer": "sgd", "lr": 0.1}, DEFAULTS),
    ("fresh per update", {"optimizer_state": "fresh"}, DEFAULTS),
    ("taken from the sampler", {"old_logprobs": "behaviour"}, None),  # equal to rounding: see the test above
    ("sampled stale-gap measurement", {"stale_gap_batch": 64, "scheme": "naive"}, None),  # measures, trains the same
    ("leave-one-out", {"credit": "loo"}, DEFAULTS),
    ("Shapley", {"credit": "shapley", "credit_samples": 4}, DEFAULTS),
    # a uniform null makes every coalition short of the team worth 1/V: equal credit, weight 1, as no credit
    ("uniform", {"credit": "shapley", "credit_null": "uniform"}, {"credit": "shapley"}),
    ("reference) configurable", {"credit": "shapley", "credit_null": "reference"}, {"credit": "shapley"}),
]


def test_every_option_the_finetuning_doc_names_is_reached_by_a_config() -> None:
    doc = (Path(__file__).resolve().parents[1] / "docs" / "finetuning.md").read_text(encoding="utf-8")
    doc = " ".join(doc.split())
    small = replace(BASE, num_stages=2, batch_size=24, num_minibatches=1, num_epochs=2)
    runs: dict[str, list[dict[str, torch.Tensor]]] = {}

    def run(override: dict[str, Any]) -> list[dict[str, torch.Tensor]]:
        key = repr(sorted(override.items()))
        if key not in runs:
            team = _team(3)
            assert train(team, replace(small, **override)).updates, override
            runs[key] = _params(team)
        return runs[key]

    for phrase, override, other in DOC_OPTIONS:
        assert phrase in doc, phrase
        got = run(override)
        if other is not None:
            ref = run(other)
            assert any(not torch.equal(got[i][k], ref[i][k]) for i in range(3) for k in got[i]), (phrase, override)


def test_stale_gap_is_measured_without_touching_training() -> None:
    """Naive's stale gap compares each update's surrogate gain on the stale batch with its gain on a fresh batch of
    the team as it is (a separate random stream: the trained parameters are bit-identical with and without the
    measurement); teamtr trains on the fresh batch, so its gap is 0 by construction."""
    cfg = replace(BASE, scheme="naive", num_stages=2, stale_gap_batch=256)
    measured, plain = _team(3), _team(3)
    log = train(measured, cfg)
    train(plain, replace(cfg, stale_gap_batch=0))
    a, b = _params(measured), _params(plain)
    assert all(torch.equal(a[i][k], b[i][k]) for i in range(3) for k in a[i])
    gaps = [u["stale/gap"] for u in log.updates]
    assert all(g >= 0 for g in gaps) and max(gaps) > 0
    later = [u["stale/gap"] for u in log.updates if u["rollout/position"] > 0]
    assert max(later) > 0
    fresh = train(_team(3), replace(cfg, scheme="teamtr"))
    assert all(u["stale/gap"] == 0.0 for u in fresh.updates)


def test_stale_indep_samples_a_new_batch_per_agent_from_the_stage_start_team() -> None:
    """The control of freshness vs data volume: as many batches as teamtr (one per agent), each sampled by the team
    as it was at the stage start — so an earlier-updated agent's behaviour log-probs are its stage-start ones."""
    team = _team(3)
    start = [team.state(i) for i in range(3)]
    seen: list[tuple[int, ChainRollout, float]] = []

    def before(stage: int, agents: tuple[int, ...], batch: ChainRollout) -> None:
        if stage == 0:  # compare with the stage-start team (stage 0 starts at `start`)
            now = [team.state(i) for i in range(3)]
            for i in range(3):
                team.load_state(i, start[i])
            with torch.no_grad():
                gap = max(float((batch.behaviour_logprobs[j] - team.logprobs(j, batch)).abs().max()) for j in range(3))
            for i in range(3):
                team.load_state(i, now[i])
            seen.append((agents[0], batch, gap))

    log = train(team, replace(BASE, scheme="stale_indep", num_stages=1), hooks=TrainHooks(before_update=before))
    assert len(seen) == 3 and all(gap < 1e-5 for _, _, gap in seen)  # every batch: the stage-start team's
    assert not torch.equal(seen[0][1].chain.messages, seen[1][1].chain.messages)  # independent batches
    assert log.stages[0]["rollout/episodes"] == 3 * BASE.batch_size  # teamtr's data volume
    # the agent updated first has moved, so a batch of the current team would not have come from these policies
    with torch.no_grad():
        moved = float((seen[2][1].behaviour_logprobs[seen[0][0]] - team.logprobs(seen[0][0], seen[2][1])).abs().max())
    assert moved > 1e-4


def test_old_logprobs_from_the_sampler_match_the_recomputed_ones() -> None:
    """old_logprobs='behaviour' skips one forward per update: on the chain (exact sampler log-probs) the trained
    parameters equal those of the recomputing default to float rounding."""
    a, b = _team(3), _team(3)
    cfg = replace(BASE, num_stages=2, kl_estimator="k3")
    train(a, cfg)
    log = train(b, replace(cfg, old_logprobs="behaviour"))
    pa, pb = _params(a), _params(b)
    assert all(torch.allclose(pa[i][k], pb[i][k], atol=1e-5) for i in range(3) for k in pa[i])
    assert all(np.isnan(u["agent/agent_0/behaviour_gap"]) for u in log.updates if u["rollout/agent"] == 0.0)
