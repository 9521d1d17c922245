"""benchmarks/preset_choice.py's figures and rule on hand-made episode rows (never the model): GRPO groups are a
task's samples cut into disjoint runs of G, a group counts when its reward is not constant, tasks missing at some
temperature are left out, and the choice follows the rule written in the script."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks.preset_choice import balanced, choose, groups_of, markdown, nonconstant_share, summarise


def _rows(temp: float, successes: list[list[int]]) -> list[dict[str, Any]]:
    """One row per (task, sample): success as given, return = success − 0.01 × sample (never constant)."""
    return [
        dict(temperature=temp, task=t, task_id=f"t{t}", difficulty=1, sample=k, seed=k, success=float(s))
        | {"return": s - 0.01 * k, "tokens": 100 + k, "seconds": 1.0}
        for t, row in enumerate(successes)
        for k, s in enumerate(row)
    ]


def test_groups_and_shares() -> None:
    rows = _rows(1.0, [[1, 0, 0, 0, 0, 0, 0, 0], [0] * 8, [1] * 8])
    assert [[int(r["sample"]) for r in g] for g in groups_of(rows, 4)[:2]] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert nonconstant_share(rows, 8, "success") == pytest.approx(1 / 3)  # task 0 only
    assert nonconstant_share(rows, 4, "success") == pytest.approx(1 / 6)  # task 0's first half only
    assert nonconstant_share(rows, 8, "return") == 1.0 and nonconstant_share(rows, 4, "return") == 1.0


def test_the_rule() -> None:
    mixed, half = [1, 0, 1, 0, 1, 0, 1, 0], [1, 1, 1, 1, 0, 0, 0, 0]
    rows = _rows(0.3, [mixed, mixed]) + _rows(0.7, [mixed, half]) + _rows(1.0, [[0] * 8, mixed])
    # s_8: 100% at 0.3 and 0.7, 50% at 1.0 → the highest passing T is 1.0; s_4 there: 2 of 4 groups → G = 4
    t, g, why = choose(summarise(rows))
    assert (t, g) == (1.0, 4) and "highest temperature" in why
    rows = _rows(0.3, [[0] * 8, mixed]) + _rows(0.7, [[0] * 8, half]) + _rows(1.0, [[0] * 8, [0] * 8])
    # s_8: 50% at 0.3 and 0.7 (≥ 50% passes), 0% at 1.0 → 0.7; s_4 there: every half constant → G = 8
    t, g, _ = choose(summarise(rows))
    assert (t, g) == (0.7, 8)
    rows = _rows(0.3, [[0] * 8, [0] * 8, mixed]) + _rows(0.5, [[0] * 8, [0] * 8, [0] * 8])
    t, g, why = choose(summarise(rows))
    assert (t, g) == (0.3, 8) and "no temperature" in why


def test_an_unfinished_round_is_left_out_and_the_report_is_computed() -> None:
    rows = _rows(0.3, [[1] * 8, [0, 1] * 4]) + _rows(1.0, [[1] * 8])  # task 1 not played at T = 1
    assert {int(r["task"]) for r in balanced(rows)} == {0}
    s = summarise(rows)
    assert [x.tasks for x in s] == [1, 1] and s[0].success == 1.0
    md = markdown(rows, "gpu_preset.csv", "a machine")
    assert "| 0.3 | 1 × 8 | 100.0% |" in md and "temperature 1, group size G = 8" in md


def test_the_gpu_preset_carries_the_committed_choice() -> None:
    """The choice recomputed from the committed episode table is what smollm2_gpu.yaml samples with."""
    import csv
    from pathlib import Path

    import yaml

    root = Path(__file__).resolve().parents[1]
    with open(root / "docs" / "results" / "gpu_preset.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    t, g, _ = choose(summarise(rows))
    team = yaml.safe_load((root / "orchestra" / "teamtr" / "configs" / "smollm2_gpu.yaml").read_text())["team"]
    assert (float(team["temperature"]), int(team["group_size"]), team["reward"]) == (t, g, "success")
