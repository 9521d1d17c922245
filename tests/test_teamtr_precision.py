"""The trust region of a reduced-precision team (orchestra/teamtr/llm_models.py ``upcast``, orchestra/teamtr/
trust_region.py ``noise_floor``): rounding noise in bf16 log-probs must not revert updates, while a genuinely
too-large step is still cut back (docs/algorithms.md §2.4).

With a bf16 base any change of the adapters re-rolls the roundings of the whole forward: on the real SmolLM2 (CPU)
the k3 estimate of KL(π_cur‖π_θ) reads ~2·10⁻³ nats per token for a step whose true KL is ~10⁻⁹, ~3·10⁻⁴ once the
final norm, the output head, the residual stream and the matmul outputs compute in float32. The trust region
measures that floor once per update and tests D̂ ≤ δ + floor."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from orchestra.teamtr.config import TeamTRConfig
from orchestra.teamtr.llm import LLMTeam
from orchestra.teamtr.llm_config import LLMTeamConfig, LLMTeamError
from orchestra.teamtr.llm_models import Float32Norm, load_base
from orchestra.teamtr.llm_rollout import LLMRollout
from orchestra.teamtr.trainer import AgentState, update_agents
from orchestra.teamtr.trust_region import noise_floor

REWARDS = torch.tensor([1.0, 0.0, 1.0, 0.0])  # 2 groups of G = 2: every episode gets a non-zero advantage


def _update(team: LLMTeam, batch: LLMRollout, cfg: TeamTRConfig) -> dict[str, float]:
    """One update of agent 0 from its current adapter, put back afterwards; its metrics without the agent prefix."""
    init = team.state(0)
    try:
        metrics, _ = update_agents(
            team, [0], batch, cfg, states={0: AgentState()}, shuffle=torch.Generator().manual_seed(0)
        )
    finally:
        team.load_state(0, init)
    name = team.agent_names[0]
    return {k.removeprefix(f"agent/{name}/"): v for k, v in metrics.items()}


# ---------------------------------------------------------------------------------------------------------------
# the tiny random Llama: the mechanics


def test_upcast_levels_compute_the_head_and_residual_in_float32_and_leave_float32_alone(duo_file: Path) -> None:
    ids = torch.tensor([[1, 2, 3, 4]])
    cfg = LLMTeamConfig(team=str(duo_file), model="tiny", workers=("solver",), dtype="bfloat16")
    logits = {}
    for level in ("none", "head", "residual"):
        lm, _, _ = load_base("tiny", dataclasses.replace(cfg, upcast=level), 0)
        assert isinstance(lm.get_decoder().norm, Float32Norm) == (level != "none")
        with torch.no_grad():
            logits[level] = lm(input_ids=ids).logits
        assert logits[level].dtype == (torch.bfloat16 if level == "none" else torch.float32)
        assert lm.get_decoder().embed_tokens.weight.dtype == torch.bfloat16  # weights stay in the model's dtype
    assert not torch.equal(logits["head"], logits["residual"])  # the residual stream is no longer re-rounded
    fp32, _, _ = load_base("tiny", dataclasses.replace(cfg, dtype="float32"), 0)
    assert not isinstance(fp32.get_decoder().norm, Float32Norm)  # float32: the model as transformers builds it
    with pytest.raises(LLMTeamError, match="upcast"):
        LLMTeamConfig(upcast="all")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="kl_floor_step"):
        TeamTRConfig(kl_floor_step=0.0)


@pytest.fixture(scope="module")
def tiny_bf16(duo_file: Path) -> LLMTeam:
    cfg = LLMTeamConfig(
        team=str(duo_file), model="tiny", workers=("solver",), max_tokens=6, group_size=2, num_envs=4, seed=0
    )
    return LLMTeam(dataclasses.replace(cfg, dtype="bfloat16"))


def test_noise_floor_puts_the_parameters_back_and_is_measured_only_below_float32(
    tiny_bf16: LLMTeam, duo_file: Path
) -> None:
    """The floor is D̂ at a zero step θ + σ·z; the adapter is restored bit for bit. ``kl_floor="auto"`` measures it
    for a bf16 team only: a float32 team's update is the same as without the rule (floor 0)."""
    with torch.no_grad():
        batch = dataclasses.replace(tiny_bf16.sample(4, torch.Generator().manual_seed(1)), rewards=REWARDS)
        old = tiny_bf16.logprobs(0, batch).detach()
    before = tiny_bf16.state(0)
    floor = noise_floor(tiny_bf16, 0, batch, old, None, "k3", TeamTRConfig())
    assert 0.0 <= floor < 1e-3
    assert all(torch.equal(before[k], v) for k, v in tiny_bf16.state(0).items())
    cfg = TeamTRConfig(batch_size=4, num_minibatches=1, num_epochs=1, lr=1e-3, kl_floor="measure")
    assert _update(tiny_bf16, batch, cfg)["kl_floor"] == floor  # the same fixed zero step, the same number
    fp32 = LLMTeam(dataclasses.replace(tiny_bf16.cfg, dtype="float32"))
    with torch.no_grad():
        batch32 = dataclasses.replace(fp32.sample(4, torch.Generator().manual_seed(1)), rewards=REWARDS)
    auto = _update(fp32, batch32, dataclasses.replace(cfg, kl_floor="auto"))
    off = _update(fp32, batch32, dataclasses.replace(cfg, kl_floor="off"))
    assert auto["kl_floor"] == 0.0 and auto == off
    assert 0.0 <= _update(fp32, batch32, cfg)["kl_floor"] < 1e-9  # float32 rounding: no floor worth the name


# ---------------------------------------------------------------------------------------------------------------
# the real SmolLM2 in bfloat16


@pytest.fixture(scope="module")
def smollm2_bf16() -> Iterator[tuple[LLMTeam, LLMRollout]]:
    """The embedded SmolLM2 in bfloat16, solver trained, and one batch of 4 episodes (2 tasks × G = 2, ≤ 16 tokens)."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)  # bf16 GEMMs of a 135M model: two threads beat one
    cfg = LLMTeamConfig(
        team="arithmetic",
        conductor="pipeline",
        pipeline=("solver:solve",),
        embedder="hash",
        workers=("solver",),
        max_tokens=16,
        group_size=2,
        num_envs=4,
        dtype="bfloat16",
    )
    team = LLMTeam(cfg)
    with torch.no_grad():
        batch = team.sample(4, torch.Generator().manual_seed(0))
    yield team, dataclasses.replace(batch, rewards=REWARDS)
    torch.set_num_threads(before)


def test_bf16_noise_does_not_revert_a_small_step_but_a_large_one_is_cut(
    smollm2_bf16: tuple[LLMTeam, LLMRollout],
) -> None:
    """δ = 5·10⁻⁴ sits under the bf16 floor of a batch this size before the fix (~1.4·10⁻³: every check of the small
    step failed and it was reverted) and over the floor after it (~3·10⁻⁴, measured per update and added to δ). A
    first Adam step of lr 1e-5 (true KL ~10⁻⁵) is kept whole; one of lr 1e-3 (true KL ~6·10⁻² nats per token in
    float32) is line-searched and shortened or reverted. The test runs in ~20 s, most of it loading SmolLM2."""
    team, batch = smollm2_bf16
    cfg = TeamTRConfig(batch_size=4, num_epochs=1, num_minibatches=1, delta=5e-4, backtrack_coef=0.5, max_backtracks=3)
    small = _update(team, batch, dataclasses.replace(cfg, lr=1e-5))
    assert small["optimizer_steps"] == 1 and small["backtracks"] == 0 and small["last_step_reverted"] == 0
    assert small["kl_floor"] > 0 and small["kl_trust"] <= small["delta"] + small["kl_floor"]
    large = _update(team, batch, dataclasses.replace(cfg, lr=1e-3))
    assert large["early_stopped"] == 1 and large["backtracks"] >= 1
