"""Telephone-chain testbed (orchestra/teamtr/chain.py): exact J / occupancies / drift against hand computations, and
the tiny-LM team against Monte-Carlo rollouts, LoRA isolation and determinism."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Literal

import numpy as np
import pytest
import torch

from orchestra.teamtr.chain import (
    ChainBatch,
    ChainConfig,
    ChainModelConfig,
    ChainTeam,
    WarmStartReport,
    agent_logits,
    agent_logprobs,
    drift_b,
    drift_b_terms,
    drift_d,
    drift_d_terms,
    exact_success,
    exact_success_with,
    head_only,
    message_logits,
    noisy_pass_through,
    occupancies,
    own_step_kl,
    own_step_terms,
    own_step_tv,
    pass_probabilities,
    policy_matrices,
    policy_matrix,
    row_tv,
    sample_rollouts,
    stale_mismatch_terms,
    team_success,
    tv_distance,
    warm_start,
)

V = 8
SCHEMES: tuple[Literal["fresh", "stale"], ...] = ("fresh", "stale")


def _random_mats(n: int, seed: int, sharp: float = 3.0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        logits = sharp * np.eye(V) + rng.normal(size=(V, V))
        out.append(np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True))
    return out


# ---------------------------------------------------------------------------------------------------------------
# exact team quantities


def test_exact_success_identity_uniform_and_two_hops() -> None:
    assert exact_success([np.eye(V)] * 5) == pytest.approx(1.0, abs=1e-15)
    assert exact_success([np.full((V, V), 1 / V)] * 3) == pytest.approx(1 / V, abs=1e-15)
    a = 0.7
    flip = np.array([[a, 1 - a], [1 - a, a]])
    assert exact_success([flip, flip]) == pytest.approx(a**2 + (1 - a) ** 2, abs=1e-15)
    assert exact_success([torch.eye(3, dtype=torch.float64)]) == 1.0  # torch tensors are accepted
    # noisy pass-through: J = (1 + (V−1)(p − q)^n) / V (eigenvalues 1 and p − q)
    p, n = 0.85, 4
    q = (1 - p) / (V - 1)
    assert exact_success([noisy_pass_through(V, p)] * n) == pytest.approx((1 + (V - 1) * (p - q) ** n) / V, abs=1e-12)
    np.testing.assert_allclose(pass_probabilities([noisy_pass_through(V, p), np.eye(V)]), [p, 1.0])
    mats = _random_mats(3, seed=1)
    assert exact_success_with(mats, 1, np.eye(V)) == pytest.approx(exact_success([mats[0], np.eye(V), mats[2]]))
    with pytest.raises(ValueError):
        exact_success([np.eye(V), np.eye(V + 1)])


def test_occupancies_follow_the_chain() -> None:
    mats = _random_mats(4, seed=2)
    occ = occupancies(mats)
    assert len(occ) == 4
    np.testing.assert_array_equal(occ[0], np.eye(V) / V)  # agent 0 sees the key itself
    for i, d in enumerate(occ):
        assert d.sum() == pytest.approx(1.0, abs=1e-12)
        np.testing.assert_allclose(d.sum(axis=1), np.full(V, 1 / V), atol=1e-15)  # key marginal is uniform
        if i:
            np.testing.assert_allclose(d, np.linalg.multi_dot([np.eye(V) / V, *mats[:i]]), atol=1e-15)
    # J = P(last message = key) = Σ_{k,x} d_{n−1}(k, x) P_{n−1}[x, k]
    assert float(np.trace(occ[-1] @ mats[-1])) == pytest.approx(exact_success(mats), abs=1e-15)


def test_tv_and_own_step_by_hand() -> None:
    old = np.eye(2)
    new = np.array([[0.9, 0.1], [0.3, 0.7]])
    np.testing.assert_allclose(row_tv(old, new), [0.1, 0.3])
    assert tv_distance(old / 2, new / 2) == pytest.approx(0.2)
    occ = np.array([[0.25, 0.25], [0.0, 0.5]])  # input marginal (0.25, 0.75)
    assert own_step_tv(occ, old, new) == pytest.approx(0.25 * 0.1 + 0.75 * 0.3)
    assert own_step_kl(occ, old, new) == pytest.approx(0.25 * -np.log(0.9) + 0.75 * -np.log(0.7))
    assert own_step_tv(occ, new, new) == 0.0 and own_step_kl(occ, new, new) == 0.0


# ---------------------------------------------------------------------------------------------------------------
# drift (b) and (d)


def _stage_one_change(n: int, changed: int, seed: int = 3) -> list[list[np.ndarray]]:
    """Fixed-order stage where only update `changed` moves its agent's policy; snapshots S[0..n]."""
    start = _random_mats(n, seed)
    new = _random_mats(1, seed + 100)[0]
    snaps = [list(start)]
    for m in range(n):
        cur = list(snaps[-1])
        if m == changed:
            cur[m] = new
        snaps.append(cur)
    return snaps


@pytest.mark.parametrize("train_index", SCHEMES)
def test_drift_is_zero_when_nothing_changes(train_index: Literal["fresh", "stale"]) -> None:
    mats = _random_mats(4, seed=4)
    snaps = [mats] * 5
    order = [0, 1, 2, 3]
    for fn in (drift_b_terms, drift_d_terms, stale_mismatch_terms):
        np.testing.assert_array_equal(fn(snaps, order, train_index), np.zeros(4))
    np.testing.assert_array_equal(own_step_terms(snaps, order), np.zeros(4))
    assert drift_b(snaps, order, train_index) == 0.0 and drift_d(snaps, order, train_index) == 0.0


def test_drift_b_fresh_counts_one_update_stale_accumulates() -> None:
    n = 4
    snaps = _stage_one_change(n, changed=0)  # agent 0 changes first; nothing else moves
    order = list(range(n))
    fresh = drift_b_terms(snaps, order, "fresh")
    stale = drift_b_terms(snaps, order, "stale")
    assert fresh[0] == 0.0 and stale[0] == 0.0  # agent 0's input is the key: it never moves
    occ0, occ1 = occupancies(snaps[0]), occupancies(snaps[1])
    assert fresh[1] == pytest.approx(tv_distance(occ0[1], occ1[1])) and fresh[1] > 0.01
    np.testing.assert_array_equal(fresh[2:], [0.0, 0.0])  # the previous update (agent 1, 2) did not move
    # stale batch: the shift of agent 0 is still unaccounted for at every later update
    for m in range(1, n):
        assert stale[m] == pytest.approx(tv_distance(occ0[m], occupancies(snaps[m])[m])) and stale[m] > 0.01
    assert drift_b(snaps, order, "stale") > drift_b(snaps, order, "fresh") > 0
    # explicit train indices reproduce the named schemes
    np.testing.assert_array_equal(drift_b_terms(snaps, order, [0, 1, 2, 3]), fresh)
    np.testing.assert_array_equal(drift_b_terms(snaps, order, [0, 0, 0, 0]), stale)


def test_drift_b_agent0_is_zero_in_any_order() -> None:
    n = 3
    start, new = _random_mats(n, seed=5), _random_mats(n, seed=6)
    order = [2, 1, 0]  # everyone changes, agent 0 last
    snaps = [list(start)]
    for i in order:
        cur = list(snaps[-1])
        cur[i] = new[i]
        snaps.append(cur)
    for scheme in SCHEMES:
        assert drift_b_terms(snaps, order, scheme)[2] == 0.0
        assert stale_mismatch_terms(snaps, order, scheme)[2] == 0.0
    # agent 1 updated after agent 2 (downstream): a fresh batch sees no shift from it
    assert drift_b_terms(snaps, order, "fresh")[1] == 0.0


def test_drift_d_is_own_step_plus_stale_mismatch() -> None:
    n = 4
    snaps = _stage_one_change(n, changed=0)
    order = list(range(n))
    own = own_step_terms(snaps, order)
    assert own[0] == pytest.approx(own_step_tv(np.eye(V) / V, snaps[0][0], snaps[1][0])) and own[0] > 0.01
    np.testing.assert_array_equal(own[1:], np.zeros(n - 1))
    np.testing.assert_allclose(drift_d_terms(snaps, order, "fresh"), own)  # TeamTR: no mismatch
    stale = drift_d_terms(snaps, order, "stale")
    np.testing.assert_allclose(stale, own + stale_mismatch_terms(snaps, order, "stale"))
    assert (stale[1:] > 0.01).all()
    assert drift_d(snaps, order, "stale") > drift_d(snaps, order, "fresh") > 0


def test_drift_rejects_malformed_stages() -> None:
    snaps = _stage_one_change(3, changed=1)
    with pytest.raises(ValueError, match="snapshots"):
        drift_b(snaps[:-1], [0, 1, 2], "fresh")
    with pytest.raises(ValueError, match="future"):
        drift_b(snaps, [0, 1, 2], [0, 2, 2])
    with pytest.raises(ValueError, match="order"):
        drift_d(snaps, [0, 1, 3], "stale")


# ---------------------------------------------------------------------------------------------------------------
# the LM team


pytestmark = pytest.mark.usefixtures("one_thread")


CFG = ChainConfig(n_agents=3, vocab_size=V, seed=0)


@pytest.fixture(scope="module")
def warm() -> tuple[ChainTeam, WarmStartReport]:
    team = ChainTeam(CFG)
    return team, warm_start(team)


@pytest.fixture
def team(warm: tuple[ChainTeam, WarmStartReport]) -> Iterator[ChainTeam]:
    """The warm team; every adapter is restored after the test (tests below take optimizer steps)."""
    t = warm[0]
    saved = [t.adapter_state(i) for i in range(t.n_agents)]
    yield t
    for i, state in enumerate(saved):
        t.load_adapter_state(i, state)
    for p in t.models[0].parameters():
        p.grad = None


def test_warm_start_reaches_target_pass(warm: tuple[ChainTeam, WarmStartReport]) -> None:
    team, report = warm
    mats = policy_matrices(team)
    for i, m in enumerate(mats):
        assert abs(np.diag(m).mean() - CFG.warm_pass) <= 0.03, (i, np.diag(m))
        assert report.pass_prob[i] == pytest.approx(np.diag(m).mean(), abs=1e-12)
        assert report.kl[i] < CFG.warm_kl_tol and 0 < report.steps[i] < CFG.warm_steps
    p, q = CFG.warm_pass, (1 - CFG.warm_pass) / (V - 1)
    assert team_success(team) == pytest.approx((1 + (V - 1) * (p - q) ** 3) / V, abs=0.02)


def test_warm_start_fails_loudly_when_target_is_missed() -> None:
    cfg = ChainConfig(n_agents=1, warm_steps=0)
    with pytest.raises(RuntimeError, match="missed pass"):
        warm_start(ChainTeam(cfg))


def test_policy_matrix_matches_monte_carlo_and_exact_j(team: ChainTeam) -> None:
    mats = policy_matrices(team)
    for m in mats:
        assert m.shape == (V, V) and m.dtype == np.float64
        np.testing.assert_allclose(m.sum(axis=1), 1.0, atol=1e-12)
    n_samples = 4000
    batch = sample_rollouts(team, n_samples, torch.Generator().manual_seed(0))
    for i, m in enumerate(mats):
        inputs = batch.input_ids[i, :, 1].numpy()
        counts = np.zeros((V, V))
        np.add.at(counts, (inputs, batch.messages[i].numpy()), 1)
        rows = counts.sum(axis=1, keepdims=True)
        se = np.sqrt(m * (1 - m) / rows)
        assert (np.abs(counts / rows - m) <= 5 * se + 1e-3).all(), i
    j = exact_success(mats)
    assert abs(batch.rewards.mean().item() - j) <= 4 * np.sqrt(j * (1 - j) / n_samples)


def test_rollout_layout(team: ChainTeam) -> None:
    b = sample_rollouts(team, 64, torch.Generator().manual_seed(1))
    assert isinstance(b, ChainBatch) and b.batch_size == 64
    assert b.input_ids.shape == (3, 64, 2) and b.messages.shape == (3, 64) and b.logprobs.shape == (3, 64)
    assert (b.input_ids[:, :, 0] == team.bos_id).all()
    assert torch.equal(b.input_ids[0, :, 1], b.keys)
    for i in range(1, 3):
        assert torch.equal(b.input_ids[i, :, 1], b.messages[i - 1])  # the exact sampled ids are the next context
    assert ((b.messages >= 0) & (b.messages < V)).all()  # BOS is never emitted
    assert torch.equal(b.rewards, (b.messages[-1] == b.keys).float())
    mats = policy_matrices(team)
    for i in range(3):  # behaviour log-probs are the exact policy's
        exact = np.log(mats[i][b.input_ids[i, :, 1].numpy(), b.messages[i].numpy()])
        np.testing.assert_allclose(b.logprobs[i].numpy(), exact, atol=1e-5)


def test_agent_logprobs_equal_behaviour_and_grad_is_isolated(team: ChainTeam) -> None:
    b = sample_rollouts(team, 256, torch.Generator().manual_seed(2))
    for i in range(team.n_agents):
        with torch.no_grad():
            assert (agent_logprobs(team, i, b) - b.logprobs[i]).abs().max().item() < 1e-5
    logits = agent_logits(team, 1, b)
    assert logits.shape == (256, V)
    logp = agent_logprobs(team, 1, b)
    torch.testing.assert_close(logp, torch.log_softmax(logits, -1).gather(1, b.messages[1, :, None]).squeeze(1))
    (-(logp * b.rewards).mean()).backward()
    mine = team.adapter_parameters(1)
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in mine.values())
    for name, p in team.models[0].named_parameters():
        if name not in mine:
            assert p.grad is None or not p.grad.any(), name


def test_lora_step_changes_only_that_agents_adapter(team: ChainTeam) -> None:
    fresh_base = ChainTeam(CFG).base_parameters()
    before_base = {k: v.detach().clone() for k, v in team.base_parameters().items()}
    for k, v in before_base.items():  # warm start left the base exactly as built
        assert torch.equal(v, fresh_base[k]), k
    before = [team.adapter_state(i) for i in range(team.n_agents)]
    b = sample_rollouts(team, 128, torch.Generator().manual_seed(3))
    opt = torch.optim.Adam(list(team.adapter_parameters(1).values()), lr=1e-2)
    loss = -(agent_logprobs(team, 1, b) * (b.rewards - b.rewards.mean())).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    for k, v in team.base_parameters().items():
        assert torch.equal(v, before_base[k]), k
    for i in (0, 2):
        after = team.adapter_state(i)
        assert all(torch.equal(after[k], before[i][k]) for k in after), i
    after1 = team.adapter_state(1)
    assert any(not torch.equal(after1[k], before[1][k]) for k in after1)
    assert not np.array_equal(policy_matrix(team, 1), policy_matrix(ChainTeam(CFG), 1))


def test_head_only_fast_path_equals_the_full_forward() -> None:
    """LoRA on lm_head only: cached base hidden states + the adapter's head give the full forward's logits and the
    same gradients, for every agent, whichever adapter peft last made active."""
    cfg = ChainConfig(n_agents=3, vocab_size=V, seed=1, lora_targets=("lm_head",))
    team = ChainTeam(cfg)
    assert head_only(cfg) and not head_only(CFG)
    for i in range(team.n_agents):  # non-zero lora_B, so the adapters differ
        for p in team.adapter_parameters(i).values():
            torch.nn.init.normal_(p.data, std=0.3, generator=torch.Generator().manual_seed(i))
    ids = team.contexts(torch.tensor([0, 3, V - 1, V - 1, 2]))
    for i in (2, 0, 1):
        fast = message_logits(team, i, ids)
        model = team.select(i)
        full = model(input_ids=ids, use_cache=False).logits[:, -1, :V]
        torch.testing.assert_close(fast, full, rtol=0, atol=1e-6)
        g_fast = torch.autograd.grad(fast.square().sum(), list(team.adapter_parameters(i).values()))
        g_full = torch.autograd.grad(full.square().sum(), list(team.adapter_parameters(i).values()))
        # float32 gradients summed over the batch in another order (the fast path reads cached hidden states): a
        # fresh-clone run saw 2.8e-6 on one element of 256; a wrong adapter or a missed gradient is off by O(0.1)
        for a, b in zip(g_fast, g_full, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    assert set(team.hidden_cache) == {0}


def test_same_seed_is_bit_identical() -> None:
    cfg = ChainConfig(n_agents=2, seed=7)
    a, b = ChainTeam(cfg), ChainTeam(cfg)
    for ma, mb in zip(policy_matrices(a), policy_matrices(b), strict=True):
        np.testing.assert_array_equal(ma, mb)
    ra, rb = warm_start(a), warm_start(b)
    assert ra.pass_prob == rb.pass_prob and ra.steps == rb.steps
    for ma, mb in zip(policy_matrices(a), policy_matrices(b), strict=True):
        np.testing.assert_array_equal(ma, mb)
    ba = sample_rollouts(a, 32, torch.Generator().manual_seed(0))
    bb = sample_rollouts(b, 32, torch.Generator().manual_seed(0))
    assert torch.equal(ba.messages, bb.messages) and torch.equal(ba.logprobs, bb.logprobs)
    other = ChainTeam(ChainConfig(n_agents=2, seed=8))
    assert not np.array_equal(policy_matrix(other, 0), policy_matrix(ChainTeam(cfg), 0))


def test_separate_heterogeneous_bases() -> None:
    small, big = ChainModelConfig(hidden_size=16, num_heads=2), ChainModelConfig(hidden_size=48, num_layers=1)
    cfg = ChainConfig(n_agents=2, shared_base=False, agent_models=(small, big), seed=1)
    team = ChainTeam(cfg)
    assert len(team.models) == 2 and team.model_of(0) is not team.model_of(1)
    assert [m.config.hidden_size for m in team.models] == [16, 48]
    report = warm_start(team)
    assert all(abs(p - cfg.warm_pass) <= 0.03 for p in report.pass_prob)
    b = sample_rollouts(team, 64, torch.Generator().manual_seed(0))
    logp = agent_logprobs(team, 0, b)
    assert (logp.detach() - b.logprobs[0]).abs().max().item() < 1e-5
    logp.sum().backward()
    assert any(p.grad is not None for p in team.adapter_parameters(0).values())
    assert all(p.grad is None for p in team.models[1].parameters())
    assert all(p.grad is None for p in team.base_parameters().values())


def test_the_pure_layer_imports_neither_transformers_nor_peft() -> None:
    """The losses and credit functions are usable (and cheap to import) without the model stack."""
    import subprocess
    import sys

    code = (
        "import sys, orchestra.teamtr.losses, orchestra.teamtr.credit; "
        "print(sorted(m for m in ('transformers', 'peft') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="warm_pass"):
        ChainConfig(warm_pass=1.0)
    with pytest.raises(ValueError, match="agent_models"):
        ChainConfig(n_agents=1, agent_models=(ChainModelConfig(),))
    with pytest.raises(ValueError, match="num_heads"):
        ChainConfig(model=ChainModelConfig(hidden_size=30, num_heads=4))
    with pytest.raises(IndexError):
        ChainTeam(ChainConfig(n_agents=1)).select(1)
