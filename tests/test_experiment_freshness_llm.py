"""The paired freshness experiment on the real-LLM team (orchestra/experiments/freshness/llm_*.py): the fresh batch
shares the stale one's tasks and episode seeds, no upstream update gives the same episodes and identical arms, the
config, the statistics and the report, a smoke run with resume, extension and a refused config, the CLI."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import orchestra.experiments.freshness.llm_run as llm_run
from orchestra.experiments.freshness.analysis import holm, paired_summary
from orchestra.experiments.freshness.llm_analysis import analyse, summary_sections
from orchestra.experiments.freshness.llm_config import LLMFreshnessConfig, team_config, trainer_config
from orchestra.experiments.freshness.llm_run import (
    ARMS,
    PAIR_COLUMNS,
    branch,
    changed_rows,
    run_llm_freshness_experiment,
    run_pair,
)
from orchestra.experiments.harness import STILL_KL, read_rows
from orchestra.teamtr.llm import LLMTeam
from trajectories.rundir import ConfigMismatchError

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def cfg(duo_file: Path) -> LLMFreshnessConfig:
    """The smoke preset on the duo team under the random conductor (the tests' LLM team: both workers speak in every
    batch and the episodes' lengths, so their returns, vary, so the adapters move)."""
    smoke = LLMFreshnessConfig.smoke()
    return replace(
        smoke, team=replace(smoke.team, team=str(duo_file), pipeline=(), conductor="random", reward="return")
    )


def _critic_sum(team: LLMTeam, tasks: Any, cfg: LLMFreshnessConfig) -> float:
    """A stand-in for the held-out success that sees every change of the critic's adapter (the tiny random model
    solves nothing, so its real success is 0 in every arm)."""
    return float(sum(p.detach().double().sum() for p in team.parameters(1)))


def test_fresh_batch_has_the_stale_batch_tasks_and_seeds(cfg: LLMFreshnessConfig) -> None:
    team = LLMTeam(team_config(cfg, 0))
    start = [team.state(i) for i in range(2)]
    br = branch(team, trainer_config(cfg, 0))
    assert [int(u["rollout/agent"]) for u in br.log.updates] == [0]  # the solver moved, the critic not yet
    stale, b_size = br.point.batch, cfg.trainer.batch_size
    fresh = team.sample(b_size, br.point.rollout_generator())
    same_task = [a.task == b.task and a.seed == b.seed for a, b in zip(stale.episodes, fresh.episodes, strict=True)]
    assert all(same_task)  # common random numbers: episode by episode the same train task and episode seed
    assert any(changed_rows(stale, fresh, 0))  # the updated solver speaks otherwise in some episodes
    # with the stage-start adapters back, the same generator state gives S token for token
    for i, s in enumerate(start):
        team.load_state(i, s)
    again = team.sample(b_size, br.point.rollout_generator())
    assert not any(changed_rows(stale, again, 0)) and not any(changed_rows(stale, again, 1))
    assert [t.logprobs for t in again.turns] == [t.logprobs for t in stale.turns]
    torch.testing.assert_close(again.rewards, stale.rewards)


def test_no_upstream_update_gives_identical_arms_and_an_update_a_gap(
    cfg: LLMFreshnessConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(llm_run, "_success", _critic_sum)
    undone = run_pair(cfg, 0, upstream=False)
    assert undone["success_fresh"] == undone["success_stale"] and undone["diff"] == 0.0
    assert undone["rows_changed"] == 0.0 and undone["adv_gap"] == 0.0 and undone["upstream_kl"] == 0.0
    assert undone["kl_fresh"] == undone["kl_stale"] and undone["steps_fresh"] == undone["steps_stale"]
    real = run_pair(cfg, 0)
    assert real["rows_changed"] > 0 and real["upstream_kl"] > 0 and real["upstream_steps"] > 0
    assert real["diff"] != 0.0 and real["kl_fresh"] != real["kl_stale"]  # the critic stepped otherwise on F
    # the stale arm, the null arms and the branch do not depend on whether F was drawn: bit for bit the same
    for key in ("success_stale", "success_null_a", "success_null_b", "kl_stale", "kl_null_a"):
        assert real[key] == undone[key], key
    assert real["success_null_a"] != real["success_null_b"]  # the null batches are independent draws
    assert set(real) == set(PAIR_COLUMNS) and real["worker"] == "critic"


def test_config_seeds_and_refusals(cfg: LLMFreshnessConfig) -> None:
    full = LLMFreshnessConfig()
    assert (full.pairs, full.eval_tasks, full.eval_split, full.null_check, full.updated) == (40, 60, "test", True, 1)
    assert full.team.workers == ("solver", "critic")
    t0, t1 = trainer_config(full, 0), trainer_config(full, 1)
    assert (t0.scheme, t0.order, t0.num_stages, t0.evaluate) == ("naive", "fixed", 1, False)
    assert t0.lr == full.trainer.lr and t0.batch_size == full.trainer.batch_size
    assert t0.seed != t1.seed and team_config(full, 0).seed != team_config(full, 1).seed
    assert team_config(full, 0).eval_tasks == 0  # the arms are played by the experiment, not by the team
    for bad, match in [
        (dict(pairs=1), "pairs"),
        (dict(eval_tasks=0), "eval_tasks"),
        (dict(eval_split="train"), "eval_split"),
        (dict(team=replace(cfg.team, workers=("solver",))), "workers"),
        (dict(trainer=replace(cfg.trainer, batch_size=5)), "multiple of team.group_size"),
    ]:
        with pytest.raises(ValueError, match=match):
            replace(cfg, **bad)


def _row(pair: int, diff: float, null: float) -> dict[str, Any]:
    row: dict[str, Any] = {k: 0.0 for k in PAIR_COLUMNS}
    return dict(row, pair=pair, upstream_kl=2e-3, worker="critic", success_stale=0.5, success_fresh=0.5 + diff, diff=diff,
                success_null_a=0.5, success_null_b=0.5 + null, null_diff=null)  # fmt: skip


def test_statistics_null_check_and_report(cfg: LLMFreshnessConfig) -> None:
    diffs, nulls = [0.1, 0.12, 0.08, 0.11, 0.09, 0.1], [0.02, -0.03, 0.01, -0.01, 0.0, 0.01]
    rows = [_row(p, d, z) for p, (d, z) in enumerate(zip(diffs, nulls, strict=True))]
    c = analyse(rows)["result"][0]
    want = paired_summary(diffs)
    assert all(c[f"diff_{k}"] == pytest.approx(v) for k, v in want.items())
    assert c["diff_p_holm"] == c["diff_p"] < 0.001 and c["null_p"] > 0.05
    text = "\n".join(line for sec in summary_sections(cfg, rows, {"result": [c]}).values() for line in sec)
    assert "**Passes**" in text and "fresh better" in text and f"{100 * want['mde']:.1f} points" in text
    assert (c["fresh_ahead"], c["stale_ahead"], c["tied"]) == (6, 0, 0) and c["sign_p"] == pytest.approx(2 / 2**6)
    assert "fresh ahead / stale ahead / tied: 6 / 0 / 0" in text and "p 0.031" in text
    mixed = [_row(p, d, 0.0) for p, d in enumerate([1 / 60, -1 / 60, -1 / 60, 0.0, -2 / 60])]
    m = analyse(mixed)["result"][0]
    assert (m["fresh_ahead"], m["stale_ahead"], m["tied"]) == (1, 3, 1) and m["sign_p"] == pytest.approx(0.625)
    interim = "\n".join(summary_sections(replace(cfg, pairs=10), rows, {"result": [c]})["title"])
    assert "6 of 10 pairs are in" in interim and "planned at 10 pairs" in interim
    shifted = [dict(r, null_diff=r["diff"], success_null_b=r["success_fresh"]) for r in rows]
    failed = summary_sections(cfg, shifted, analyse(shifted))
    assert "**FAILS**" in "\n".join(failed["null"])
    zero = [dict(r, null_diff=0.0, success_null_b=r["success_null_a"]) for r in rows]  # p undefined: passes
    assert "every pair's null difference is 0" in "\n".join(summary_sections(cfg, zero, analyse(zero))["null"])
    off = [dict(r, null_diff=math.nan, success_null_a=math.nan, success_null_b=math.nan) for r in rows]
    c_off = analyse(off)["result"][0]
    assert math.isnan(c_off["null_p"]) and c_off["diff_mean"] == pytest.approx(want["mean"])
    assert "Not run" in "\n".join(summary_sections(replace(cfg, null_check=False), off, analyse(off))["null"])


def test_a_pair_whose_upstream_did_not_move_is_left_out_of_the_test(cfg: LLMFreshnessConfig) -> None:
    diffs = [0.05, 0.03, 0.04, 0.06]
    rows = [_row(p, d, 0.01 * (-1) ** p) for p, d in enumerate(diffs)]
    unposed = {k: math.nan for k in PAIR_COLUMNS if PAIR_COLUMNS[k] is float}
    rows.append(dict(unposed, pair=4, worker="critic", upstream_kl=1e-11, upstream_steps=4.0, seconds=1.0))
    c = analyse(rows)["result"][0]
    assert (c["pairs"], c["pairs_run"], c["unposed"], c["null_pairs"]) == (4, 5, 1, 4)
    assert c["diff_mean"] == pytest.approx(np.mean(diffs)) and c["all_mean"] == pytest.approx(np.sum(diffs) / 5)
    assert c["all_mde"] == pytest.approx(paired_summary([*diffs, 0.0])["mde"])
    sec = summary_sections(cfg, rows, {"result": [c]})
    text = "\n".join(line for lines in sec.values() for line in lines)
    assert "5 replicate pairs (4 in which the upstream worker(s) moved)" in text
    assert "Left out of this table: 1 of the 5 pairs" in text and "| 4 | 0.0000 |" in "\n".join(sec["result"])


def test_the_run_says_a_pair_does_not_pose_the_question(
    cfg: LLMFreshnessConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    unposed = {k: math.nan for k in PAIR_COLUMNS if PAIR_COLUMNS[k] is float}
    row = dict(unposed, worker="critic", upstream_kl=0.0, upstream_steps=4.0, seconds=7.0)
    monkeypatch.setattr(llm_run, "run_pair", lambda _cfg, pair, say=None: dict(row, pair=pair))
    lines: list[str] = []
    result = run_llm_freshness_experiment(replace(cfg, pairs=2), tmp_path / "run", say=lines.append)
    assert lines == [
        f"freshness-llm pair {p}: the upstream update did not move the team (its batch carried no signal), so the "
        "pair does not pose the question; its arms not played (7 s)"
        for p in (0, 1)
    ]
    assert "No pair has posed the question yet" in result.summary.read_text()


def test_steps_without_signal_are_counted_and_named(cfg: LLMFreshnessConfig) -> None:
    moves = dict(kl_stale=2e-3, kl_null_a=2e-3, kl_null_b=2e-3, kl_fresh=2e-3)
    rows = [dict(_row(p, 0.0, 0.0), **moves, **{f"steps_{a}": 2.0 for a in ARMS}) for p in range(4)]
    moved = summary_sections(cfg, rows, analyse(rows))
    assert "Steps without signal" not in "\n".join(moved["not_shown"])
    assert "| fresh (F) | 0.0020 | 2.00 | 0% | 0% |" in moved["gap"]
    rows[1]["kl_fresh"], rows[3]["kl_fresh"] = 1.2e-11, 0.0  # round-off of a step on all-zero advantages
    rows[2]["kl_stale"], rows[2]["steps_stale"] = 0.0, 0.0  # every step reverted: the trust region, not the signal
    c = analyse(rows)["result"][0]
    assert c["still_fresh"] == 0.5 and c["still_stale"] == 0.0
    text = "\n".join(summary_sections(cfg, rows, {"result": [c]})["not_shown"])
    assert "did not move in 50% of the fresh arms and 0% of the stale arms" in text


def test_smoke_run_resume_extension_and_another_config(cfg: LLMFreshnessConfig, tmp_path: Path) -> None:
    out = tmp_path / "fresh"
    lines: list[str] = []
    result = run_llm_freshness_experiment(cfg, out, say=lines.append)
    rows = read_rows(out / "pairs.csv", PAIR_COLUMNS)
    assert [r["pair"] for r in rows] == [0, 1] and sum(ln.startswith("freshness-llm pair") for ln in lines) == 2
    assert all(0 <= r[f"success_{a}"] <= 1 for r in rows for a in ARMS) and all(r["seconds"] > 0 for r in rows)
    c = result.tables["result"][0]
    want = paired_summary([r["diff"] for r in rows])
    assert c["pairs"] == 2 and c["diff_mean"] == pytest.approx(want["mean"])
    assert c["null_mean"] == pytest.approx(paired_summary([r["null_diff"] for r in rows])["mean"])
    text = result.summary.read_text()
    assert "Fresh − stale" in text and "Null check" in text and "What it does not show" in text
    assert (out / "result.csv").exists() and (out / "config.json").exists()
    # the same config again: nothing runs, the rows are kept
    lines.clear()
    again = run_llm_freshness_experiment(cfg, out, say=lines.append)
    assert lines == [] and "2 pairs reused" in again.summary.read_text()
    # more pairs: only the new one runs, the first two are kept as they were
    more = run_llm_freshness_experiment(replace(cfg, pairs=3), out, say=lines.append)
    assert [ln for ln in lines if ln.startswith("freshness-llm pair")] == [lines[-1]] and "pair 2" in lines[-1]
    assert read_rows(out / "pairs.csv", PAIR_COLUMNS)[:2] == rows and more.tables["result"][0]["pairs"] == 3
    with pytest.raises(ConfigMismatchError, match="eval_tasks"):
        run_llm_freshness_experiment(replace(cfg, eval_tasks=5), out, say=lambda _: None)
    # --report-only: nothing played, pairs.csv and config.json untouched, interim while pairs are missing
    before = {f: (out / f).read_bytes() for f in ("pairs.csv", "config.json")}
    lines.clear()
    interim = run_llm_freshness_experiment(replace(cfg, pairs=5), out, say=lines.append, play=False)
    assert lines == [] and {f: (out / f).read_bytes() for f in before} == before
    page = interim.summary.read_text()
    assert "**Interim: 3 of 5 pairs are in.**" in page and "this invocation" not in page
    assert interim.tables["result"][0]["pairs"] == 3
    done = run_llm_freshness_experiment(replace(cfg, pairs=3), out, play=False).summary.read_text()
    assert (
        "Interim" not in done
        and done == run_llm_freshness_experiment(replace(cfg, pairs=3), out, play=False).summary.read_text()
    )
    with pytest.raises(ConfigMismatchError, match="eval_tasks"):
        run_llm_freshness_experiment(replace(cfg, eval_tasks=5), out, play=False)
    with pytest.raises(ValueError, match="config.json: not found"):
        run_llm_freshness_experiment(cfg, tmp_path / "nothing", play=False)
    assert not (tmp_path / "nothing").exists()


def test_cli_freshness_llm(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from orchestra.cli import main

    report = tmp_path / "docs" / "freshness_llm.md"
    args = ["experiment", "freshness-llm", "--smoke", "--no-null-check", "--eval-tasks", "2", "--lr", "0.02"]
    code = main([*args, "--out", str(tmp_path / "run"), "--report", str(report), "--quiet", "--threads", "1"])
    assert code == 0 and "summary:" in capsys.readouterr().out
    rows = read_rows(report.with_suffix(".csv"), PAIR_COLUMNS)
    assert [r["pair"] for r in rows] == [0, 1] and all(math.isnan(r["success_null_a"]) for r in rows)
    # the arithmetic team's tiny random model solves nothing: S carries no signal, the solver does not move, so no
    # pair poses the question and their arms are not played
    assert all(r["upstream_kl"] < STILL_KL and math.isnan(r["success_stale"]) for r in rows)
    text = report.read_text()
    assert (
        "lr 0.02" in text
        and "No pair has posed the question yet" in text
        and "Left out of this table: 2 of the 2 pairs" in text
    )
    # the page alone, from the run directory: the same page, no copy of the rows beside it
    page = tmp_path / "page" / "fresh.md"
    assert main([*args, "--out", str(tmp_path / "run"), "--report", str(page), "--report-only", "--quiet"]) == 0
    got, want = page.read_text().splitlines(), report.read_text().splitlines()
    assert got[3:] == want[3:] and "this invocation" in want[2] and "this invocation" not in got[2]
    assert not page.with_suffix(".csv").exists()
    # another config in the same directory is refused with the field named
    assert main([*args, "--eval-tasks", "3", "--out", str(tmp_path / "run"), "--quiet"]) == 2
    assert "eval_tasks" in capsys.readouterr().err


def test_each_arm_is_read_against_the_branch_and_the_reuse_of_s_alone(cfg: LLMFreshnessConfig) -> None:
    # the stale step leaves the team where it was; the fresh and null steps each cost about a task
    loss = [1 / 60, 2 / 60, 1 / 60, 1 / 60, 0.0, 1 / 60, 2 / 60, 2 / 60]
    rows = [
        dict(
            _row(p, -x, 0.0),
            success_branch=0.5,
            success_fresh=0.5 - x,
            success_null_a=0.5 - x,
            success_null_b=0.5 - x,
            kl_fresh=2e-3 if p else 0.0,  # pair 0's fresh arm did not move
        )
        for p, x in enumerate(loss)
    ]
    c = analyse(rows)["result"][0]
    assert c["step_stale_mean"] == 0.0 and math.isnan(c["step_stale_p"])  # no spread: no test
    assert c["step_fresh_mean"] == pytest.approx(-np.mean(loss)) == c["step_null_a_mean"]
    assert c["reuse_mean"] == pytest.approx(np.mean(loss)) and c["reuse_n"] == 8
    ps = [c[f"step_{a}_p"] for a in ("fresh", "null_a", "null_b")]
    assert [c[f"step_{a}_p_holm"] for a in ("fresh", "null_a", "null_b")] == pytest.approx(
        holm([c["reuse_p"], *ps])[1:]
    )
    assert c["moved_n"] == 7 and c["moved_mean"] == pytest.approx(-np.mean(loss[1:]))
    text = "\n".join(summary_sections(cfg, rows, {"result": [c]})["mechanism"])
    assert f"| fresh (F) | 8 | {-np.mean(loss):+.4f} [" in text and "the mean of the two null arms" in text
    assert "over the 7 pairs whose fresh arm moved" in text
    off = [dict(r, success_null_a=math.nan, success_null_b=math.nan, null_diff=math.nan) for r in rows]
    text_off = "\n".join(summary_sections(replace(cfg, null_check=False), off, analyse(off))["mechanism"])
    assert "null (S1)" not in text_off and "the two null arms" not in text_off and "| fresh (F) | 8 |" in text_off
