"""benchmarks/calibrate.py's tables (never its speed): the per-task oracle over a team's rules and its headroom."""

from __future__ import annotations

from benchmarks.calibrate import markdown


def _row(rule: str, level: int, n: int, k: int) -> dict[str, object]:
    return dict(
        team="t", split="validation", rule=rule, level=level, temperature=0.0, n=n, success=k / n,
        ci_low=0.0, ci_high=1.0, mean_price=0.5,
    )  # fmt: skip


def test_the_oracle_counts_a_task_any_rule_solved_and_the_headroom_is_over_the_best_rule() -> None:
    # level 1: a solves tasks 0 1, b solves 1 2 → best 50%, oracle 75%; level 2: b solves everything a does
    wins = {("a", 1): {0, 1}, ("b", 1): {1, 2}, ("a", 2): {0}, ("b", 2): {0, 1}}
    outcomes = [
        dict(rule=rule, temperature=0.0, level=level, task=f"{level}-{t}", success=int(t in won), price=0.5)
        for (rule, level), won in wins.items()
        for t in range(4)
    ]
    rows = [_row(rule, level, 4, len(won)) for (rule, level), won in wins.items()]
    text = markdown(rows, outcomes, "python benchmarks/calibrate.py --team t")
    assert "| 0 | 1 | 4 | a | 50.0% | 75.0% | +25.0 |" in text
    assert "| 0 | 2 | 4 | b | 50.0% | 50.0% | +0.0 |" in text
    assert "| a | 0 | 1 | 4 | 50.0% | [0.0, 100.0] | 0.500 |" in text
