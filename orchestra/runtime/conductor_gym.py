"""The conductor's single-agent Gymnasium view of a team, with the workers inside, and safety rails.

``ConductorGymEnv`` wraps one :class:`envs.team_env.TeamEnv`: ``step(action)`` applies the conductor's
action and, when it picks a worker, runs that worker at once (one ``backend.generate`` call, exactly as
the rollout engine does), so from the learner's side an episode is a plain sequence of conductor
decisions. Observation = the conductor's float32 vector; ``action_space = Discrete(num_actions)``;
``action_masks()`` (the method sb3-contrib's MaskablePPO looks for) gives the legal actions *after* the
rails.

Safety rails constrain what a learned scheduler may do while it learns online (the issue's source
article: an online learner must not be free to do anything the env allows):

* ``allow`` — an allow-list of action labels: the others are removed from the mask, so a masked agent
  never takes them. If an agent sends a masked action anyway, ``on_illegal`` says what happens:
  ``"raise"`` (default) raises :class:`RailViolation`; ``"refuse"`` does not execute it (same
  observation, reward 0, ``info["rail"] == "illegal"``) — for Gymnasium's ``check_env`` and unmasked
  agents, whose random samples ignore masks.
* ``max_turns`` / ``max_tokens`` — per-episode budgets; spending one truncates the episode at once
  (``info["rail"]`` names it). Unlike the team's own turn budget, no last submit decision is granted:
  a rail is a hard stop.
* ``risky`` + ``approve`` — actions that need a person's yes (default: submit). A denied action is not
  executed; the episode goes on with that action masked for this decision (truncated if nothing else
  is legal).

Every episode's end puts ``info["episode_metrics"]`` (flat namespaced numbers: ``rollout/…``,
``rails/…``), which the online trainer aggregates per rollout.
"""

from __future__ import annotations

import fnmatch
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TextIO

import gymnasium
import numpy as np
from gymnasium import spaces
from gymnasium.utils import seeding

from envs.config import REWARD_COMPONENTS, TeamEnvConfig
from envs.observation import ObservationEncoder
from envs.tasks.base import Split, Task, TaskFamily
from envs.team_env import CONDUCTOR, IllegalActionError, TeamEnv
from orchestra.runtime.rollout import turn_seed
from orchestra.runtime.team_file import TeamSpec
from orchestra.runtime.workers import Worker

Approval = Callable[[str, Mapping[str, Any]], bool]  # (action label, structured state) -> approved?
RAIL_COUNTERS = ("rails/denied", "rails/budget_truncations", "rails/filtered", "rails/refused")


class RailViolation(IllegalActionError):
    """An agent sent an action that the env or a safety rail forbids at this decision."""


@dataclass(frozen=True)
class SafetyRails:
    """What the learner may do online. Labels are ``"worker:instruction"`` or ``"submit"``; ``allow``
    and ``risky`` entries may be shell patterns (``"solver:*"``)."""

    allow: tuple[str, ...] = ()  # allow-list of action labels (empty = every action the env allows)
    max_turns: int | None = None  # worker turns per episode; spending them truncates (None = team budget only)
    max_tokens: int | None = None  # worker completion tokens per episode; spending them truncates
    risky: tuple[str, ...] = ("submit",)  # labels that need approval (only when ``approve`` is set)
    approve: Approval | None = None  # approval hook, e.g. ``terminal_approval()``; None = no approval step
    on_illegal: Literal["raise", "refuse"] = "raise"  # a masked action: raise RailViolation, or refuse it

    def validate(self, config: TeamEnvConfig) -> None:
        """Every pattern must match some action of the team (a typo would silently filter nothing)."""
        labels = action_labels(config)
        for field_name, patterns in (("allow", self.allow), ("risky", self.risky)):
            for p in patterns:
                if not any(fnmatch.fnmatchcase(lb, p) for lb in labels):
                    raise ValueError(f"rails.{field_name}: {p!r} matches no action of team {config.name!r} ({labels})")
        for name, v in (("max_turns", self.max_turns), ("max_tokens", self.max_tokens)):
            if v is not None and v < 1:
                raise ValueError(f"rails.{name}: must be >= 1 or None, got {v}")
        if self.on_illegal not in ("raise", "refuse"):
            raise ValueError(f"rails.on_illegal: expected 'raise' or 'refuse', got {self.on_illegal!r}")

    def allowed(self, config: TeamEnvConfig) -> np.ndarray:
        """(num_actions,) bool: the actions the allow-list keeps."""
        labels = action_labels(config)
        if not self.allow:
            return np.ones(len(labels), dtype=bool)
        return np.array([any(fnmatch.fnmatchcase(lb, p) for p in self.allow) for lb in labels], dtype=bool)

    def is_risky(self, label: str) -> bool:
        return self.approve is not None and any(fnmatch.fnmatchcase(label, p) for p in self.risky)


def action_labels(config: TeamEnvConfig) -> list[str]:
    return [config.action_label(a) for a in range(config.num_actions)]


def terminal_approval(stdin: TextIO | None = None, stdout: TextIO | None = None) -> Approval:
    """An approval hook that asks a person on a terminal: ``approve submit? [y/N]``.

    Only ``y``/``yes`` (any case) approves; anything else, and a closed input, denies — the safe default.
    """
    src, out = stdin if stdin is not None else sys.stdin, stdout if stdout is not None else sys.stdout

    def approve(label: str, state: Mapping[str, Any]) -> bool:
        task = state.get("task", {})
        flags = state.get("flags", {})
        out.write(f"\n[rails] task {task.get('id')} (turn {state.get('turn')}/{state.get('max_turns')})\n")
        prompt = str(task.get("prompt", ""))
        out.write(prompt[:500] + ("…" if len(prompt) > 500 else "") + "\n")
        if flags.get("candidate") is not None:
            out.write(f"candidate answer: {flags['candidate']}\n")
        out.write(f"approve {label}? [y/N] ")
        out.flush()
        return src.readline().strip().lower() in ("y", "yes")

    return approve


class ConductorGymEnv(gymnasium.Env[np.ndarray, np.int64]):
    """One team on one task family as a single-agent env for the conductor (module docstring)."""

    metadata = {"render_modes": ["ansi"]}

    def __init__(
        self,
        team: TeamSpec,
        family: TaskFamily,
        workers: Mapping[str, Worker],
        rails: SafetyRails | None = None,
        split: Split = "train",
        difficulty: int | None = None,
        seed: int = 0,
        *,
        tasks: Sequence[Task] | None = None,
        encoder: ObservationEncoder | None = None,
        render_mode: str | None = None,
    ) -> None:
        missing = [w for w in team.env.worker_names if w not in workers]
        if missing:
            raise ValueError(f"team {team.name!r}: no Worker given for {missing}")
        self.team, self.family, self.workers = team, family, dict(workers)
        self.config: TeamEnvConfig = team.env
        self.rails = rails if rails is not None else SafetyRails()
        self.rails.validate(self.config)
        self.render_mode = render_mode
        self.team_env = TeamEnv(
            self.config,
            family,
            split=split,
            tasks=tasks,
            difficulty=difficulty,
            encoder=encoder,
            render_mode=render_mode,
        )
        self.encoder = self.team_env.encoder
        self.observation_space = spaces.Box(-np.inf, np.inf, shape=(self.encoder.size,), dtype=np.float32)
        self.action_space = spaces.Discrete(self.config.num_actions)
        self._allowed = self.rails.allowed(self.config)
        # seeded here so that a first reset() without a seed is reproducible too
        self._np_random, self._np_random_seed = seeding.np_random(seed)
        self.rail_totals: dict[str, int] = dict.fromkeys(RAIL_COUNTERS, 0)  # over the env's lifetime
        self._episode_seed = 0
        self._denied: set[int] = set()
        self._ended = True
        self._ep: dict[str, float] = {}

    # -- masks ------------------------------------------------------------------------------------
    def action_masks(self) -> np.ndarray:
        """(num_actions,) bool: legal in the env, kept by the allow-list, not denied at this decision."""
        if self._ended:
            return np.zeros(self.config.num_actions, dtype=bool)
        mask = self.team_env.action_mask().astype(bool) & self._allowed
        for a in self._denied:
            mask[a] = False
        return mask

    # -- episode control --------------------------------------------------------------------------
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        # the task and the workers' sampling seeds derive from this; the stream continues across resets
        self._episode_seed = int(self.np_random.integers(0, 2**31 - 1))
        self.team_env.reset(seed=self._episode_seed, options=options)
        self.action_space.seed(self._episode_seed)
        self._denied = set()
        self._ended = False
        self._ep = {"return": 0.0, "decisions": 0, "tokens": 0, **dict.fromkeys(RAIL_COUNTERS, 0)}
        self._count_filtered()
        rail = self._dead_end_rail()
        if rail is not None:  # e.g. an allow-list that leaves nothing legal at the first decision
            raise ValueError(f"rails: no action is legal at the start of an episode ({rail}); check rails.allow")
        return self._obs(), self._info({name: 0.0 for name in REWARD_COMPONENTS}, tokens=0)

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        if self._ended:
            raise RuntimeError("the episode has ended: call reset() before step()")
        a = int(action)
        vec = dict.fromkeys(REWARD_COMPONENTS, 0.0)
        mask = self.action_masks()
        if not 0 <= a < self.config.num_actions or not mask[a]:
            return self._illegal(a, mask, vec)
        label = self.config.action_label(a)
        env = self.team_env
        if self.rails.is_risky(label):
            assert self.rails.approve is not None
            if not self.rails.approve(label, env.state_dict()):
                self._denied.add(a)
                self._bump("rails/denied")
                rail = self._dead_end_rail()
                return self._finish(vec, 0, truncated_by="approval" if rail else None, denied=label)
        self._denied = set()  # a denial holds for one decision only
        self._ep["decisions"] += 1
        env.step(a)
        vec = dict(env.step_reward_vector)
        tokens = 0
        if env.agents and env.agent_selection != CONDUCTOR and not self._env_ended():
            tokens = self._worker_turn(env.agent_selection, vec)
        if self._env_ended():
            return self._finish(vec, tokens)
        # a budget rail is checked after the worker's turn: it may overshoot by one message's tokens
        if self.rails.max_turns is not None and env.turn >= self.rails.max_turns:
            self._bump("rails/budget_truncations")
            return self._finish(vec, tokens, truncated_by="max_turns")
        if self.rails.max_tokens is not None and self._ep["tokens"] >= self.rails.max_tokens:
            self._bump("rails/budget_truncations")
            return self._finish(vec, tokens, truncated_by="max_tokens")
        self._count_filtered()
        rail = self._dead_end_rail()
        return self._finish(vec, tokens, truncated_by=rail)

    def _worker_turn(self, name: str, vec: dict[str, float]) -> int:
        """One worker message, made exactly as the rollout engine makes it (same per-turn seed)."""
        env = self.team_env
        worker = self.workers[name]
        assert env.task is not None
        request = worker.request(
            env.worker_chat(name), env.task, env.transcript, turn_seed(self._episode_seed, env.turn)
        )
        (completion,) = worker.backend.generate([request])
        env.step(Worker.env_action(completion))
        for k, v in env.step_reward_vector.items():
            vec[k] += v
        tokens = int(completion.usage.completion_tokens)
        self._ep["tokens"] += tokens
        return tokens

    def _illegal(
        self, a: int, mask: np.ndarray, vec: dict[str, float]
    ) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        in_range = 0 <= a < self.config.num_actions
        label = self.config.action_label(a) if in_range else f"<{a}>"
        if not in_range:
            why = f"out of range [0, {self.config.num_actions})"
        elif a in self._denied:
            why = "denied by the approver at this decision"
        elif not self._allowed[a]:
            why = f"not in rails.allow {list(self.rails.allow)}"
        else:
            why = "masked by the env"
        if self.rails.on_illegal == "raise":
            legal = [self.config.action_label(int(i)) for i in np.flatnonzero(mask)]
            raise RailViolation(f"conductor action {a} ({label}) is {why}; legal: {legal}")
        self._bump("rails/refused")
        obs, _, term, trunc, info = self._finish(vec, 0)
        info["illegal"] = f"{label}: {why}"
        info["rail"] = "illegal"
        return obs, 0.0, term, trunc, info

    # -- bookkeeping ------------------------------------------------------------------------------
    def _env_ended(self) -> bool:
        env = self.team_env
        return any(env.terminations.values()) or any(env.truncations.values())

    def _dead_end_rail(self) -> str | None:
        """Which rail left no legal action at a decision the env itself still offers (None: fine)."""
        if self._env_ended() or self.action_masks().any():
            return None
        return "approval" if self._denied else "allow"

    def _count_filtered(self) -> None:
        env_mask = self.team_env.action_mask().astype(bool)
        if (env_mask & ~self._allowed).any():
            self._bump("rails/filtered")

    def _bump(self, key: str) -> None:
        self._ep[key] += 1
        self.rail_totals[key] += 1

    def _obs(self) -> np.ndarray:
        return self.team_env.observe(CONDUCTOR)["observation"]

    def _finish(
        self, vec: dict[str, float], tokens: int, truncated_by: str | None = None, denied: str | None = None
    ) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        env = self.team_env
        terminated = any(env.terminations.values())
        truncated = not terminated and (any(env.truncations.values()) or truncated_by is not None)
        reward = self.config.scalarise(vec)
        self._ep["return"] += reward
        info = self._info(vec, tokens)
        info["rail"] = truncated_by
        if denied is not None:
            info["denied"] = denied
        if terminated or truncated:
            self._ended = True
            verdict = env.final_verdict
            info["episode_metrics"] = {
                "rollout/ep_return_mean": self._ep["return"],
                "rollout/ep_len_mean": self._ep["decisions"],
                "rollout/ep_turns_mean": env.turn,
                "rollout/ep_tokens_mean": self._ep["tokens"],
                "rollout/success_rate": float(verdict is not None and verdict.correct),
                **{k: self._ep[k] for k in RAIL_COUNTERS},
            }
        return self._obs(), reward, terminated, truncated, info

    def _info(self, vec: Mapping[str, float], tokens: int) -> dict[str, Any]:
        env = self.team_env
        return {
            "reward_vector": dict(vec),
            "state": env.state_dict(),
            "action_mask": self.action_masks(),
            "tokens": tokens,  # worker completion tokens of this step
            "episode_tokens": int(self._ep.get("tokens", 0)),
            "episode_seed": self._episode_seed,
            "rails": {k: int(self._ep.get(k, 0)) for k in RAIL_COUNTERS},  # this episode so far
        }

    def render(self) -> str | None:  # type: ignore[override]
        return self.team_env.render() if self.render_mode == "ansi" else None

    def close(self) -> None:
        self.team_env.close()


__all__ = [
    "RAIL_COUNTERS",
    "Approval",
    "ConductorGymEnv",
    "RailViolation",
    "SafetyRails",
    "action_labels",
    "terminal_approval",
]
