"""Stage-0 alignment (orchestra/teamtr/align.py, orchestra/jobs/align.py): the reverse-KL loss against hand and
torch computations, the loop's stopping rule and determinism, the swap-shock ACCEPTANCE check on the chain, the
tokenizer-family check and the ``orchestra align chain`` command."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from orchestra.teamtr.align import (
    AlignConfig,
    AlignError,
    align,
    check_tokenizer_family,
    probe_kl,
    recovered_fraction,
    reverse_kl_loss,
    write_report,
)
from orchestra.teamtr.align_chain import (
    ChainAgentPolicy,
    ChainProbes,
    ChainSwapConfig,
    build_chain_newcomer,
    chain_swap_shock,
    harvest_chain_probes,
)
from orchestra.teamtr.chain import ChainConfig, ChainTeam, team_success, warm_start
from orchestra.teamtr.config import seeded_generator

pytestmark = pytest.mark.usefixtures("one_thread")

V = 8
CHAIN = ChainConfig(n_agents=4, vocab_size=V, lora_r=8, lora_targets=("lm_head",), seed=3)
SMALL = AlignConfig(num_train_probes=256, num_heldout_probes=256, batch_size=128, lr=2e-2, max_steps=400, seed=1)


@pytest.fixture(scope="module")
def team() -> ChainTeam:
    """A warm-started chain (per-hop pass 0.85), the incumbent team of every chain test (never modified)."""
    t = ChainTeam(CHAIN)
    warm_start(t)
    return t


# ---------------------------------------------------------------------------------------------------------------
# the loss


def test_reverse_kl_loss_equals_hand_computation_and_kl_div() -> None:
    g = torch.Generator().manual_seed(0)
    new = torch.randn(3, 4, 5, generator=g, requires_grad=True)
    inc = torch.randn(3, 4, 5, generator=g)
    mask = torch.ones(3, 4, dtype=torch.bool)
    loss, metrics = reverse_kl_loss(new, inc, mask)
    p_new, p_inc = new.detach().double().softmax(-1), inc.double().softmax(-1)
    hand = (p_new * (p_new.log() - p_inc.log())).sum(-1).mean()  # KL(π_new ‖ π_inc), token mean
    assert float(loss.detach()) == pytest.approx(float(hand), rel=1e-5)
    # F.kl_div(input, target) = Σ target (log target − input): KL(target ‖ input) with target = the newcomer
    ref = F.kl_div(inc.log_softmax(-1), new.detach().log_softmax(-1), log_target=True, reduction="none").sum(-1)
    assert float(loss.detach()) == pytest.approx(float(ref.mean()), rel=1e-5)
    forward = (p_inc * (p_inc.log() - p_new.log())).sum(-1).mean()
    assert metrics["kl/forward"] == pytest.approx(float(forward), rel=1e-5)
    assert metrics["losses/num_tokens"] == 12 and metrics["kl/reverse_max"] >= metrics["losses/reverse_kl"] > 0
    loss.backward()  # gradients reach the newcomer only
    assert new.grad is not None and new.grad.abs().sum() > 0 and inc.grad is None


def test_reverse_kl_loss_is_zero_iff_equal_distributions() -> None:
    logits = torch.randn(2, 3, 6)
    mask = torch.ones(2, 3)
    assert float(reverse_kl_loss(logits, logits.clone(), mask)[0]) == pytest.approx(0.0, abs=1e-7)
    assert float(reverse_kl_loss(logits + 3.0, logits, mask)[0]) == pytest.approx(0.0, abs=1e-6)  # same softmax
    for seed in range(5):
        other = torch.randn(2, 3, 6, generator=torch.Generator().manual_seed(seed))
        assert float(reverse_kl_loss(other, logits, mask)[0]) > 1e-4


def test_reverse_kl_loss_masking() -> None:
    g = torch.Generator().manual_seed(1)
    new, inc = torch.randn(2, 3, 4, generator=g), torch.randn(2, 3, 4, generator=g)
    mask = torch.tensor([[1, 1, 0], [0, 1, 0]], dtype=torch.bool)
    full = reverse_kl_loss(new, inc, torch.ones(2, 3))[1]
    loss, metrics = reverse_kl_loss(new, inc, mask)
    per_token = F.kl_div(inc.log_softmax(-1), new.log_softmax(-1), log_target=True, reduction="none").sum(-1)
    assert float(loss) == pytest.approx(float(per_token[mask].mean()), rel=1e-5)
    assert metrics["losses/num_tokens"] == 3 and full["losses/num_tokens"] == 6
    junk = new.clone()
    junk[~mask] = 1e30  # masked positions never reach the result (or its gradient)
    junk.requires_grad_(True)
    loss_junk, _ = reverse_kl_loss(junk, inc, mask)
    loss_junk.backward()
    assert float(loss_junk.detach()) == pytest.approx(float(loss), rel=1e-5)
    assert junk.grad is not None and torch.isfinite(junk.grad).all() and junk.grad[~mask].abs().sum() == 0
    assert float(reverse_kl_loss(new, inc, torch.zeros(2, 3))[0]) == 0.0  # empty mask: 0, not NaN
    with pytest.raises(ValueError, match="tokenizer"):
        reverse_kl_loss(new, inc[..., :3], mask)


def test_config_and_recovered_fraction() -> None:
    for bad in ({"delta_0": 0.0}, {"delta_0": -1.0}, {"lr": 0.0}, {"check_every": 0}, {"batch_size": 0}):
        with pytest.raises(ValueError):
            AlignConfig(**bad)
    assert recovered_fraction(0.8, 0.2, 0.5) == pytest.approx(0.5)
    assert recovered_fraction(0.8, 0.2, 0.9) == pytest.approx(7 / 6)
    assert math.isnan(recovered_fraction(0.5, 0.5, 0.7)) and math.isnan(recovered_fraction(0.4, 0.5, 0.7))


# ---------------------------------------------------------------------------------------------------------------
# the loop on the chain


def _setup(
    team: ChainTeam, cfg: AlignConfig, swap: ChainSwapConfig
) -> tuple[ChainAgentPolicy, ChainAgentPolicy, ChainProbes, ChainProbes]:
    train = harvest_chain_probes(team, swap.agent, cfg.num_train_probes, seeded_generator(cfg.seed, 0))
    held = harvest_chain_probes(team, swap.agent, cfg.num_heldout_probes, seeded_generator(cfg.seed, 1))
    newcomer = build_chain_newcomer(team.cfg, swap)
    return ChainAgentPolicy(team, swap.agent), ChainAgentPolicy(newcomer, 0, swap.train_params), train, held


def test_probes_are_the_agents_inputs_in_fresh_rollouts(team: ChainTeam) -> None:
    probes = harvest_chain_probes(team, 2, 512, torch.Generator().manual_seed(0))
    assert probes.size == 512 and probes.mask.shape == (512, 1) and probes.mask.all()
    assert (probes.input_ids[:, 0] == team.bos_id).all()
    counts = torch.bincount(probes.input_ids[:, 1], minlength=V).double() / 512
    assert torch.allclose(counts, torch.full((V,), 1 / V, dtype=torch.double), atol=0.06)  # ~uniform occupancy
    assert probes.select(torch.tensor([3, 5])).input_ids.tolist() == probes.input_ids[[3, 5]].tolist()


def test_align_reaches_delta0_on_heldout_and_is_deterministic(team: ChainTeam) -> None:
    swap = ChainSwapConfig(agent=1)
    before = [team.adapter_state(i) for i in range(team.n_agents)]
    reports = []
    for _ in range(2):
        inc, new, train, held = _setup(team, SMALL, swap)
        reports.append(align(new, inc, train, held, SMALL))
    rep = reports[0]
    assert rep.stopped == "delta_0" and rep.kl_heldout_after <= SMALL.delta_0 < rep.kl_heldout_before
    assert rep.steps % SMALL.check_every == 0 and rep.steps == rep.history[-1]["align/step"]
    assert rep.history[0]["align/step"] == 0 and rep.history[0]["kl/heldout"] == rep.kl_heldout_before
    assert probe_kl(new, inc, held)[0] == pytest.approx(rep.kl_heldout_after, rel=1e-5)  # last check = the state
    assert [r["kl/heldout"] for r in reports[1].history] == [r["kl/heldout"] for r in rep.history]  # bit-identical
    for i, state in enumerate(before):  # the incumbent team never moves
        assert all(torch.equal(state[k], v) for k, v in team.adapter_state(i).items())


def test_align_stops_at_max_steps_and_without_steps_when_already_close(team: ChainTeam) -> None:
    swap = ChainSwapConfig(agent=0)
    inc, new, train, held = _setup(team, SMALL, swap)
    rep = align(new, inc, train, held, dataclasses.replace(SMALL, max_steps=3, check_every=2))
    assert rep.stopped == "max_steps" and rep.steps == 3 and [r["align/step"] for r in rep.history] == [0, 2, 3]
    rep = align(inc, inc, train, held, SMALL)  # the incumbent against itself: KL 0 ≤ δ_0 before any step
    assert rep.stopped == "delta_0" and rep.steps == 0 and rep.kl_heldout_after == pytest.approx(0.0, abs=1e-6)


def test_uncached_incumbent_and_whole_model_training(team: ChainTeam) -> None:
    cfg = dataclasses.replace(SMALL, max_steps=20, check_every=10)
    inc, new, train, held = _setup(team, cfg, ChainSwapConfig(agent=2))
    cached = align(new, inc, train, held, cfg)
    inc, new, train, held = _setup(team, cfg, ChainSwapConfig(agent=2))
    uncached = align(new, inc, train, held, dataclasses.replace(cfg, cache_incumbent=False, eval_batch_size=100))
    np.testing.assert_allclose(
        [r["kl/heldout"] for r in uncached.history], [r["kl/heldout"] for r in cached.history], rtol=1e-4
    )
    swap = ChainSwapConfig(agent=2, train_params="all")
    inc, new, train, held = _setup(team, SMALL, swap)
    base = {k: p.detach().clone() for k, p in new.team.base_parameters().items()}
    rep = align(new, inc, train, held, SMALL)
    assert rep.stopped == "delta_0"
    moved = [k for k, p in new.team.base_parameters().items() if not torch.equal(base[k], p)]
    assert any("layers.0." in k for k in moved)  # the transformer body trains, not only the head


# ---------------------------------------------------------------------------------------------------------------
# swap shock: the ACCEPTANCE check


def test_acceptance_direct_swap_drops_success_aligned_swap_recovers_half(team: ChainTeam, tmp_path: Path) -> None:
    swap = ChainSwapConfig(agent=1, newcomer="random", newcomer_seed=11)
    report = chain_swap_shock(team, swap, SMALL)
    assert report.j_before == pytest.approx(team_success(team), abs=1e-12)
    assert report.j_before - report.j_direct > 0.2  # a differently initialised worker breaks the chain
    assert report.recovered_fraction >= 0.5  # the acceptance; observed ≈ 1
    assert report.align.stopped == "delta_0" and report.align.kl_heldout_after <= SMALL.delta_0
    exact_after = report.diagnostics_after["kl/exact_occupancy_reverse"]
    assert exact_after == pytest.approx(report.align.kl_heldout_after, rel=0.2)  # sampled ≈ exact occupancy KL
    assert report.diagnostics_before["kl/exact_occupancy_reverse"] > exact_after
    paths = write_report(report, tmp_path)
    data = json.loads(paths["report"].read_text())
    assert data["j_direct"] == report.j_direct and data["align"]["stopped"] == "delta_0"
    assert len(data["align"]["history"]) == len(report.align.history)
    md = paths["markdown"].read_text()
    assert "| direct swap (newcomer, unaligned) |" in md and "recovered fraction" in md
    assert paths["metrics"].read_text().splitlines()[0].startswith("align/step,kl/train,kl/heldout")
    assert paths["plot"].stat().st_size > 0


# ---------------------------------------------------------------------------------------------------------------
# tokenizer family


def _tokenizer(vocab: dict[str, int], name: str, **special: str) -> object:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", name_or_path=name, **special)


def test_tokenizer_family_check(team: ChainTeam) -> None:
    check_tokenizer_family(8, 8)
    with pytest.raises(AlignError, match=r"newcomer B .* incumbent A: .*vocabulary sizes differ \(V = 8 vs V = 9\)"):
        check_tokenizer_family(8, 9, incumbent_name="A", newcomer_name="B")
    vocab = {"<unk>": 0, "<s>": 1, "a": 2, "b": 3, "c": 4}
    check_tokenizer_family(
        _tokenizer(vocab, "org/small", bos_token="<s>"), _tokenizer(vocab, "org/big", bos_token="<s>")
    )
    swapped = {**vocab, "a": 3, "b": 2}
    with pytest.raises(AlignError) as e:
        check_tokenizer_family(_tokenizer(vocab, "org/small"), _tokenizer(swapped, "other/model"))
    msg = str(e.value)
    assert "'org/small'" in msg and "'other/model'" in msg and "2 tokens map to different ids" in msg
    assert "'a': 2 vs 3" in msg
    with pytest.raises(AlignError, match=r"vocabulary sizes differ \(5 vs 6\).*bos_token differs"):
        check_tokenizer_family(_tokenizer(vocab, "x"), _tokenizer({**vocab, "d": 5}, "y", bos_token="<s>"))
    other_v = ChainTeam(dataclasses.replace(CHAIN, n_agents=1, vocab_size=V + 1, seed=5))
    with pytest.raises(AlignError, match=r"chain newcomer \(V=9.*chain agent 1 \(V=8\).*V = 8 vs V = 9"):
        chain_swap_shock(team, ChainSwapConfig(agent=1), SMALL, newcomer=other_v)
    with pytest.raises(AlignError, match="agent 4 out of range for a chain of 4"):
        chain_swap_shock(team, ChainSwapConfig(agent=4), SMALL)


# ---------------------------------------------------------------------------------------------------------------
# the command


def test_cli_align_chain_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from orchestra.cli import main

    out = tmp_path / "align"
    args = ["align", "chain", "--n", "3", "--agent", "2", "--train-stages", "1", "--probes", "256"]
    args += ["--heldout-probes", "256", "--out", str(out), "--seed", "2"]
    assert main(args) == 0
    captured = capsys.readouterr()
    assert "| aligned swap |" in captured.out and "align step" in captured.err and "TeamTR stages" in captured.err
    for name in ("config.json", "report.json", "report.md", "metrics.csv", "metrics.jsonl", "kl_curve.png"):
        assert (out / name).exists(), name
    assert (out / "newcomer.safetensors").exists() and (out / "incumbent_team" / "stages.csv").exists()
    config = json.loads((out / "config.json").read_text())
    assert (
        config["align"]["delta_0"] == 0.01 and config["team"]["n_agents"] == 3 and config["trainer"]["num_stages"] == 1
    )
    report = json.loads((out / "report.json").read_text())
    assert report["meta"]["agent"] == 2 and report["j_before"] > report["j_direct"]
    assert main(args) == 2  # a finished run directory is never overwritten (FileExistsError)
    assert "holds an align run already" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--agent", "5"], "agent 5 out of range for a chain of 4"),
        (["--delta0", "0"], "delta_0 must be > 0"),
        (["--delta0", "-0.1"], "delta_0 must be > 0"),
        (["--vocab-size", "1"], "vocab_size ≥ 2"),
        (["--train-stages", "-1"], "train_stages must be ≥ 0"),
        (["--newcomer-seed", "0"], "would not be differently initialised"),
    ],
)
def test_cli_bad_input_gives_a_clear_error(
    flags: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from orchestra.cli import main
    from orchestra.teamtr.config import derive_seed

    if flags[0] == "--newcomer-seed":
        flags = [flags[0], str(derive_seed(0, 0, bits=31))]  # the team's own seed at --seed 0
    assert main(["align", "chain", *flags, "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and message in err and "Traceback" not in err
    assert not (tmp_path / "x").exists()  # nothing built or written


def test_cli_help(capsys: pytest.CaptureFixture[str]) -> None:
    from orchestra.cli import main

    for cmd in (["align"], ["align", "chain"]):
        with pytest.raises(SystemExit) as e:
            main([*cmd, "--help"])
        assert e.value.code == 0
        text = capsys.readouterr().out
        assert f"usage: orchestra {' '.join(cmd)}" in text
    assert "--delta0" in text and "--newcomer" in text and "--train-params" in text


# ---------------------------------------------------------------------------------------------------------------
# Stage 0 against a real mismatch, and its baselines


def test_baseline_losses() -> None:
    from orchestra.teamtr.align import alignment_loss, forward_kl_loss, sample_labels, sft_loss

    g = torch.Generator().manual_seed(0)
    new = torch.randn(5, 2, V, generator=g)
    inc = torch.randn(5, 2, V, generator=g)
    mask = torch.ones(5, 2, dtype=torch.bool)
    want = F.kl_div(F.log_softmax(new, -1), F.log_softmax(inc, -1), log_target=True, reduction="none").sum(-1).mean()
    assert float(forward_kl_loss(new, inc, mask)) == pytest.approx(float(want), rel=1e-5)  # KL(inc ‖ new)
    labels = sample_labels(inc, torch.Generator().manual_seed(1))
    assert labels.shape == (5, 2)
    nll = -F.log_softmax(new, -1).gather(-1, labels.unsqueeze(-1)).mean()
    assert float(sft_loss(new, labels, mask)) == pytest.approx(float(nll), rel=1e-5)
    assert float(alignment_loss("reverse", new, inc, mask)) == pytest.approx(float(reverse_kl_loss(new, inc, mask)[0]))
    with pytest.raises(ValueError, match="labels"):
        alignment_loss("sft", new, inc, mask)
    with pytest.raises(ValueError, match="divergence"):
        AlignConfig(divergence="nope")  # type: ignore[arg-type]


def test_a_competent_mismatched_newcomer_breaks_the_team_until_aligned(team: ChainTeam) -> None:
    """The mismatched newcomer relays x as x + 1 (mod V) as reliably as the incumbent relays x as x: competent in its
    own convention, so the direct swap collapses J; every divergence then recovers it from the same start."""
    from orchestra.teamtr.chain import policy_matrix

    swap = ChainSwapConfig(agent=1, newcomer="mismatched")
    newcomer = build_chain_newcomer(team.cfg, swap)
    p = policy_matrix(newcomer, 0)
    shifted = float(p[np.arange(V), (np.arange(V) + 1) % V].mean())
    assert abs(shifted - team.cfg.warm_pass) <= team.cfg.warm_pass_tol  # competent, in its own convention
    results = {}
    for div in ("reverse", "forward", "sft"):
        cfg = dataclasses.replace(SMALL, divergence=div)  # type: ignore[arg-type]
        results[div] = chain_swap_shock(team, swap, cfg, newcomer=build_chain_newcomer(team.cfg, swap))
    r = results["reverse"]
    assert r.j_before - r.j_direct > 0.3  # a real swap shock
    assert all(x.j_direct == pytest.approx(r.j_direct) for x in results.values())  # the same start
    assert all(x.recovered_fraction > 0.8 for x in results.values()), {
        k: x.recovered_fraction for k, x in results.items()
    }
    assert results["reverse"].align.stopped == "delta_0" and results["forward"].align.stopped == "delta_0"


def test_cli_align_chain_compare(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from orchestra.cli import main

    out = tmp_path / "cmp"
    args = ["align", "chain", "--n", "3", "--train-stages", "0", "--newcomer", "mismatched", "--probes", "256"]
    args += ["--heldout-probes", "256", "--compare", "reverse", "forward", "sft", "--compare-seeds", "2"]
    assert main([*args, "--out", str(out), "--quiet"]) == 0
    text = capsys.readouterr().out
    assert "Stage 0 against its baselines" in text and "| forward | 2 |" in text
    import csv

    rows = list(csv.DictReader((out / "compare.csv").open()))
    assert len(rows) == 6 and {r["divergence"] for r in rows} == {"reverse", "forward", "sft"}
    assert "Stage 0 against its baselines" in (out / "report.md").read_text()
