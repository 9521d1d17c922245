"""Credit assignment for agent teams: leave-one-out and Shapley values of a coalition game (docs/algorithms.md §5.2).

A *coalition value* ``value_fn(present) -> float`` gives v(S) for the set S of agents that act with their own
policies/messages; agents outside S are replaced by a counterfactual default (drop the message, a null "pass"
message, a reference model's message…). v(∅) = everyone replaced. :func:`counterfactual_value` builds such a
function from a replay function and a configurable null, so the null is chosen in one place and every credit
rule below sees the same game.

    φ_i = Σ_{S ⊆ N∖{i}} |S|! (n − |S| − 1)! / n! · [v(S ∪ {i}) − v(S)]
        = E_{σ ~ Unif(perms)} [v(Pre_σ(i) ∪ {i}) − v(Pre_σ(i))]               (Shapley 1953)

Source: the design notes ``docs/algorithms.md`` §5.2 (Castro, Gómez, Tejada 2009 for permutation sampling).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any, Generic, NamedTuple, TypeVar

import numpy as np

A = TypeVar("A", bound=Hashable)  # an agent (its name)
M = TypeVar("M")  # a message


class _Drop:
    """Sentinel type of :data:`DROP`."""

    def __repr__(self) -> str:
        return "DROP"


DROP = _Drop()  # null that removes an absent agent's entry instead of replacing it


class ShapleyEstimate(NamedTuple, Generic[A]):
    """Monte-Carlo Shapley values and their standard errors, per agent."""

    values: dict[A, float]  # φ̂_i
    stderr: dict[A, float]  # standard error of φ̂_i (NaN with fewer than two independent draws)


def _check_agents(agents: Sequence[A]) -> list[A]:
    out = list(agents)
    if len(set(out)) != len(out):
        raise ValueError(f"agents must be distinct, got {out}")
    return out


def counterfactual_value(
    play: Callable[[dict[A, Any]], float],
    messages: Mapping[A, M],
    null: Any = DROP,
    *,
    cache: bool = True,
) -> Callable[[frozenset[A]], float]:
    """Coalition value from a replay function: v(S) = play({a: messages[a] if a ∈ S else null(a)}).

    Args:
        play: scores a team outcome given each agent's message (e.g. replays the transcript with the replaced
            messages and runs the verifier, or averages K continuations with common random numbers).
        messages: what each agent actually said; its keys are the players.
        null: what an absent agent says: :data:`DROP` (default: the agent's entry is left out, "leave-one-out"
            by dropping the message), a constant (e.g. ``""`` or ``"(pass)"``), a mapping agent → replacement
            (e.g. a reference model's message), or a callable ``agent -> replacement``.
        cache: memoise v(S) per coalition (2^n at most). With a noisy ``play`` this reuses each v(S) across
            credit computations (common random numbers); turn it off to redraw.
    """
    memo: dict[frozenset[A], float] = {}

    def replacement(agent: A) -> Any:
        if isinstance(null, Mapping):
            return null[agent]
        if callable(null):
            return null(agent)
        return null

    def value(present: frozenset[A]) -> float:
        if cache and present in memo:
            return memo[present]
        unknown = present - messages.keys()
        if unknown:
            raise KeyError(f"agents without a message: {sorted(map(str, unknown))}")
        assignment: dict[A, Any] = {}
        for agent, message in messages.items():
            if agent in present:
                assignment[agent] = message
            elif null is not DROP:
                assignment[agent] = replacement(agent)
        v = float(play(assignment))
        if cache:
            memo[present] = v
        return v

    return value


def leave_one_out_credit(value_fn: Callable[[frozenset[A]], float], agents: Sequence[A]) -> dict[A, float]:
    """Δ_i = v(N) − v(N ∖ {i}): each agent's marginal contribution to the full team (docs/algorithms.md §5.2).

    n + 1 evaluations. Equals the Shapley value on additive games; not efficient in general (for v = 1 iff all
    agents act, every agent gets 1 and the sum is n, not v(N) − v(∅) = 1).
    """
    players = _check_agents(agents)
    full = frozenset(players)
    v_full = float(value_fn(full))
    return {a: v_full - float(value_fn(full - {a})) for a in players}


def shapley_exact(
    value_fn: Callable[[frozenset[A]], float], agents: Sequence[A], *, max_agents: int = 16
) -> dict[A, float]:
    """Exact Shapley values by enumerating the 2^n coalitions once (each v(S) evaluated exactly once).

    φ_i = Σ_{S ⊆ N∖{i}} w(|S|) [v(S ∪ {i}) − v(S)], w(s) = s! (n − s − 1)! / n!.

    Raises ValueError above ``max_agents`` (use :func:`shapley_monte_carlo`).
    """
    players = _check_agents(agents)
    n = len(players)
    if n > max_agents:
        raise ValueError(f"{n} agents: 2^{n} coalitions; raise max_agents or use shapley_monte_carlo")
    values = {
        frozenset(c): float(value_fn(frozenset(c)))
        for size in range(n + 1)
        for c in itertools.combinations(players, size)
    }
    weight = [math.factorial(s) * math.factorial(n - s - 1) / math.factorial(n) for s in range(n)]
    phi = dict.fromkeys(players, 0.0)
    for coalition, v in values.items():
        for a in players:
            if a not in coalition:
                phi[a] += weight[len(coalition)] * (values[coalition | {a}] - v)
    return phi


def shapley_monte_carlo(
    value_fn: Callable[[frozenset[A]], float],
    agents: Sequence[A],
    num_permutations: int,
    rng: np.random.Generator | int | None = None,
    *,
    antithetic: bool = False,
    cache: bool = True,
) -> ShapleyEstimate[A]:
    """Permutation-sampling Shapley estimate with standard errors (Castro, Gómez, Tejada 2009; docs/algorithms.md §5.2).

    Each of the M permutations σ is walked once, adding one agent at a time (n + 1 evaluations, one marginal per
    agent): φ̂_i = (1/M) Σ_m [v(Pre_σm(i) ∪ {i}) − v(Pre_σm(i))]. Unbiased; Var φ̂_i = Var_σ(Δ_i) / M, so the error
    shrinks like 1/√M. stderr_i = sample std (ddof 1) of the marginals / √M.

    Args:
        value_fn: coalition value v(S).
        agents: the players.
        num_permutations: M ≥ 1 (even with ``antithetic``).
        rng: numpy Generator or seed.
        antithetic: draw M/2 permutations and also walk each one reversed (variance reduction); the stderr is then
            computed over the M/2 pair means, which are the independent draws.
        cache: memoise v(S) within this call (at most 2^n distinct coalitions).
    """
    players = _check_agents(agents)
    n = len(players)
    if num_permutations < 1 or (antithetic and num_permutations % 2):
        raise ValueError(f"num_permutations={num_permutations} must be ≥ 1 (and even when antithetic)")
    gen = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
    memo: dict[frozenset[A], float] = {}

    def v(coalition: frozenset[A]) -> float:
        if not cache:
            return float(value_fn(coalition))
        if coalition not in memo:
            memo[coalition] = float(value_fn(coalition))
        return memo[coalition]

    def walk(order: Sequence[int]) -> np.ndarray:
        marginals = np.zeros(n)  # (n,) in the order of `players`
        present: frozenset[A] = frozenset()
        prev = v(present)
        for idx in order:
            present = present | {players[idx]}
            cur = v(present)
            marginals[idx] = cur - prev
            prev = cur
        return marginals

    draws: list[np.ndarray] = []  # independent draws, (n,) each
    num_draws = num_permutations // 2 if antithetic else num_permutations
    for _ in range(num_draws):
        order = gen.permutation(n).tolist()
        if antithetic:
            draws.append(0.5 * (walk(order) + walk(order[::-1])))
        else:
            draws.append(walk(order))
    samples = np.stack(draws)  # (num_draws, n)
    mean = samples.mean(axis=0)  # (n,)
    # (n,) standard error of the mean of the independent draws
    stderr = samples.std(axis=0, ddof=1) / math.sqrt(num_draws) if num_draws > 1 else np.full(n, math.nan)
    return ShapleyEstimate(
        values={a: float(mean[i]) for i, a in enumerate(players)},
        stderr={a: float(stderr[i]) for i, a in enumerate(players)},
    )
