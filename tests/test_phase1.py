"""The phase-1 protocol's bookkeeping: the test ledger and the plain-words caveats."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestra.jobs.phase1 import Phase1Config, ledger_entry
from orchestra.report.evaluation import PairedRow
from orchestra.report.protocol import HeadroomRow, not_shown


def test_the_test_ledger_records_each_released_configuration_once(tmp_path: Path) -> None:
    ledger = tmp_path / "test_ledger.jsonl"
    entry = {"team": "arithmetic", "conductor": "cql-s0", "config": "cql-a0.1", "tasks": 150, "model_sha256": "ab"}
    assert ledger_entry(ledger, entry) is True
    assert ledger_entry(ledger, dict(entry)) is False  # a resumed run adds nothing
    assert ledger_entry(ledger, {**entry, "model_sha256": "cd"}) is True  # a retrained model is a new evaluation
    lines = [json.loads(x) for x in ledger.read_text().splitlines()]
    assert len(lines) == 2 and all("time" in x for x in lines)


def test_learner_configurations_cover_every_alpha_and_keep_checkpoints() -> None:
    cfg = Phase1Config.reproduce()
    labels = cfg.learner_configs()
    assert {"bc", "fbc", "dqn", "ddqn", "bcq", "cql-a0.02", "cql-a0.1", "cql-a0.5"} == set(labels)
    assert all(c.keep_epochs and c.seed == cfg.seeds[0] for c in labels.values())
    assert len(cfg.seeds) >= 3 and cfg.eval_episodes >= 150
    assert 2 * len(labels) >= 10  # mid-training and final checkpoints: at least 10 policies for the FQE check


def test_caveats_name_small_headroom_and_a_validation_choice_that_differs_on_test() -> None:
    row = HeadroomRow(
        "arithmetic", 150, "pipeline", 0.30, "heuristic", 0.34, 0.36, 0.06, "cql", 0.31, 0.01, 0.2, 0.1, 3
    )
    text = "\n".join(not_shown([row], [], seeds=[0, 1, 2], run_seed=0))
    assert "under 10" in text and "validation chose `pipeline`" in text and "No learned conductor" in text


def test_caveats_say_when_a_rule_of_the_menu_earns_a_learners_verdict_too() -> None:
    row = HeadroomRow("arithmetic", 150, "critique", 0.14, "heuristic", 0.21, 0.28, 0.14, "bc", 0.19, 0.0, 0.38, 0.0, 3)

    def paired(conductor: str, rule_based: bool, verdict: str) -> PairedRow:
        return PairedRow(
            "arithmetic",
            "arithmetic",
            conductor,
            "critique",
            rule_based,
            150,
            0.19,
            0.14,
            0.05,
            0.01,
            0.1,
            10,
            2,
            1.0,
            1.0,
            0.01,
            0.001,
            0.001,
            0.1,
            0.05,
            0.15,
            0.5,
            0.5,
            0.51,
            0.56,
            0.54,
            0.59,
            verdict,
        )

    matched = [paired("bc-s0", False, "cheaper"), paired("pipeline", True, "cheaper")]
    text = "\n".join(not_shown([row], matched, seeds=[0, 1, 2], run_seed=0))
    assert "*cheaper* verdicts (`bc-s0`)" in text and "(`pipeline`)" in text and "`critique`" in text
    alone = [paired("bc-s0", False, "cheaper"), paired("pipeline", True, "non-inferior")]
    assert "verdicts (" not in "\n".join(not_shown([row], alone, seeds=[0, 1, 2], run_seed=0))


@pytest.mark.slow
def test_the_protocol_end_to_end_with_scripted_workers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """run_phase1 on the arithmetic team with scripted LLM workers (the real env, tools, d3rlpy and report): the
    baseline is chosen on validation episodes, test and validation tasks are disjoint, every test evaluation is in
    the ledger once, and the oracle is at least the best fixed schedule and costs tokens."""
    import orchestra.runtime.session as session_mod
    from orchestra.jobs.phase1 import run_phase1
    from orchestra.report.evaluation import summarize
    from orchestra.runtime.session import RunOptions
    from tests.scripted import scripted_workers
    from trajectories import read_many

    monkeypatch.setattr(session_mod, "build_workers", lambda team, tools, **kw: scripted_workers(team))
    cfg = Phase1Config(
        teams=["arithmetic"],
        train_episodes=6,
        validation_episodes=6,
        eval_episodes=8,
        algos=["bc", "cql"],
        cql_alphas=[0.1, 0.5],
        seeds=[0, 1],
        n_steps=60,
        n_steps_per_epoch=30,
        fqe_steps=30,
        run=RunOptions(use_cache=False, progress=False),
    )
    out = tmp_path / "run"
    res = run_phase1(cfg, out)
    for key in ("summary", "ledger", "headroom", "fqe", "cost_quality"):
        assert res.paths[key].exists(), key
    val = read_many(sorted((out / "validation" / "arithmetic").glob("*.jsonl"))).episodes
    test = read_many(sorted((out / "test" / "arithmetic").glob("*.jsonl"))).episodes
    assert not {e.task.id for e in val} & {e.task.id for e in test}
    assert {e.task.split for e in val} == {"validation"} and {e.task.split for e in test} == {"test"}
    menu = {"tool_only", "single_shot", "pipeline", "round_robin", "heuristic", "resample", "critique"}
    val_rows = [r for r in summarize(val) if r.conductor in menu]
    best = max(val_rows, key=lambda r: (r.success_rate, r.mean_return, [-ord(c) for c in r.conductor])).conductor
    assert {h.best_fixed for h in res.headroom} == {best}
    for h in res.headroom:
        assert h.oracle_success >= h.best_fixed_success and h.headroom == pytest.approx(
            h.oracle_success - h.best_fixed_success
        )
        assert h.oracle_tokens > 0 and h.seeds == 2
    assert len(res.fqe) == 3 * 2  # bc, cql-a0.1, cql-a0.5 × (mid-training, final)
    ledger = res.paths["ledger"].read_text().splitlines()
    assert len(ledger) == 1 + 2 * 2  # the menu, then each released learner × seed
    summary = res.paths["summary"].read_text()
    assert "## What these numbers do not show" in summary and "oracle" in summary
    again = run_phase1(cfg, out)  # a rerun resumes: no new test evaluation, the same tables
    assert res.paths["ledger"].read_text().splitlines() == ledger
    assert [h.learner_success_mean for h in again.headroom] == [h.learner_success_mean for h in res.headroom]
