"""Stage-0 alignment in an LLM team (orchestra/teamtr/align_llm.py, ``orchestra align llm``) on tiny random Llamas
with the SmolLM2 tokenizer: probes are exactly the incumbent's turns, the incumbent's KL to itself is 0, alignment
of a newcomer of another seed reaches δ_0, another tokenizer family is refused, and the command end to end."""

from __future__ import annotations

import dataclasses
import json
import re
from collections import defaultdict
from pathlib import Path

import pytest
import torch

from orchestra.teamtr.align import AlignConfig, AlignError, probe_kl
from orchestra.teamtr.align_llm import (
    LLMProbes,
    LLMSwapConfig,
    LLMWorkerPolicy,
    build_incumbent_team,
    check_newcomer_tokenizer,
    harvest_llm_probes,
    incumbent_team_config,
    llm_swap_shock,
    load_adapter_folder,
    newcomer_config,
)
from orchestra.teamtr.config import seeded_generator
from orchestra.teamtr.llm import LLMTeam
from orchestra.teamtr.llm_config import LLMTeamConfig
from orchestra.teamtr.llm_models import load_tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")

INSTRUCTIONS = {"solve": "Solve this problem.", "revise": "Redo the calculation."}
OUT_FILES = ("config.json", "report.json", "report.md", "metrics.csv", "metrics.jsonl", "kl_curve.png")


@pytest.fixture(scope="module")
def cfg(duo_file: Path) -> LLMTeamConfig:
    """The incumbent's team: the tiny base (seed 0), worker solver trainable (its adapter = the incumbent)."""
    return LLMTeamConfig(
        team=str(duo_file), model="tiny", workers=("solver",), max_tokens=3, group_size=1, num_envs=4, eval_tasks=2
    )


@pytest.fixture(scope="module")
def team(cfg: LLMTeamConfig) -> LLMTeam:
    return LLMTeam(cfg)


@pytest.fixture(scope="module")
def fine_tuned(team: LLMTeam, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A "fine-tuned" solver adapter (random LoRA B) as a peft folder, like RUN/adapters/solver of a finetune run."""
    g = torch.Generator().manual_seed(3)
    init = team.state(0)
    team.load_state(0, {k: torch.randn(v.shape, generator=g) * 0.5 if "lora_B" in k else v for k, v in init.items()})
    path = team.save_adapters(tmp_path_factory.mktemp("finetune") / "adapters")["solver"]
    team.load_state(0, init)
    return path


@pytest.fixture(scope="module")
def other_family(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A local HF model folder whose tokenizer is SmolLM2's plus one token (another vocabulary)."""
    from transformers import AutoTokenizer, LlamaConfig

    folder = tmp_path_factory.mktemp("other") / "other-lm"
    load_tokenizer("tiny").save_pretrained(str(folder))  # the cached tokenizer itself is not modified
    tok = AutoTokenizer.from_pretrained(str(folder))
    tok.add_tokens(["<other-family>"])
    tok.save_pretrained(str(folder))
    LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1).save_pretrained(
        str(folder)
    )
    return folder


# ---------------------------------------------------------------------------------------------------------------
# probes


def test_probes_are_exactly_the_incumbents_turns(team: LLMTeam) -> None:
    """Probe n = a solver turn of the current team's rollouts: its sampled ids are the solver's message ids, its
    prompt ids the exact context (the teacher-forced incumbent reproduces the sampling log-probs); layout (N, T)
    left-aligned with T = the longest turn, kept by ``select``; held-out probes come from another stream."""
    probes = harvest_llm_probes(team, 0, 4, torch.Generator().manual_seed(7))
    with torch.no_grad():
        batch = team.sample(4, torch.Generator().manual_seed(7))  # the same rollouts (CPU: exact)
    tokenizer = load_tokenizer("tiny")
    per_row: dict[int, list[tuple[int, ...]]] = defaultdict(list)
    for t in probes.turns:
        per_row[t.row].append(t.token_ids)
    for row, ep in enumerate(batch.episodes):
        steps = [s for s in ep.steps if s.message is not None and s.message.worker == "solver"]
        assert per_row[row] == [tuple(s.message.token_ids) for s in steps if s.message is not None]
        turns = [t for t in probes.turns if t.row == row]
        for t, s in zip(turns, steps, strict=True):  # the solver's instruction is in its prompt
            assert INSTRUCTIONS[str(s.action.instruction)] in tokenizer.decode(t.prompt_ids)
    assert probes.size == len(batch.turns_of(0)) >= 4
    lengths = probes.lengths
    assert probes.width == int(lengths.max()) and probes.mask.sum(1).tolist() == lengths.tolist()
    assert probes.mask[:, 0].all()  # left-aligned

    # a shorter turn (a prefix of one) makes the layout ragged: padding must not change any probed position
    t0 = probes.turns[0]
    short = dataclasses.replace(t0, token_ids=t0.token_ids[:1], logprobs=t0.logprobs[:1])
    ragged = LLMProbes((*probes.turns, short), probes.width)
    policy = LLMWorkerPolicy(team, 0)
    with torch.no_grad():
        logits = policy.logits(ragged)  # (N, T, V)
    assert logits.shape == (ragged.size, ragged.width, 49152)
    mask = ragged.mask
    logp = torch.log_softmax(logits, -1).gather(-1, ragged.token_ids().unsqueeze(-1)).squeeze(-1)
    gap = (logp - ragged.behaviour_logprobs()).abs()[mask]
    assert gap.numel() == probes.num_tokens + 1 and float(gap.max()) <= 1e-4
    assert float(logits[~mask].abs().sum()) == 0.0
    assert mask[-1].tolist() == [True] + [False] * (ragged.width - 1)

    sub = ragged.select(torch.tensor([ragged.size - 1, 0]))
    assert sub.width == ragged.width and sub.turns == (short, t0)
    heldout = harvest_llm_probes(team, 0, 4, torch.Generator().manual_seed(8))
    assert [t.prompt_ids for t in heldout.turns] != [t.prompt_ids for t in probes.turns]


def test_incumbent_kl_to_itself_is_zero(team: LLMTeam, cfg: LLMTeamConfig) -> None:
    probes = harvest_llm_probes(team, 0, 2, seeded_generator(0, 0))
    incumbent = LLMWorkerPolicy(team, 0)
    rev, fwd = probe_kl(incumbent, incumbent, probes, chunk=4)
    assert rev == pytest.approx(0.0, abs=1e-7) and fwd == pytest.approx(0.0, abs=1e-7)
    with pytest.raises(AlignError, match="would be the incumbent"):  # a tiny newcomer needs another seed
        newcomer_config(cfg, LLMSwapConfig(newcomer="tiny", newcomer_seed=0))
    with pytest.raises(AlignError, match="would move the base"):
        LLMWorkerPolicy(LLMTeam(dataclasses.replace(cfg, workers=("solver", "critic"), eval_tasks=0)), 0, "all")


# ---------------------------------------------------------------------------------------------------------------
# alignment and swap shock


def test_alignment_of_a_newcomer_of_another_seed_reaches_delta0(cfg: LLMTeamConfig) -> None:
    """A tiny newcomer of another seed, all its weights trained (a fresh LoRA alone cannot move its random
    lm_head onto the incumbent's), reaches δ_0 = 1e-3 on held-out probes from ≈ 0.013 (one token per turn: the
    contexts share the chat template's suffix, so held-out positions are like the train ones). The incumbent team
    is untouched: its adapter and its worker entries."""
    team = LLMTeam(dataclasses.replace(cfg, max_tokens=1))
    served = team.workers["solver"], team.eval_workers["solver"]
    before = team.state(0)
    swap = LLMSwapConfig(newcomer="tiny", newcomer_seed=5, train_params="all")
    align_cfg = AlignConfig(
        delta_0=1e-3, lr=1e-2, max_steps=60, batch_size=16, num_train_probes=8, num_heldout_probes=4, seed=0
    )
    rows: list[dict[str, float]] = []
    report = llm_swap_shock(team, swap, align_cfg, on_check=rows.append)
    a = report.align
    print(
        f"stopped by {a.stopped} after {a.steps} steps: held-out KL {a.kl_heldout_before:.5f} → {a.kl_heldout_after:.5f}"
    )
    assert a.stopped == "delta_0" and a.kl_heldout_after <= 1e-3 < a.kl_heldout_before / 10
    assert a.kl_heldout_before > 5e-3 and rows[0]["kl/heldout"] == a.kl_heldout_before and len(rows) == len(a.history)
    for j in (report.j_before, report.j_direct, report.j_aligned):
        assert 0.0 <= j <= 1.0
    m = report.meta
    assert m["worker"] == "solver" and m["newcomer"] == "tiny-llama-s5" and m["train_params"] == "all"
    assert m["num_train_probes"] == 16 and m["num_heldout_probes"] == 8 and m["probe_width"] == 1  # 2 turns/episode
    assert set(report.diagnostics_after) == {"probe/nll_sampled", "probe/argmax_agreement"}
    assert all(torch.equal(v, team.state(0)[k]) for k, v in before.items())
    assert (team.workers["solver"], team.eval_workers["solver"]) == served


def test_other_tokenizer_family_is_refused(cfg: LLMTeamConfig, other_family: Path) -> None:
    swap = LLMSwapConfig(newcomer=str(other_family))
    with pytest.raises(AlignError, match=r"newcomer '.*other-lm'.*incumbent 'tiny' \(worker 'solver'\)") as e:
        check_newcomer_tokenizer(cfg, swap)
    assert "vocabulary sizes differ (49152 vs 49153)" in str(e.value)


def test_incumbent_adapter_is_loaded_from_a_peft_folder(cfg: LLMTeamConfig, fine_tuned: Path, team: LLMTeam) -> None:
    """``--incumbent-adapter``: the team takes the folder's LoRA layout (r = 8 over a requested 4) and weights; a
    team of another layout cannot load it."""
    inc = build_incumbent_team(dataclasses.replace(cfg, lora_r=4), LLMSwapConfig(incumbent_adapter=str(fine_tuned)))
    state, fresh = inc.state(0), team.state(0)
    assert inc.cfg.lora_r == 8 and state.keys() == fresh.keys()
    assert any(not torch.equal(state[k], fresh[k]) for k in state)
    with pytest.raises(AlignError, match="LoRA layout differs"):
        load_adapter_folder(LLMTeam(dataclasses.replace(cfg, lora_r=4, eval_tasks=0)), 0, fine_tuned)

    run = fine_tuned.parent.parent  # a finetune run dir: its config.json names the base the adapter was trained on
    (run / "config.json").write_text(json.dumps({"team": dataclasses.asdict(dataclasses.replace(cfg, seed=3))}))
    try:
        with pytest.raises(
            AlignError, match=r"trained on base 'tiny' \(seed 3.*pass the finetune run's --model and --seed"
        ):
            incumbent_team_config(cfg, LLMSwapConfig(incumbent_adapter=str(fine_tuned)))
        incumbent_team_config(dataclasses.replace(cfg, seed=3), LLMSwapConfig(incumbent_adapter=str(fine_tuned)))
    finally:
        (run / "config.json").unlink()


# ---------------------------------------------------------------------------------------------------------------
# the CLI


def test_cli_align_llm_help(capsys: pytest.CaptureFixture[str]) -> None:
    from orchestra.cli import main

    with pytest.raises(SystemExit) as e:
        main(["align", "llm", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--worker", "--incumbent-adapter", "--newcomer", "--newcomer-adapter", "--eval-tasks", "--delta0"):
        assert flag in out
    assert "--probes" in out and "(default: 16)" in out  # the LLM-sized defaults of the shared flags


def test_cli_align_llm_end_to_end(tmp_path: Path, duo_file: Path, fine_tuned: Path) -> None:
    """Swap the fine-tuned solver for its fresh base (tiny, seed 0; adapter trained): files written, the held-out KL
    more than halved in 20 steps (stopped by max_steps), the aligned adapter saved as a peft folder."""
    from orchestra.cli import main

    out = tmp_path / "run"
    args = ["align", "llm", "--team", str(duo_file), "--worker", "solver", "--model", "tiny"]
    args += ["--incumbent-adapter", str(fine_tuned), "--newcomer", "tiny", "--newcomer-seed", "0"]
    args += ["--eval-tasks", "2", "--probes", "8", "--heldout-probes", "4", "--max-tokens", "1", "--num-envs", "4"]
    args += ["--batch-size", "16", "--lr", "1e-2", "--max-steps", "20", "--delta0", "1e-4", "--out", str(out)]
    assert main([*args, "--quiet"]) == 0
    assert all((out / f).is_file() for f in OUT_FILES)
    assert (out / "adapters" / "solver" / "adapter_config.json").is_file()
    report = json.loads((out / "report.json").read_text())
    a = report["align"]
    print(
        f"J {report['j_before']} / {report['j_direct']} / {report['j_aligned']}; KL {a['kl_heldout_before']:.5f} → {a['kl_heldout_after']:.5f}"
    )
    assert a["stopped"] == "max_steps" and a["steps"] == 20
    assert a["kl_heldout_after"] < 0.5 * a["kl_heldout_before"]
    config = json.loads((out / "config.json").read_text())
    assert config["mode"] == "llm" and config["swap"]["incumbent_adapter"] == str(fine_tuned)
    assert config["newcomer"]["seed"] == 0 and config["team"]["workers"] == ["solver"]
    assert "aligned swap" in (out / "report.md").read_text()
    assert main([*args, "--quiet"]) == 2  # the run exists


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--worker", "planner"], "unknown worker 'planner'"),
        (["--worker", "calculator"], "'calculator' .* is a tool"),
        (["--incumbent-adapter", "/no/such/adapter"], "--incumbent-adapter '/no/such/adapter': no such folder"),
        (["--newcomer-adapter", "."], r"--newcomer-adapter '\.' is not a peft adapter folder"),
        (["--eval-tasks", "0"], "team.eval_tasks must be ≥ 1"),
        (["--newcomer", "/no/such/model"], "model '/no/such/model' does not exist"),
    ],
)
def test_cli_align_llm_bad_input(
    tmp_path: Path, duo_file: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    from orchestra.cli import main

    args = ["align", "llm", "--team", str(duo_file), "--model", "tiny", "--newcomer", "tiny", "--quiet"]
    assert main([*args, "--out", str(tmp_path / "r"), *extra]) == 2
    assert re.search(message, capsys.readouterr().err)
    assert not (tmp_path / "r" / "config.json").exists()


def test_cli_align_llm_refuses_another_tokenizer_family(
    tmp_path: Path, duo_file: Path, other_family: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from orchestra.cli import main

    args = ["align", "llm", "--team", str(duo_file), "--model", "tiny", "--newcomer", str(other_family)]
    assert main([*args, "--out", str(tmp_path / "r"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "not one tokenizer family" in err and "'tiny'" in err and "other-lm" in err
