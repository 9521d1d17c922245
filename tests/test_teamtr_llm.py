"""TeamTR on real LLM workers (orchestra/teamtr/llm.py, orchestra/jobs/finetune.py): own-token masks, LoRA isolation,
the behaviour = current log-prob invariant, held-out evaluation and resume on a tiny random Llama (SmolLM2 tokenizer);
one end-to-end stage of the real SmolLM2 team (slow); the ``orchestra finetune`` command."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from orchestra.teamtr.config import TeamTRConfig
from orchestra.teamtr.llm import LLMTeam
from orchestra.teamtr.llm_config import LLMTeamConfig, LLMTeamError
from orchestra.teamtr.llm_rollout import LLMRollout, Turn
from orchestra.teamtr.trainer import (
    AgentState,
    TrainHooks,
    UpdateInputs,
    compute_advantages,
    team_loss,
    train,
    update_agents,
)

pytestmark = pytest.mark.usefixtures("one_thread")


UPDATE_KEYS = (
    "rollout/episodes",
    "rollout/tokens",
    "rollout/reward_mean",
    "losses/policy_loss",
    "losses/surrogate_gain",
    "losses/clip_fraction",
    "losses/entropy",
    "losses/adv_abs_max",
    "kl/k1",
    "kl/k3",
    "kl/trust",
    "trust/backtracks",
    "trust/accepted",
    "trust/optimizer_steps",
    "perf/sample_seconds",
    "perf/update_seconds",
    "perf/wall_seconds",
)
AGENT_KEYS = (
    "surrogate_gain",
    "clip_fraction",
    "entropy",
    "kl_k1",
    "kl_k3",
    "kl_trust",
    "backtracks",
    "optimizer_steps",
    "behaviour_gap",
    "num_tokens",
)
RUN_FILES = ("config.json", "updates.csv", "updates.jsonl", "stages.csv", "stages.jsonl", "checkpoints")


@pytest.fixture(scope="module")
def tiny_cfg(duo_file: Path) -> LLMTeamConfig:
    return LLMTeamConfig(
        team=str(duo_file),
        model="tiny",
        workers=("solver", "critic"),
        max_tokens=6,
        group_size=2,
        num_envs=4,
        has_logits=True,
        eval_tasks=2,
        seed=0,
    )


@pytest.fixture(scope="module")
def tiny_team(tiny_cfg: LLMTeamConfig) -> LLMTeam:
    return LLMTeam(tiny_cfg)


@pytest.fixture
def team(tiny_team: LLMTeam) -> Iterator[LLMTeam]:
    """The module's tiny team, its adapters put back to their initial values after the test."""
    init = [tiny_team.state(i) for i in range(2)]
    yield tiny_team
    for i, s in enumerate(init):
        tiny_team.load_state(i, s)


@pytest.fixture(scope="module")
def random_team(tiny_cfg: LLMTeamConfig) -> LLMTeam:
    """The tiny team under the random conductor: turn counts, hence returns (turn and token costs), vary by episode,
    so group-normalised advantages are not all zero."""
    return LLMTeam(dataclasses.replace(tiny_cfg, conductor="random"))


def _batch(team: LLMTeam, seed: int = 0, size: int = 4) -> LLMRollout:
    with torch.no_grad():
        return team.sample(size, torch.Generator().manual_seed(seed))


def _finite(row: dict[str, float], keys: Any) -> None:
    for k in keys:
        assert k in row, f"missing metric {k}"
        assert math.isfinite(row[k]), f"{k} = {row[k]}"


# ---------------------------------------------------------------------------------------------------------------
# layout and the teamtr invariant


def test_sampled_batch_layout_and_behaviour_equals_current(team: LLMTeam) -> None:
    """Right after sampling, each worker's behaviour log-probs equal its current teacher-forced log-probs on its own
    tokens (|Δ| ≤ 1e-4 in fp32: only the decode path's KV cache and padding differ); the mask holds exactly its
    sampled ids, left-aligned per episode; sampling repeats exactly from the same generator state."""
    batch = _batch(team)
    assert batch.batch_size == 4 and batch.group_ids.tolist() == [0, 0, 1, 1]
    assert batch.mask.shape == batch.behaviour_logprobs.shape == (2, 4, batch.width)
    for i in range(2):
        turns = batch.turns_of(i)
        assert turns, f"agent {i} took no turn"
        for b in range(4):
            n_own = sum(len(t.token_ids) for t in turns if t.row == b)
            assert batch.mask[i, b].tolist() == [True] * n_own + [False] * (batch.width - n_own)
        with torch.no_grad():
            current = team.logprobs(i, batch)
        gap = (current - batch.behaviour_logprobs[i]).abs()[batch.mask[i]]
        assert float(gap.max()) <= 1e-4
        assert float(current[~batch.mask[i]].abs().sum()) == 0.0
        # exact-vocabulary logits agree with the log-probs at the own positions
        with torch.no_grad():
            logits = team.logits(i, batch)  # (B, T, V)
        recomputed = torch.log_softmax(logits, -1).gather(-1, _ids(batch, i).unsqueeze(-1)).squeeze(-1)
        assert torch.allclose(recomputed[batch.mask[i]], current[batch.mask[i]], atol=1e-5)
    # prompts are the chat template's tokens: they start with <|im_start|> and hold other workers' messages as text
    assert all(t.prompt_ids[0] == 1 for t in batch.turns)
    again = _batch(team)
    assert [(t.row, t.agent, t.prompt_ids, t.token_ids) for t in again.turns] == [
        (t.row, t.agent, t.prompt_ids, t.token_ids) for t in batch.turns
    ]
    assert torch.equal(again.behaviour_logprobs, batch.behaviour_logprobs)
    # a minibatch is the same episodes in the same layout
    rows = torch.tensor([3, 1])
    mb = batch.select(rows)
    with torch.no_grad():
        assert torch.allclose(team.logprobs(0, mb), team.logprobs(0, batch)[rows], atol=1e-6)
    assert torch.equal(mb.mask, batch.mask[:, rows]) and mb.width == batch.width


def _ids(batch: LLMRollout, agent: int) -> torch.Tensor:
    """(B, T) the agent's sampled ids in the trainer layout (0 off the mask)."""
    ids = torch.zeros(batch.batch_size, batch.width, dtype=torch.long)
    for t in batch.turns_of(agent):
        ids[t.row, t.offset : t.offset + len(t.token_ids)] = torch.tensor(t.token_ids)
    return ids


# ---------------------------------------------------------------------------------------------------------------
# own-token masking (docs/algorithms.md §6 claim 3)


def _pg_grads(team: LLMTeam, agent: int, batch: LLMRollout) -> tuple[list[torch.Tensor], list[Any]]:
    """Gradient of the agent's PPO-clip loss (trainer.team_loss) w.r.t. every agent's adapter."""
    cfg = TeamTRConfig()
    with torch.no_grad():
        adv = compute_advantages(batch, cfg)
        inputs = UpdateInputs(
            advantages=adv,
            agent_advantages={agent: adv},
            old_logprobs={agent: team.logprobs(agent, batch)},
            old_logits={},
            ref_logprobs={},
            happo_factor=None,
        )
    loss, _ = team_loss(team, [agent], batch, inputs, cfg, joint_ratio=False, kl_coefs={agent: 1.0}, kl_estimator="k3")
    assert math.isfinite(float(loss.detach()))
    params = [p for i in range(2) for p in team.parameters(i)]
    for p in params:
        p.requires_grad_(True)
    grads = torch.autograd.grad(loss, params, allow_unused=True)
    own = [g for p, g in zip(params, grads, strict=True) if any(p is q for q in team.parameters(agent))]
    others = [g for p, g in zip(params, grads, strict=True) if not any(p is q for q in team.parameters(agent))]
    return [torch.zeros(()) if g is None else g for g in own], others


def test_gradient_only_from_own_tokens(team: LLMTeam) -> None:
    """A worker's policy-gradient is unchanged when the OTHER worker's sampled ids are replaced, never reaches the
    other worker's adapter, and is exactly zero (not missing) when the worker has no tokens in the batch."""
    batch = dataclasses.replace(_batch(team, seed=1), rewards=torch.tensor([1.0, 0.0, 0.0, 1.0]))  # Â ≠ 0
    grads, others = _pg_grads(team, 0, batch)
    assert any(float(g.abs().sum()) > 0 for g in grads)
    assert all(g is None or float(g.abs().sum()) == 0.0 for g in others)

    rng = torch.Generator().manual_seed(7)
    swapped = [
        t
        if t.agent == 0
        else dataclasses.replace(
            t,
            token_ids=tuple(torch.randint(49152, (len(t.token_ids),), generator=rng).tolist()),
            logprobs=(-1.0,) * len(t.token_ids),
        )
        for t in batch.turns
    ]
    other = LLMRollout.build(swapped, batch.episodes, batch.rewards, batch.group_ids, 2, width=batch.width)
    assert not torch.equal(_ids(other, 1), _ids(batch, 1))
    grads_swapped, _ = _pg_grads(team, 0, other)
    for g, h in zip(grads, grads_swapped, strict=True):
        assert torch.equal(g, h)

    no_critic = LLMRollout.build(
        [t for t in batch.turns if t.agent == 0], batch.episodes, batch.rewards, batch.group_ids, 2, width=batch.width
    )
    assert not bool(no_critic.mask[1].any())
    grads_none, _ = _pg_grads(team, 1, no_critic)
    assert all(float(g.abs().sum()) == 0.0 for g in grads_none)


# ---------------------------------------------------------------------------------------------------------------
# LoRA isolation


def test_update_moves_only_that_workers_adapter(team: LLMTeam) -> None:
    """One trainer update of worker 0: the shared base (frozen, requires_grad False) and worker 1's adapter are
    bit-identical afterwards; worker 0's adapter moved."""
    base = {k: v.detach().clone() for k, v in team.base_parameters().items()}
    assert not any(p.requires_grad for p in team.base_parameters().values())
    before = [team.state(i) for i in range(2)]
    batch = dataclasses.replace(_batch(team, seed=2), rewards=torch.tensor([1.0, 0.0, 1.0, 0.0]))
    cfg = TeamTRConfig(trust_region="none", lr=1e-2, num_epochs=1)
    metrics, _ = update_agents(
        team, [0], batch, cfg, states={0: AgentState(), 1: AgentState()}, shuffle=torch.Generator().manual_seed(0)
    )
    assert metrics["trust/optimizer_steps"] == 1.0
    for k, v in team.base_parameters().items():
        assert torch.equal(v, base[k]), k
    after = [team.state(i) for i in range(2)]
    assert all(torch.equal(after[1][k], before[1][k]) for k in before[1])
    assert any(not torch.equal(after[0][k], before[0][k]) for k in before[0])
    assert all(".solver." in k for k in after[0]) and all(".critic." in k for k in after[1])


# ---------------------------------------------------------------------------------------------------------------
# the trainer end to end on the tiny team: metrics, held-out success, run directory, resume


def _without_perf(rows: list[dict[str, float]]) -> list[dict[str, float]]:
    return [
        {k: v for k, v in r.items() if not k.startswith("perf/") or k.startswith("perf/team_success")} for r in rows
    ]


def test_train_tiny_team_and_resume(random_team: LLMTeam, tmp_path: Path) -> None:
    """train() on the tiny LLM team: every per-update metric present and finite (exact-vocabulary KL included), the
    held-out success logged per stage, the run directory written; resuming after stage 1 gives the same run."""
    team = random_team
    init = [team.state(i) for i in range(2)]
    cfg = TeamTRConfig(num_stages=2, batch_size=4, lr=1e-2, delta=0.05, order="random", seed=1)
    full = train(team, cfg, out_dir=tmp_path / "full")
    assert len(full.updates) == 4 and len(full.stages) == 2
    for row in full.updates:
        _finite(row, (*UPDATE_KEYS, "kl/exact"))
        name = team.agent_names[int(row["rollout/agent"])]  # the updated worker
        _finite(row, [f"agent/{name}/{k}" for k in (*AGENT_KEYS, "kl_exact")])
        assert row[f"agent/{name}/behaviour_gap"] <= 1e-4
    assert any(row["losses/adv_abs_max"] > 0 and row["kl/exact"] > 0 for row in full.updates)  # adapters moved
    for row in full.stages:
        assert 0.0 <= row["perf/team_success"] <= 1.0 and math.isfinite(row["certificate/proxy"])
    assert all((tmp_path / "full" / f).exists() for f in RUN_FILES)
    assert json.loads((tmp_path / "full" / "config.json").read_text())["team"]["workers"] == ["solver", "critic"]
    final = [team.state(i) for i in range(2)]

    for i, s in enumerate(init):
        team.load_state(i, s)
    train(team, dataclasses.replace(cfg, num_stages=1), out_dir=tmp_path / "resumed")
    for i, s in enumerate(init):  # a fresh process would rebuild the team: same config, initial adapters
        team.load_state(i, s)
    resumed = train(team, cfg, out_dir=tmp_path / "resumed", resume=True)
    assert _without_perf(resumed.updates) == _without_perf(full.updates)
    for i in range(2):
        assert all(torch.equal(team.state(i)[k], final[i][k]) for k in final[i])


@pytest.mark.parametrize(("scheme", "sampled_by"), [("teamtr", "updated"), ("stale_indep", "stage_start")])
def test_teamtr_second_batch_is_sampled_by_the_first_worker_as_updated(
    random_team: LLMTeam, scheme: str, sampled_by: str
) -> None:
    """teamtr on the LLM path: the batch the second worker trains on was sampled with the FIRST worker's updated
    adapter, not its stage-start one (no adapter copy, prefix or KV cache outlives an update). The first worker's
    recorded behaviour log-probs on that batch match its parameters after the update and not those before it.
    The stale_indep control is the mirror image: its second batch is new, but sampled by the stage-start team, and
    the first worker's update is back in place for the second worker's update and after it."""
    team = random_team
    init = [team.state(i) for i in range(2)]
    gaps: dict[str, float] = {}

    def before_update(stage: int, agents: tuple[int, ...], batch: Any) -> None:
        if agents != (1,):
            return
        own = batch.mask[0]
        assert bool(own.any()), "the solver took no turn in the critic's batch"
        with torch.no_grad():
            gaps["updated"] = float((team.logprobs(0, batch) - batch.behaviour_logprobs[0]).abs()[own].max())
            now = team.state(0)
            gaps["solver_moved"] = float(any(not torch.equal(now[k], init[0][k]) for k in now))
            team.load_state(0, init[0])
            gaps["stage_start"] = float((team.logprobs(0, batch) - batch.behaviour_logprobs[0]).abs()[own].max())
            team.load_state(0, now)

    cfg = TeamTRConfig(
        num_stages=1,
        batch_size=4,
        lr=5e-2,
        trust_region="none",
        order="fixed",
        seed=3,
        scheme=scheme,  # type: ignore[arg-type]
    )
    try:
        log = train(team, cfg, hooks=TrainHooks(before_update=before_update))
    finally:
        moved = any(not torch.equal(team.state(0)[k], init[0][k]) for k in init[0])
        for i, s in enumerate(init):
            team.load_state(i, s)
    other = "stage_start" if sampled_by == "updated" else "updated"
    assert [int(u["rollout/agent"]) for u in log.updates] == [0, 1] and moved
    assert gaps["solver_moved"] == 1.0  # the critic's update happens in the team with the solver's update in place
    assert gaps[sampled_by] <= 1e-4  # sampled by the solver as it is after its update (teamtr), before it (control)
    assert gaps[other] > 100 * max(gaps[sampled_by], 1e-6)  # and the update is large enough to tell


def test_separate_bases_and_frozen_workers(tiny_cfg: LLMTeamConfig) -> None:
    """``shared_base=False``: one base per worker (heterogeneous teams), each with its own adapter, same invariant.
    A worker left out of ``workers`` is frozen: served by the base with adapters off, never recorded."""
    separate = LLMTeam(dataclasses.replace(tiny_cfg, shared_base=False, eval_tasks=0))
    assert separate.model_of(0) is not separate.model_of(1)
    assert {k.split(".")[0] for k in separate.base_parameters()} == {"base0", "base1"}
    batch = _batch(separate)
    for i in range(2):
        with torch.no_grad():
            gap = (separate.logprobs(i, batch) - batch.behaviour_logprobs[i]).abs()[batch.mask[i]]
        assert gap.numel() > 0 and float(gap.max()) <= 1e-4

    solo = LLMTeam(dataclasses.replace(tiny_cfg, workers=("solver",), eval_tasks=0))
    batch = _batch(solo)
    assert batch.mask.shape[0] == 1 and {t.agent for t in batch.turns} == {0}
    critic_ids = {
        s.message.model_id for e in batch.episodes for s in e.steps if s.message and s.message.worker == "critic"
    }
    assert critic_ids == {solo.backends[0].model_id}  # the base, no adapter


def test_settings_are_checked_before_loading(duo_file: Path) -> None:
    with pytest.raises(LLMTeamError, match=r"unknown worker 'planner'.*\['solver', 'calculator', 'critic'\]"):
        LLMTeam(LLMTeamConfig(team=str(duo_file), workers=("planner",)))
    with pytest.raises(LLMTeamError, match="'calculator' .* is a tool"):
        LLMTeam(LLMTeamConfig(team=str(duo_file), workers=("calculator",)))
    with pytest.raises(LLMTeamError, match="checkpoint folder '/no/such/cql' does not exist"):
        LLMTeam(LLMTeamConfig(team=str(duo_file), conductor="cql:/no/such/cql"))
    with pytest.raises(LLMTeamError, match="temperature > 0"):
        LLMTeamConfig(temperature=0.0)
    with pytest.raises(LLMTeamError, match="name each trainable worker once"):
        LLMTeamConfig(workers=("solver", "solver"))


def test_batch_size_must_be_a_multiple_of_the_group(team: LLMTeam) -> None:
    with pytest.raises(LLMTeamError, match="not a multiple of group_size"):
        team.sample(3, torch.Generator())


@dataclasses.dataclass
class _Episode:
    total_tokens: int = 2


def test_turn_offsets_are_recomputed_by_build() -> None:
    """Offsets: an agent's turns in one episode follow each other in its row; T = the longest row."""
    turns = [
        Turn(0, 0, (1, 5), (7, 8), (-1.0, -2.0)),
        Turn(0, 0, (1, 6), (9,), (-3.0,)),
        Turn(1, 1, (1,), (4,), (-0.5,)),
    ]
    episodes: Any = [_Episode(), _Episode()]  # build reads total_tokens only
    batch = LLMRollout.build(turns, episodes, torch.zeros(2), torch.zeros(2, dtype=torch.long), 2)
    assert [t.offset for t in batch.turns] == [0, 2, 0] and batch.width == 3
    assert batch.behaviour_logprobs[0, 0].tolist() == [-1.0, -2.0, -3.0]
    assert batch.mask[1].tolist() == [[False] * 3, [True, False, False]] and batch.num_tokens == 4


# ---------------------------------------------------------------------------------------------------------------
# the CLI


def test_cli_finetune_help(capsys: pytest.CaptureFixture[str]) -> None:
    from orchestra.cli import main

    with pytest.raises(SystemExit) as e:
        main(["finetune", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--scheme", "--workers", "--conductor", "--group-size", "--delta", "--resume", "--config", "--dtype"):
        assert flag in out
    assert "bfloat16" in out and "smollm2_gpu.yaml" in out


def test_cli_finetune_bad_input(tmp_path: Path, duo_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from orchestra.cli import main

    assert main(["finetune", "--team", str(duo_file), "--workers", "calculator", "--out", str(tmp_path / "r")]) == 2
    assert "'calculator'" in capsys.readouterr().err
    bad = tmp_path / "bad.yaml"
    bad.write_text("team: {workers: [solver], lora_rank: 4}\n")
    assert main(["finetune", "--config", str(bad), "--out", str(tmp_path / "r")]) == 2
    assert "team.lora_rank: unknown field of LLMTeamConfig" in capsys.readouterr().err
    assert main(["finetune", "--model", str(tmp_path / "none.gguf"), "--out", str(tmp_path / "r")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_cli_finetune_tiny_run(tmp_path: Path, duo_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A whole ``orchestra finetune`` on the tiny model: run directory, peft adapter folders, printed metrics."""
    from orchestra.cli import main

    args = ["finetune", "--team", str(duo_file), "--model", "tiny", "--workers", "solver", "critic"]
    args += ["--stages", "1", "--batch-size", "2", "--group-size", "2", "--max-tokens", "3", "--out", str(tmp_path)]
    assert main([*args, "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "per-update metrics" in out and "kl_k3" in out and "solver" in out and "critic" in out
    assert all((tmp_path / f).exists() for f in RUN_FILES)
    for name in ("solver", "critic"):
        assert (tmp_path / "adapters" / name / "adapter_config.json").is_file()
    assert main([*args, "--out", str(tmp_path / "live")]) == 0  # without --quiet: live lines, then the tables
    live = capsys.readouterr().out
    assert live.count("  stage 0       solver:") == 2 and live.count("  stage 0: ") == 2
    assert main([*args, "--quiet"]) == 2  # the run exists: --resume or a new --out
    assert "--resume" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------------------------
# the real SmolLM2 team: one stage end to end on CPU


@pytest.mark.slow
def test_smollm2_one_stage_smoke(tmp_path: Path) -> None:
    """One TeamTR stage of solver + critic (the embedded SmolLM2, one frozen base, two LoRA adapters) on arithmetic
    under a pipeline calling both: 2 tasks × G = 2, 24 tokens per turn, temperature 1."""
    team = LLMTeam(
        LLMTeamConfig(
            team="arithmetic",
            conductor="pipeline",
            pipeline=("solver:solve", "critic:check", "solver:revise"),
            embedder="hash",
            workers=("solver", "critic"),
            max_tokens=24,
            temperature=1.0,
            group_size=2,
            num_envs=4,
        ),
        log=print,
    )
    cfg = TeamTRConfig(num_stages=1, batch_size=4, lr=1e-4, delta=0.01, order="fixed", seed=0)
    log = train(team, cfg, out_dir=tmp_path)
    assert len(log.updates) == 2 and len(log.stages) == 1
    for row in log.updates:
        print({k: round(v, 5) for k, v in row.items() if not k.startswith("agent/")})
        _finite(row, UPDATE_KEYS)
        name = team.agent_names[int(row["rollout/agent"])]
        _finite(row, [f"agent/{name}/{k}" for k in AGENT_KEYS])
        if row[f"agent/{name}/num_tokens"] > 0:
            assert row[f"agent/{name}/behaviour_gap"] <= 1e-3  # measured ≈ 2e-6 mean, 2e-5 max (fp32 CPU)
    assert log.updates[-1]["rollout/episodes"] == 8 and log.updates[-1]["rollout/tokens"] > 0
    assert all((tmp_path / f).exists() for f in RUN_FILES)
    assert (tmp_path / "checkpoints" / "stage-0001" / "adapters" / "critic.safetensors").is_file()


def test_llm_coalition_values_replay_the_team_with_workers_replaced(team: LLMTeam) -> None:
    """Credit on an LLM team: v(S) replays fixed train episodes with the workers outside S replaced by the null
    (common random numbers: the same tasks and seeds for every coalition, so v(N) repeats exactly)."""
    full = frozenset({0, 1})
    v_full = team.coalition_value(full, "drop")
    assert team.coalition_value(full, "drop") == v_full  # deterministic replay
    v_none = team.coalition_value(frozenset(), "drop")
    assert v_none != v_full  # empty messages change the team's returns (token costs, verdicts)
    assert math.isfinite(team.coalition_value(frozenset({0}), "reference"))
    with pytest.raises(LLMTeamError, match="uniform"):
        team.coalition_value(full, "uniform")
    from orchestra.teamtr.trainer import credit_weights

    phi, w = credit_weights(team, TeamTRConfig(credit="shapley", credit_null="drop"), 0)
    assert sum(phi.values()) == pytest.approx(v_full - v_none)  # efficiency
    assert set(w) == {0, 1}


def test_shared_prompt_forward_gives_the_same_logprobs_and_gradients(team: LLMTeam) -> None:
    """Training forwards run a prompt shared by a group's samples once: log-probs, exact logits and gradients equal
    those of the padded batch of full sequences (share_prompts off)."""
    batch = team.sample(4, torch.Generator().manual_seed(5))
    turns = batch.turns_of(0)
    assert len({t.prompt_ids for t in turns}) < len(turns)  # the group's first turns share their prompt

    def run(share: bool) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        team.cfg = dataclasses.replace(team.cfg, share_prompts=share)
        for p in team.parameters(0):
            p.grad = None
        logp = team.logprobs(0, batch)
        (logp * batch.mask[0]).sum().backward()
        grads = [p.grad.detach().clone() for p in team.parameters(0)]
        with torch.no_grad():
            logits = team.logits(0, batch)
        return logp.detach(), logits, grads

    try:
        a, la, ga = run(True)
        b, lb, gb = run(False)
    finally:
        team.cfg = dataclasses.replace(team.cfg, share_prompts=True)
        for p in team.parameters(0):
            p.grad = None
    assert torch.allclose(a, b, atol=1e-4), float((a - b).abs().max())
    assert torch.allclose(la, lb, atol=1e-4)
    assert all(torch.allclose(x, y, atol=1e-4, rtol=1e-3) for x, y in zip(ga, gb, strict=True))
    assert any(float(g.abs().max()) > 0 for g in ga)
