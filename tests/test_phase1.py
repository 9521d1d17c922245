"""The phase-1 protocol's bookkeeping: the test ledger and the plain-words caveats."""

from __future__ import annotations

import json
from pathlib import Path

from orchestra.jobs.phase1 import Phase1Config, ledger_entry
from orchestra.report.benchmark import HeadroomRow, not_shown


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
