"""Credit assignment (orchestra/teamtr/credit.py): Shapley axioms, Monte-Carlo error rate, leave-one-out."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import numpy as np
import pytest

from orchestra.teamtr.credit import (
    DROP,
    counterfactual_value,
    leave_one_out_credit,
    shapley_exact,
    shapley_monte_carlo,
)

Game = Callable[[frozenset[str]], float]


def random_game(agents: list[str], seed: int) -> Game:
    """v(S) drawn at random for every coalition (a generic game with no structure)."""
    rng = np.random.default_rng(seed)
    table = {
        frozenset(c): float(rng.normal())
        for size in range(len(agents) + 1)
        for c in itertools.combinations(agents, size)
    }
    return table.__getitem__


def glove_game(present: frozenset[str]) -> float:
    """Two left gloves, one right glove: value = matched pairs. Shapley: L1 = L2 = 1/6, R = 2/3."""
    return float(min(len(present & {"L1", "L2"}), len(present & {"R"})))


# ---------------------------------------------------------------------------------------------------------------
# exact Shapley


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_shapley_efficiency_on_random_games(seed: int) -> None:
    agents = ["a", "b", "c", "d", "e"][: 3 + seed]
    v = random_game(agents, seed)
    phi = shapley_exact(v, agents)
    assert sum(phi.values()) == pytest.approx(v(frozenset(agents)) - v(frozenset()), abs=1e-12)


def test_shapley_known_values_symmetry_and_dummy() -> None:
    phi = shapley_exact(glove_game, ["L1", "L2", "R"])
    assert phi == pytest.approx({"L1": 1 / 6, "L2": 1 / 6, "R": 2 / 3})

    # symmetry: a and b are interchangeable (v depends on them only through how many are present)
    def sym(present: frozenset[str]) -> float:
        k = len(present & {"a", "b"})
        return k**2 + 3.0 * ("c" in present) * k + 2.0 * ("c" in present)

    phi_sym = shapley_exact(sym, ["a", "b", "c"])
    assert phi_sym["a"] == pytest.approx(phi_sym["b"])
    assert phi_sym["a"] != pytest.approx(phi_sym["c"])

    # dummy: d adds nothing to any coalition, on top of a random game of the others
    base = random_game(["a", "b", "c"], seed=7)

    def with_dummy(present: frozenset[str]) -> float:
        return base(present - {"d"})

    phi_dummy = shapley_exact(with_dummy, ["a", "b", "c", "d"])
    assert phi_dummy["d"] == pytest.approx(0.0, abs=1e-12)
    phi_base = shapley_exact(base, ["a", "b", "c"])
    assert {k: phi_dummy[k] for k in "abc"} == pytest.approx(phi_base)


def test_shapley_evaluates_each_coalition_once_and_guards_size() -> None:
    calls: list[frozenset[str]] = []

    def v(present: frozenset[str]) -> float:
        calls.append(present)
        return float(len(present))

    shapley_exact(v, ["a", "b", "c", "d"])
    assert len(calls) == 16 == len(set(calls))
    with pytest.raises(ValueError):
        shapley_exact(v, ["a", "b", "c"], max_agents=2)
    with pytest.raises(ValueError):
        shapley_exact(v, ["a", "a"])


# ---------------------------------------------------------------------------------------------------------------
# Monte-Carlo Shapley


def test_monte_carlo_error_shrinks_like_one_over_sqrt_m() -> None:
    agents = ["a", "b", "c", "d", "e"]
    v = random_game(agents, seed=11)
    exact = np.array(list(shapley_exact(v, agents).values()))
    m_small, m_large, repeats = 8, 128, 150

    def rmse_and_stderr(m: int) -> tuple[float, float]:
        sq_err, sq_se = [], []
        for seed in range(repeats):
            est = shapley_monte_carlo(v, agents, m, np.random.default_rng(seed))
            values = np.array(list(est.values.values()))
            # every sampled permutation telescopes to v(N) − v(∅): efficiency holds for each estimate
            assert values.sum() == pytest.approx(v(frozenset(agents)) - v(frozenset()), abs=1e-9)
            sq_err.append((values - exact) ** 2)
            sq_se.append(np.array(list(est.stderr.values())) ** 2)
        return float(np.sqrt(np.mean(sq_err))), float(np.sqrt(np.mean(sq_se)))

    rmse_small, se_small = rmse_and_stderr(m_small)
    rmse_large, se_large = rmse_and_stderr(m_large)
    ratio = rmse_small / rmse_large
    assert 3.3 < ratio < 4.8, ratio  # √(128 / 8) = 4
    # the reported standard error is calibrated against the realised error
    assert se_small == pytest.approx(rmse_small, rel=0.2)
    assert se_large == pytest.approx(rmse_large, rel=0.2)


def test_monte_carlo_is_unbiased_and_antithetic_pairs_work() -> None:
    agents = ["a", "b", "c", "d"]
    v = random_game(agents, seed=3)
    exact = shapley_exact(v, agents)
    est = shapley_monte_carlo(v, agents, 4000, rng=0)
    for a in agents:
        assert abs(est.values[a] - exact[a]) < 4 * est.stderr[a]
    anti = shapley_monte_carlo(v, agents, 4000, rng=1, antithetic=True)
    for a in agents:
        assert abs(anti.values[a] - exact[a]) < 4 * anti.stderr[a]
    assert sum(anti.values.values()) == pytest.approx(v(frozenset(agents)) - v(frozenset()))
    # same seed, same estimate; a single draw has no standard error
    assert shapley_monte_carlo(v, agents, 10, rng=5) == shapley_monte_carlo(v, agents, 10, rng=5)
    assert all(math.isnan(s) for s in shapley_monte_carlo(v, agents, 1, rng=0).stderr.values())
    with pytest.raises(ValueError):
        shapley_monte_carlo(v, agents, 3, rng=0, antithetic=True)


def test_monte_carlo_on_the_glove_game_recovers_known_values() -> None:
    est = shapley_monte_carlo(glove_game, ["L1", "L2", "R"], 3000, rng=2)
    for agent, value in {"L1": 1 / 6, "L2": 1 / 6, "R": 2 / 3}.items():
        assert abs(est.values[agent] - value) < 4 * est.stderr[agent]


# ---------------------------------------------------------------------------------------------------------------
# leave-one-out


def test_leave_one_out_equals_own_value_on_additive_games_and_differs_under_complementarity() -> None:
    weights = {"planner": 0.3, "solver": 1.2, "critic": -0.4}

    def additive(present: frozenset[str]) -> float:
        return 0.25 + sum(weights[a] for a in present)

    agents = list(weights)
    assert leave_one_out_credit(additive, agents) == pytest.approx(weights)
    assert shapley_exact(additive, agents) == pytest.approx(weights)

    def all_needed(present: frozenset[str]) -> float:
        return float(present == frozenset(agents))

    assert leave_one_out_credit(all_needed, agents) == pytest.approx(dict.fromkeys(agents, 1.0))
    assert shapley_exact(all_needed, agents) == pytest.approx(dict.fromkeys(agents, 1 / 3))


# ---------------------------------------------------------------------------------------------------------------
# counterfactual games with a configurable null


def test_counterfactual_value_replaces_absent_agents_by_the_configured_null() -> None:
    messages = {"solver": "x = 4", "critic": "looks right", "tool": "4"}
    seen: list[dict[str, object]] = []

    def play(assignment: dict[str, object]) -> float:
        seen.append(dict(assignment))
        return float(assignment.get("solver") == "x = 4") + 0.5 * float(assignment.get("tool") == "4")

    v = counterfactual_value(play, messages)  # default: drop the absent agents' messages
    assert v(frozenset({"solver"})) == 1.0
    assert seen[-1] == {"solver": "x = 4"}
    assert leave_one_out_credit(v, list(messages)) == {"solver": 1.0, "critic": 0.0, "tool": 0.5}
    assert shapley_exact(v, list(messages)) == pytest.approx({"solver": 1.0, "critic": 0.0, "tool": 0.5})

    v_pass = counterfactual_value(play, messages, "(pass)")
    v_pass(frozenset({"critic"}))
    assert seen[-1] == {"solver": "(pass)", "critic": "looks right", "tool": "(pass)"}

    reference = {"solver": "x = 5", "critic": "ok", "tool": "4"}  # e.g. a frozen reference model's messages
    v_ref = counterfactual_value(play, messages, reference)
    assert v_ref(frozenset()) == 0.5  # the reference tool output is the same
    assert seen[-1] == reference

    v_fn = counterfactual_value(play, messages, lambda agent: f"<{agent} silent>")
    v_fn(frozenset({"tool"}))
    assert seen[-1] == {"solver": "<solver silent>", "critic": "<critic silent>", "tool": "4"}

    # cached: a coalition is played once
    n_calls = len(seen)
    v(frozenset({"solver"}))
    assert len(seen) == n_calls
    uncached = counterfactual_value(play, messages, DROP, cache=False)
    uncached(frozenset({"solver"}))
    uncached(frozenset({"solver"}))
    assert len(seen) == n_calls + 2
    with pytest.raises(KeyError):
        v(frozenset({"planner"}))
