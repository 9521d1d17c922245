"""Rule-based conductors: the schedulers used today, and the baselines a learned conductor must beat.

* ``round_robin`` — every worker in team order with its first instruction, ``rounds`` times, then submit
  (AutoGen GroupChat "round_robin").
* ``random`` — uniform over the legal actions (submit included once a candidate exists).
* ``pipeline`` — a fixed SOP, e.g. ``solver:solve → calculator:check``, then submit (MetaGPT-style).
* ``heuristic`` — rules over the structured state: start (e.g. a tool that may settle the task, or the
  solver), fall back to an LLM when the start produced no answer, check the new candidate with a tool, on a
  FAIL (or a check the tool could not do) hand back to the reviser with the revise instruction, on a
  PASS submit, submit after ``max_revisions`` failures or when out of turns.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from envs.config import TeamEnvConfig
from envs.observation import derive_flags
from policies.base import PolicyError, first_legal


def parse_label(config: TeamEnvConfig, label: str, where: str) -> int:
    """``"worker:instruction"`` or ``"submit"`` → action id, with an error naming ``where``."""
    if label == "submit":
        return config.submit_action
    worker, _, instruction = label.partition(":")
    if worker not in config.worker_names:
        raise PolicyError(f"{where}: unknown worker {worker!r} in {label!r} (workers: {list(config.worker_names)})")
    spec = next(w for w in config.workers if w.name == worker)
    if not instruction:
        instruction = spec.instructions[0]
    if instruction not in spec.instructions:
        raise PolicyError(
            f"{where}: worker {worker!r} does not take instruction {instruction!r} (it takes {list(spec.instructions)})"
        )
    return config.action_id(worker, instruction)


def _submit_or(action_mask: np.ndarray, config: TeamEnvConfig, fallback: int) -> int:
    if action_mask[config.submit_action]:
        return config.submit_action
    return fallback if action_mask[fallback] else first_legal(action_mask)


class RoundRobinConductor:
    """Each worker in order (first instruction), ``rounds`` times, then submit."""

    def __init__(self, config: TeamEnvConfig, rounds: int = 1) -> None:
        if rounds < 1:
            raise PolicyError("round_robin.rounds: must be >= 1")
        self.config, self.rounds, self.name = config, rounds, "round_robin"
        self._order = [config.action_id(w.name, w.instructions[0]) for w in config.workers]
        self._i = 0

    def reset(self, seed: int | None = None) -> None:
        self._i = 0

    def act(self, obs: np.ndarray, action_mask: np.ndarray, state: Mapping[str, Any] | None = None) -> int:
        if self._i >= self.rounds * len(self._order):
            return _submit_or(action_mask, self.config, self._order[self._i % len(self._order)])
        a = self._order[self._i % len(self._order)]
        self._i += 1
        return a if action_mask[a] else first_legal(action_mask)


class RandomConductor:
    """Uniform over legal actions; seeded per episode so recordings repeat exactly."""

    def __init__(self, config: TeamEnvConfig, seed: int = 0) -> None:
        self.config, self.name = config, "random"
        self._base_seed = seed
        self._rng = np.random.default_rng(seed)

    def reset(self, seed: int | None = None) -> None:
        self._rng = np.random.default_rng([self._base_seed, 0 if seed is None else seed])

    def act(self, obs: np.ndarray, action_mask: np.ndarray, state: Mapping[str, Any] | None = None) -> int:
        legal = np.flatnonzero(action_mask)
        if legal.size == 0:
            raise PolicyError("no legal action")
        return int(self._rng.choice(legal))


class PipelineConductor:
    """A fixed standard operating procedure, then submit."""

    def __init__(self, config: TeamEnvConfig, steps: Sequence[str]) -> None:
        if not steps:
            raise PolicyError("pipeline.steps: give at least one 'worker:instruction'")
        self.config, self.name = config, "pipeline"
        self.steps = [parse_label(config, s, f"pipeline.steps[{i}]") for i, s in enumerate(steps)]
        self._i = 0

    def reset(self, seed: int | None = None) -> None:
        self._i = 0

    def act(self, obs: np.ndarray, action_mask: np.ndarray, state: Mapping[str, Any] | None = None) -> int:
        while self._i < len(self.steps):
            a = self.steps[self._i]
            self._i += 1
            if action_mask[a]:
                return a
        return _submit_or(action_mask, self.config, self.steps[0])


@dataclass(frozen=True)
class HeuristicRules:
    start: str  # first action when no candidate exists, e.g. "solver:solve"
    check: str | None = None  # tool that checks a fresh candidate, e.g. "calculator:check"
    revise: str | None = None  # who revises after a FAIL, e.g. "solver:revise"
    max_revisions: int = 2  # give up and submit after this many FAILs
    # when ``start`` has spoken but produced no candidate (a tool said N/A, an LLM gave no readable
    # answer): who goes next, e.g. "planner:solve" after a short-range planner declined; default:
    # ``revise`` (a greedy LLM asked the same thing again says the same thing)
    fallback: str | None = None


class HeuristicConductor:
    """Check-and-revise rules over the structured state (no ground truth is read)."""

    def __init__(self, config: TeamEnvConfig, rules: HeuristicRules) -> None:
        self.config, self.rules, self.name = config, rules, "heuristic"
        self._start = parse_label(config, rules.start, "heuristic.start")
        self._check = parse_label(config, rules.check, "heuristic.check") if rules.check else None
        self._revise = parse_label(config, rules.revise, "heuristic.revise") if rules.revise else None
        self._check_worker = config.decode_action(self._check)[0] if self._check is not None else None
        fallback = rules.fallback or rules.revise
        self._fallback = parse_label(config, fallback, "heuristic.fallback") if fallback else None

    def reset(self, seed: int | None = None) -> None:
        pass

    def act(self, obs: np.ndarray, action_mask: np.ndarray, state: Mapping[str, Any] | None = None) -> int:
        if state is None:
            raise PolicyError("heuristic conductor needs the structured state (infos['conductor']['state'])")
        flags = state.get("flags") or derive_flags(state)
        turns_left = int(state["max_turns"]) - int(state["turn"])
        if not flags["has_candidate"]:
            started = any(m.get("worker") == self.config.decode_action(self._start)[0] for m in state["transcript"])
            a = self._fallback if started and self._fallback is not None else self._start
            return a if action_mask[a] else first_legal(action_mask)
        if turns_left <= 0:
            return _submit_or(action_mask, self.config, self._start)
        last = state["transcript"][-1]
        fails = sum(1 for m in state["transcript"] if m.get("verdict") in ("fail", "n/a"))
        if self._check is not None and not flags["verdict_on_current"]:
            return self._check if action_mask[self._check] else _submit_or(action_mask, self.config, self._start)
        if flags["last_verdict"] == "pass":
            return _submit_or(action_mask, self.config, self._start)
        if (
            flags["last_verdict"] in ("fail", "n/a")  # wrong, or the tool could not read it
            and last["worker"] == self._check_worker
            and self._revise is not None
            and fails <= self.rules.max_revisions
            and turns_left >= 1
        ):
            return self._revise if action_mask[self._revise] else first_legal(action_mask)
        return _submit_or(action_mask, self.config, self._start)
