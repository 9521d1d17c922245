"""TeamTR losses and estimators (orchestra/teamtr/losses.py) against hand computations and exact expectations."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from orchestra.teamtr.losses import (
    AGGREGATIONS,
    adaptive_kl_coef_lagrangian,
    adaptive_kl_coef_ppo,
    adaptive_kl_coef_proportional,
    agentwise_normalise,
    aggregate_loss,
    grpo_advantages,
    happo_factor,
    informative_groups,
    kl_exact,
    kl_exact_per_token,
    kl_k1,
    kl_k2,
    kl_k3,
    kl_swapped_k3,
    masked_mean,
    ppo_clip_loss,
    sequence_logratio,
)

# ---------------------------------------------------------------------------------------------------------------
# KL estimators


def _categoricals(seed: int, k: int = 6, spread: float = 2.0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    logq = torch.log_softmax(torch.randn(k, generator=gen, dtype=torch.float64), dim=-1)
    logp = torch.log_softmax(logq + spread * torch.randn(k, generator=gen, dtype=torch.float64), dim=-1)
    return logp, logq


def _exact_kl(logq: torch.Tensor, logp: torch.Tensor) -> float:
    """KL(q‖p) by direct summation."""
    return float((logq.exp() * (logq - logp)).sum())


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("estimator", [kl_k1, kl_k3])
def test_k1_and_k3_are_unbiased_for_kl_q_p_from_samples_of_q(seed: int, estimator) -> None:
    logp, logq = _categoricals(seed)
    kl = _exact_kl(logq, logp)
    gen = torch.Generator().manual_seed(100 + seed)
    n = 200_000
    x = torch.multinomial(logq.exp(), n, replacement=True, generator=gen)  # x ~ q
    values = estimator(logp[x], logq[x])  # (n,)
    se = float(values.std()) / math.sqrt(n)
    assert abs(float(values.mean()) - kl) < 4 * se
    # the exact expectation under q is KL(q‖p) to rounding
    assert float((logq.exp() * estimator(logp, logq)).sum()) == pytest.approx(kl, abs=1e-12)


def test_k2_is_biased_and_swapped_k3_targets_the_other_direction() -> None:
    logp, logq = _categoricals(0)
    q = logq.exp()
    kl_qp, kl_pq = _exact_kl(logq, logp), _exact_kl(logp, logq)
    assert abs(float((q * kl_k2(logp, logq)).sum()) - kl_qp) > 0.01
    assert float((q * kl_swapped_k3(logp, logq)).sum()) == pytest.approx(kl_pq, abs=1e-12)
    assert abs(kl_pq - kl_qp) > 0.01  # the two directions really differ here


def test_k3_has_lower_variance_than_k1_when_q_is_close_to_p() -> None:
    logp, logq = _categoricals(3, spread=0.1)
    q = logq.exp()

    def var(f) -> float:
        v = f(logp, logq)
        return float((q * v**2).sum() - (q * v).sum() ** 2)

    assert var(kl_k3) < var(kl_k1)


def test_k3_and_swapped_k3_are_nonnegative_elementwise() -> None:
    gen = torch.Generator().manual_seed(0)
    logp = 5 * torch.randn(10_000, generator=gen)
    logq = 5 * torch.randn(10_000, generator=gen)
    logq[:100] = logp[:100]  # exact ties
    logq[100:200] = logp[100:200] + 1e-7 * torch.randn(100, generator=gen)  # near ties (rounding)
    assert (kl_k3(logp, logq) >= 0).all()
    assert (kl_swapped_k3(logp, logq) >= 0).all()
    assert (kl_k1(logp, logq) < 0).any()  # k1 is not
    assert torch.isfinite(kl_k3(logp + 100, logq, max_log_ratio=20.0)).all()


def test_kl_exact_matches_kl_div_and_direct_sum_and_ignores_masked_positions() -> None:
    gen = torch.Generator().manual_seed(0)
    logits_p = torch.randn(2, 5, 11, generator=gen)
    logits_q = torch.randn(2, 5, 11, generator=gen)
    mask = torch.tensor([[1, 1, 0, 1, 0], [0, 0, 0, 1, 1]], dtype=torch.bool)
    per_tok = kl_exact_per_token(logits_p, logits_q)  # (2, 5)
    lq, lp = F.log_softmax(logits_q, -1), F.log_softmax(logits_p, -1)
    ref = F.kl_div(lp, lq, log_target=True, reduction="none").sum(-1)  # KL(target=q ‖ input=p)
    torch.testing.assert_close(per_tok, ref, atol=1e-6, rtol=1e-5)
    direct = (lq.exp() * (lq - lp)).sum(-1)[mask].mean()
    torch.testing.assert_close(kl_exact(logits_p, logits_q, mask), direct, atol=1e-6, rtol=1e-5)
    # garbage logits at masked positions change nothing
    noisy_p = logits_p.clone()
    noisy_p[~mask] = 1e4 * torch.randn(int((~mask).sum()), 11, generator=gen)
    torch.testing.assert_close(kl_exact(noisy_p, logits_q, mask), direct, atol=1e-6, rtol=1e-5)
    assert float(kl_exact(logits_p, logits_q, torch.zeros(2, 5, dtype=torch.bool))) == 0.0
    # zero-probability entries of q contribute 0, not NaN
    logits_q[..., 0] = float("-inf")
    assert torch.isfinite(kl_exact_per_token(logits_p, logits_q)).all()
    assert (kl_exact_per_token(logits_q, logits_q).abs() < 1e-6).all()


def test_masked_mean_is_zero_on_empty_mask_and_selects_positions() -> None:
    x = torch.tensor([[1.0, 2.0, float("inf")], [4.0, 5.0, 6.0]])
    m = torch.tensor([[1, 1, 0], [0, 0, 1]])
    assert float(masked_mean(x, m)) == pytest.approx(3.0)
    assert float(masked_mean(x, torch.zeros_like(m))) == 0.0


# ---------------------------------------------------------------------------------------------------------------
# PPO-clip surrogate

# (ratio, advantage, gradient flows) with epsilon_low = 0.1, epsilon_high = 0.3: clip range [0.9, 1.3]
CASES = [
    (1.2, 1.0, True),  # A > 0, inside (would be clipped with epsilon_high = 0.1)
    (1.5, 1.0, False),  # A > 0, above 1 + ε_high: clipped
    (0.5, 1.0, True),  # A > 0, below 1 − ε_low: min keeps the unclipped (pessimistic) term
    (0.85, -1.0, False),  # A < 0, below 1 − ε_low: clipped
    (0.95, -1.0, True),  # A < 0, inside
    (1.5, -2.0, True),  # A < 0, above 1 + ε_high: unclipped term is the smaller one
    (1.2, -1.0, True),  # A < 0, inside
    (1.0, 0.0, False),  # A = 0: no signal
]


def _ppo_inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    ratios = torch.tensor([[r for r, _, _ in CASES]], dtype=torch.float64)
    adv = torch.tensor([[a for _, a, _ in CASES]], dtype=torch.float64)
    old = torch.full_like(ratios, -1.3)
    new = (old + ratios.log()).requires_grad_(True)
    return new, old, adv, torch.ones_like(ratios, dtype=torch.bool)


def test_ppo_clip_loss_and_gradient_match_hand_computation_with_asymmetric_epsilon() -> None:
    new, old, adv, mask = _ppo_inputs()
    loss, metrics = ppo_clip_loss(new, old, adv, mask, epsilon_low=0.1, epsilon_high=0.3)
    loss.backward()
    n = len(CASES)
    expected_loss = -sum(min(r * a, min(max(r, 0.9), 1.3) * a) for r, a, _ in CASES) / n
    assert float(loss.detach()) == pytest.approx(expected_loss, abs=1e-12)
    # d(−r·A/N)/d log π = −r·A/N where the gradient flows (dr/dlogπ = r), else 0
    expected_grad = torch.tensor([[-r * a / n if flows else 0.0 for r, a, flows in CASES]], dtype=torch.float64)
    assert new.grad is not None
    torch.testing.assert_close(new.grad, expected_grad, atol=1e-12, rtol=0)
    assert metrics["losses/clip_fraction"] == pytest.approx(2 / n)
    assert metrics["losses/clip_fraction_high"] == pytest.approx(1 / n)
    assert metrics["losses/clip_fraction_low"] == pytest.approx(1 / n)
    ratios = torch.tensor([r for r, _, _ in CASES], dtype=torch.float64)
    assert metrics["losses/ratio_max"] == pytest.approx(1.5)
    assert metrics["losses/ratio_min"] == pytest.approx(0.5)
    assert metrics["losses/ratio_mean"] == pytest.approx(float(ratios.mean()))
    assert metrics["kl/approx_k3"] == pytest.approx(float((ratios - 1 - ratios.log()).mean()))
    assert metrics["kl/approx_k1"] == pytest.approx(float(-ratios.log().mean()))
    assert metrics["losses/num_tokens"] == n
    assert metrics["losses/policy_loss"] == pytest.approx(expected_loss)

    # symmetric ε = 0.1 clips the first case too (ratio 1.2 > 1.1 with A > 0)
    new2, old2, adv2, mask2 = _ppo_inputs()
    loss2, metrics2 = ppo_clip_loss(new2, old2, adv2, mask2, epsilon_low=0.1, epsilon_high=0.1)
    loss2.backward()
    assert new2.grad is not None and float(new2.grad[0, 0]) == 0.0
    assert metrics2["losses/clip_fraction_high"] == pytest.approx(2 / n)


def test_dual_clip_bounds_the_loss_of_exploded_ratios_with_negative_advantage() -> None:
    old = torch.zeros(1, 2, dtype=torch.float64)
    new = torch.tensor([[math.log(5.0), math.log(2.0)]], dtype=torch.float64, requires_grad=True)
    adv = torch.tensor([[-1.0, -1.0]], dtype=torch.float64)
    loss, metrics = ppo_clip_loss(new, old, adv, torch.ones(1, 2), dual_clip_c=3.0)
    loss.backward()
    assert float(loss.detach()) == pytest.approx((3.0 + 2.0) / 2)  # min(5, 3) and 2 (below c)
    assert new.grad is not None
    torch.testing.assert_close(new.grad, torch.tensor([[0.0, 1.0]], dtype=torch.float64))
    assert metrics["losses/dual_clip_fraction"] == pytest.approx(0.5)


def test_sequence_advantages_broadcast_over_tokens() -> None:
    gen = torch.Generator().manual_seed(1)
    new = torch.randn(3, 4, generator=gen)
    old = new + 0.3 * torch.randn(3, 4, generator=gen)
    adv = torch.randn(3, generator=gen)
    mask = torch.rand(3, 4, generator=gen) > 0.3
    a, _ = ppo_clip_loss(new, old, adv, mask)
    b, _ = ppo_clip_loss(new, old, adv[:, None].expand(3, 4), mask)
    torch.testing.assert_close(a, b)


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_masked_tokens_carry_no_loss_and_no_gradient(aggregation) -> None:
    gen = torch.Generator().manual_seed(2)
    base = torch.randn(3, 5, generator=gen)
    old = base + 0.4 * torch.randn(3, 5, generator=gen)
    adv = torch.randn(3, 5, generator=gen)
    mask = torch.tensor([[1, 1, 0, 1, 0], [0, 1, 1, 1, 1], [0, 0, 0, 0, 0]], dtype=torch.bool)

    def run(logprobs: torch.Tensor, old_lp: torch.Tensor, a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = logprobs.clone().requires_grad_(True)
        loss, _ = ppo_clip_loss(x, old_lp, a, mask, aggregation=aggregation)
        loss.backward()
        assert x.grad is not None
        return loss.detach(), x.grad

    loss1, grad1 = run(base, old, adv)
    # arbitrary values at masked positions (logprobs, old logprobs, advantages) change nothing
    noise = 50 * torch.randn(3, 5, generator=gen)
    loss2, grad2 = run(
        torch.where(mask, base, noise), torch.where(mask, old, -noise), torch.where(mask, adv, noise.flip(0))
    )
    torch.testing.assert_close(loss1, loss2)
    torch.testing.assert_close(grad1, grad2)
    assert (grad1[~mask] == 0).all()
    assert (grad1[2] == 0).all()  # the sequence with no loss tokens gets no gradient
    assert (grad1[mask] != 0).any()

    # a batch with no loss tokens at all: zero loss and zero gradient, never NaN
    x = base.clone().requires_grad_(True)
    loss0, metrics0 = ppo_clip_loss(x, old, adv, torch.zeros_like(mask), aggregation=aggregation)
    loss0.backward()
    assert float(loss0.detach()) == 0.0 and x.grad is not None and (x.grad == 0).all()
    assert all(math.isfinite(v) for v in metrics0.values())


def test_happo_factor_empty_product_leaves_the_loss_unchanged() -> None:
    gen = torch.Generator().manual_seed(3)
    base = torch.randn(4, 6, generator=gen)
    old = base + 0.3 * torch.randn(4, 6, generator=gen)
    adv = torch.randn(4, generator=gen)
    mask = torch.rand(4, 6, generator=gen) > 0.2

    factor = happo_factor(torch.zeros(4, 0))  # first agent of the order: no earlier agents
    torch.testing.assert_close(factor, torch.ones(4))
    results = []
    for f in (None, factor, 2.5 * torch.ones(4)):
        x = base.clone().requires_grad_(True)
        loss, _ = ppo_clip_loss(x, old, adv, mask, happo_factor=f)
        loss.backward()
        assert x.grad is not None
        results.append((loss.detach(), x.grad))
    torch.testing.assert_close(results[0][0], results[1][0])
    torch.testing.assert_close(results[0][1], results[1][1])
    # a positive constant factor scales the min(·,·) term, hence loss and gradient
    torch.testing.assert_close(results[2][0], 2.5 * results[0][0])
    torch.testing.assert_close(results[2][1], 2.5 * results[0][1])


def test_happo_factor_is_the_detached_product_of_earlier_ratios() -> None:
    gen = torch.Generator().manual_seed(4)
    mask_a = torch.tensor([[1, 1, 0, 0], [1, 0, 0, 0]], dtype=torch.bool)
    mask_b = torch.tensor([[0, 0, 1, 1], [0, 1, 1, 0]], dtype=torch.bool)
    old = torch.randn(2, 4, generator=gen)
    new = (old + 0.2 * torch.randn(2, 4, generator=gen)).requires_grad_(True)
    la = sequence_logratio(new, old, mask_a)
    lb = sequence_logratio(new, old, mask_b)
    factor = happo_factor(torch.stack([la, lb], dim=-1))
    ratio = (new - old).exp().detach()
    expected = torch.stack([ratio[0, 0] * ratio[0, 1] * ratio[0, 2] * ratio[0, 3], ratio[1, :3].prod()])
    torch.testing.assert_close(factor, expected)
    assert not factor.requires_grad
    mean_a = sequence_logratio(new, old, mask_a, reduce="mean")
    torch.testing.assert_close(mean_a, torch.stack([la[0] / 2, la[1]]))
    clipped = happo_factor(torch.tensor([[3.0], [-3.0], [0.5]]), max_log_factor=1.0)
    torch.testing.assert_close(clipped, torch.tensor([math.e, 1 / math.e, math.exp(0.5)]))


# ---------------------------------------------------------------------------------------------------------------
# loss aggregation


def test_aggregation_modes_weigh_a_ragged_batch_as_the_spec_says() -> None:
    # sequence 0 has 1 loss token, sequence 1 has 3 (T = 4, one pad position each)
    mask = torch.tensor([[1, 0, 0, 0], [1, 1, 1, 0]], dtype=torch.bool)
    values = torch.tensor([[4.0, 9.0, 9.0, 9.0], [1.0, 2.0, 3.0, 9.0]])
    expected_weights = {
        "token-mean": [[1 / 4, 0, 0, 0], [1 / 4, 1 / 4, 1 / 4, 0]],  # L / ΣL per sequence
        "seq-mean-token-mean": [[1 / 2, 0, 0, 0], [1 / 6, 1 / 6, 1 / 6, 0]],  # 1 / (B·L) per token
        "seq-mean-token-sum": [[1 / 2, 0, 0, 0], [1 / 2, 1 / 2, 1 / 2, 0]],
        "seq-mean-token-sum-norm": [[1 / 8, 0, 0, 0], [1 / 8, 1 / 8, 1 / 8, 0]],  # 1 / (B·L_max), L_max = T
    }
    expected_values = {"token-mean": 10 / 4, "seq-mean-token-mean": 3.0, "seq-mean-token-sum": 5.0}
    expected_values["seq-mean-token-sum-norm"] = 10 / 8
    for mode in AGGREGATIONS:
        x = values.clone().requires_grad_(True)
        loss = aggregate_loss(x, mask, mode)
        loss.backward()
        assert float(loss.detach()) == pytest.approx(expected_values[mode]), mode
        assert x.grad is not None
        torch.testing.assert_close(x.grad, torch.tensor(expected_weights[mode]), msg=mode)
    assert float(aggregate_loss(values, mask, "seq-mean-token-sum-norm", max_length=10)) == pytest.approx(10 / 20)
    assert float(aggregate_loss(values, mask, "token-mean", num_tokens=8)) == pytest.approx(10 / 8)
    # an empty sequence does not dilute the seq-mean modes
    mask3 = torch.cat([mask, torch.zeros(1, 4, dtype=torch.bool)])
    values3 = torch.cat([values, torch.ones(1, 4)])
    assert float(aggregate_loss(values3, mask3, "seq-mean-token-mean")) == pytest.approx(3.0)
    with pytest.raises(ValueError):
        aggregate_loss(values, mask, "nope")  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------------------------
# advantages


def test_grpo_equal_rewards_give_exactly_zero_and_other_groups_mean_0_std_1() -> None:
    rewards = torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.1, 0.1, 0.1, 0.3, 0.7, 0.2])
    groups = [0] * 4 + [1] * 4 + [2] * 3 + [3] * 3
    adv = grpo_advantages(rewards, groups)
    assert (adv[:4] == 0).all() and (adv[8:11] == 0).all()
    for sl in (slice(4, 8), slice(11, 14)):
        assert float(adv[sl].mean()) == pytest.approx(0.0, abs=1e-6)
        assert float(adv[sl].std()) == pytest.approx(1.0, abs=1e-4)
    # Dr. GRPO: centred only
    torch.testing.assert_close(grpo_advantages(rewards[4:8], [1] * 4, scale=False), rewards[4:8] - 0.5)
    # the same with tensor or string ids
    torch.testing.assert_close(grpo_advantages(rewards, torch.tensor(groups)), adv)
    torch.testing.assert_close(grpo_advantages(rewards, [f"task{g}" for g in groups]), adv)
    # float64 rewards whose group mean is not exactly representable (0.7·3/3 ≠ 0.7): still exactly 0
    for size in (3, 6, 10):
        assert (grpo_advantages(torch.full((size,), 0.7, dtype=torch.float64), [0] * size) == 0).all()
    # integer rewards (0/1 verifier scores) give float advantages
    int_adv = grpo_advantages(torch.tensor([0, 1, 1, 0]), [0, 0, 0, 0])
    assert int_adv.is_floating_point() and float(int_adv[1]) == pytest.approx(0.5 / math.sqrt(1 / 3), rel=1e-5)
    assert informative_groups(torch.tensor([0, 1, 1, 1]), [0, 0, 1, 1]).tolist() == [True, True, False, False]
    assert informative_groups(rewards, groups).tolist() == [False] * 4 + [True] * 4 + [False] * 3 + [True] * 3


def test_grpo_singletons_batch_scale_and_bound() -> None:
    rewards = torch.tensor([0.7, 1.0, 0.0, 0.0])
    groups = ["a", "b", "b", "b"]
    assert float(grpo_advantages(rewards, groups)[0]) == pytest.approx(0.7)  # verl: mean 0, std 1
    assert float(grpo_advantages(rewards, groups, singleton="zero")[0]) == 0.0
    batch = grpo_advantages(rewards, groups, scale_level="batch")
    torch.testing.assert_close(batch[1:], (rewards[1:] - 1 / 3) / (rewards.std() + 1e-6))
    lone_success = torch.tensor([1.0] + [0.0] * 19)  # (1 − 0.05) / std ≈ 4.25
    assert float(grpo_advantages(lone_success, [0] * 20)[0]) > 4
    assert float(grpo_advantages(lone_success, [0] * 20, max_abs=3.0)[0]) == pytest.approx(3.0)


def test_agentwise_normalisation_gives_mean_0_std_1_per_task_and_agent() -> None:
    gen = torch.Generator().manual_seed(5)
    n = 120
    tasks = torch.randint(0, 3, (n,), generator=gen)
    agents = ["solver" if i % 3 else "critic" for i in range(n)]
    is_critic = torch.tensor([a == "critic" for a in agents])
    # the critic's rewards live on another scale and are rarer: a global baseline would be off for it
    rewards = torch.where(is_critic, 10 * torch.rand(n, generator=gen) + 5, torch.rand(n, generator=gen))
    adv = agentwise_normalise(rewards, tasks, agents)
    for t in range(3):
        for critic in (True, False):
            sel = (tasks == t) & (is_critic == critic)
            assert int(sel.sum()) > 5
            assert float(adv[sel].mean()) == pytest.approx(0.0, abs=1e-5)
            assert float(adv[sel].std()) == pytest.approx(1.0, abs=1e-4)
    # contrast: per-task (global) normalisation leaves the agents' advantage means far from 0 (docs/algorithms.md §6 claim 12)
    global_adv = grpo_advantages(rewards, tasks)
    assert float(global_adv[is_critic].mean()) > 0.5 and float(global_adv[~is_critic].mean()) < -0.5
    # per-agent over the whole batch
    per_agent = agentwise_normalise(rewards, None, agents, group_by="agent")
    for critic in (True, False):
        sel = is_critic == critic
        assert float(per_agent[sel].mean()) == pytest.approx(0.0, abs=1e-5)
        assert float(per_agent[sel].std()) == pytest.approx(1.0, abs=1e-4)
    with pytest.raises(ValueError):
        agentwise_normalise(rewards, None, agents)


# ---------------------------------------------------------------------------------------------------------------
# KL coefficient updates


def test_kl_coefficient_rules() -> None:
    assert adaptive_kl_coef_ppo(0.1, kl=0.02, target=0.01) == pytest.approx(0.2)
    assert adaptive_kl_coef_ppo(0.1, kl=0.005, target=0.01) == pytest.approx(0.05)
    assert adaptive_kl_coef_ppo(0.1, kl=0.012, target=0.01) == 0.1
    assert adaptive_kl_coef_proportional(0.1, kl=0.05, target=0.01, n_steps=100, horizon=1000) == pytest.approx(
        0.1 * (1 + 0.2 * 0.1)
    )
    assert adaptive_kl_coef_proportional(0.1, kl=0.009, target=0.01, n_steps=10, horizon=10) == pytest.approx(0.09)
    assert adaptive_kl_coef_lagrangian(0.1, kl=0.03, target=0.01, lr=2.0) == pytest.approx(0.14)
    assert adaptive_kl_coef_lagrangian(0.01, kl=0.0, target=0.01, lr=2.0) == 0.0
