"""Perturbed communication around a :class:`~envs.team_env.TeamEnv` (PettingZoo AEC wrappers): how robust is a
conductor (and its team) when messages are lost or garbled, its own decisions are noisy, or a worker is missing?

Each wrapper is seeded (``seed``) and draws from one generator per episode, ``default_rng([seed, episode seed,
kind])``, so an episode with the same seed is perturbed the same way under every conductor that takes the same
turns (paired comparisons), and reruns repeat exactly.

- :class:`MessageDrop` (``p``): a worker's message is lost with probability ``p``: the transcript gets an empty
  message in its place (its tokens were still spent), and nothing of the lost text remains anywhere the team or the
  conductor can read. LLM workers only, unless ``tools=True``.
- :class:`TextNoise` (``rate``): each character of a worker's message is replaced by a random printable one with
  probability ``rate`` (``unit="char"``), or each word dropped with that probability (``unit="word"``).
- :class:`ActionNoise` (``epsilon``): with probability ε a conductor decision is replaced by a uniformly drawn legal
  action (a free-text instruction included). :attr:`Perturbation.executed_action` is what the env carried out.
- :class:`WorkerOutage` (``p``): with probability ``p`` per episode one worker (drawn among ``workers``, default the
  LLM workers) is unavailable: its actions leave the conductor's mask. If that would leave no legal action, the
  step keeps the env's own mask (recorded as ``"outage_lifted"``).

What happened is recorded twice: :attr:`Perturbation.events` (one dict per perturbation: kind, turn, agent and
details) and, on the transcript entry a perturbation touched, ``"perturbed": KIND``. The lost or original text is
never kept where a conductor can read it (the transcript is part of its state). Wrappers stack, e.g.
``MessageDrop(TextNoise(env, 0.05), 0.2)``; :func:`perturbed` builds a stack from ``kind=value`` specs.
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from typing import Any

import numpy as np
from pettingzoo.utils.wrappers import BaseWrapper

from envs.team_env import CONDUCTOR, IllegalActionError, Instruct, TeamEnv

KINDS: dict[str, int] = {"drop": 1, "noise": 2, "action_noise": 3, "outage": 4}  # stream ids of the generators
_PRINTABLE = string.ascii_letters + string.digits + string.punctuation + " "


class Perturbation(BaseWrapper):
    """Common part: the per-episode generator, the event log, and access to the wrapped :class:`TeamEnv`."""

    kind = "none"

    def __init__(self, env: Any, seed: int = 0) -> None:
        super().__init__(env)
        self.seed = int(seed)
        self.rng = np.random.default_rng([self.seed, 0, KINDS.get(self.kind, 0)])
        self.events: list[dict[str, Any]] = []
        self.executed_action: Any = None

    @property
    def team_env(self) -> TeamEnv:
        env = self.unwrapped
        assert isinstance(env, TeamEnv), f"{type(self).__name__} wraps a TeamEnv, got {type(env).__name__}"
        return env

    def all_events(self) -> list[dict[str, Any]]:
        """This wrapper's events and those of the wrappers it wraps, in turn order."""
        inner = self.env.all_events() if isinstance(self.env, Perturbation) else []
        return sorted([*inner, *self.events], key=lambda e: e["turn"])

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> None:
        self.env.reset(seed=seed, options=options)
        self.rng = np.random.default_rng([self.seed, 0 if seed is None else int(seed), KINDS.get(self.kind, 0)])
        self.events = []
        self.executed_action = None

    def _conductor_turn(self, action: Any) -> bool:
        """A live conductor decision (not the ``None`` step PettingZoo sends a finished agent)."""
        env = self.team_env
        agent = env.agent_selection
        live = bool(env.agents) and not (env.terminations.get(agent) or env.truncations.get(agent))
        return live and agent == CONDUCTOR and action is not None

    def _event(self, **info: Any) -> None:
        self.events.append({"kind": self.kind, "turn": self.team_env.turn, **info})

    def _mark_last_message(self) -> None:
        transcript = self.team_env.transcript
        if transcript:
            transcript[-1]["perturbed"] = self.kind
            self.team_env._obs_cache = None  # the conductor's observation is re-encoded from the marked state
            self.team_env._refresh_infos()

    def step(self, action: Any) -> None:
        self.executed_action = action
        self.env.step(action)
        inner = getattr(self.env, "executed_action", None)
        if isinstance(self.env, Perturbation) and inner is not None:
            self.executed_action = inner


class _MessagePerturbation(Perturbation):
    """A wrapper that may change a worker's message before the env records it."""

    tools = False

    def _change(self, text: str) -> str | None:  # None = unchanged
        raise NotImplementedError

    def step(self, action: Any) -> None:
        env = self.team_env
        agent = env.agent_selection
        spec = next((w for w in env.config.workers if w.name == agent), None)
        dead = env.terminations.get(agent) or env.truncations.get(agent) or action is None
        if agent == CONDUCTOR or spec is None or dead or (spec.kind == "tool" and not self.tools):
            super().step(action)
            return
        text = str(action["text"]) if isinstance(action, dict) else action if isinstance(action, str) else None
        new = self._change(text) if text is not None else None
        if new is None:
            super().step(action)
            return
        changed = {**action, "text": new} if isinstance(action, dict) else new
        turn = self.team_env.turn
        super().step(changed)
        self.events.append({"kind": self.kind, "turn": turn, "agent": agent, "chars": len(text or "")})
        self._mark_last_message()


class MessageDrop(_MessagePerturbation):
    kind = "drop"

    def __init__(self, env: Any, p: float, seed: int = 0, tools: bool = False) -> None:
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"drop probability must be in [0, 1], got {p}")
        super().__init__(env, seed)
        self.p, self.tools = float(p), tools

    def _change(self, text: str) -> str | None:
        return "" if self.rng.random() < self.p else None


class TextNoise(_MessagePerturbation):
    kind = "noise"

    def __init__(self, env: Any, rate: float, seed: int = 0, unit: str = "char", tools: bool = False) -> None:
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"noise rate must be in [0, 1], got {rate}")
        if unit not in ("char", "word"):
            raise ValueError(f"noise unit must be char or word, got {unit!r}")
        super().__init__(env, seed)
        self.rate, self.unit, self.tools = float(rate), unit, tools

    def _change(self, text: str) -> str | None:
        if self.unit == "word":
            words = text.split(" ")
            keep = self.rng.random(len(words)) >= self.rate
            out = " ".join(w for w, k in zip(words, keep, strict=True) if k)
        else:
            hit = self.rng.random(len(text)) < self.rate
            picks = self.rng.integers(0, len(_PRINTABLE), size=len(text))
            out = "".join(_PRINTABLE[p] if h else c for c, h, p in zip(text, hit, picks, strict=True))
        return out if out != text else None


class ActionNoise(Perturbation):
    kind = "action_noise"

    def __init__(self, env: Any, epsilon: float, seed: int = 0) -> None:
        if not 0.0 <= epsilon <= 1.0:
            raise ValueError(f"action noise ε must be in [0, 1], got {epsilon}")
        super().__init__(env, seed)
        self.epsilon = float(epsilon)

    def step(self, action: Any) -> None:
        if self._conductor_turn(action) and self.rng.random() < self.epsilon:
            legal = np.flatnonzero(self.observe(CONDUCTOR)["action_mask"])
            if legal.size:
                drawn = int(self.rng.choice(legal))
                chosen = action.worker + ":" + action.text if isinstance(action, Instruct) else int(action)
                self._event(agent=CONDUCTOR, chosen=chosen, executed=drawn)
                action = drawn
        super().step(action)


class WorkerOutage(Perturbation):
    kind = "outage"

    def __init__(self, env: Any, p: float, seed: int = 0, workers: Sequence[str] | None = None) -> None:
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"outage probability must be in [0, 1], got {p}")
        super().__init__(env, seed)
        self.p = float(p)
        cfg = self.team_env.config
        names = [w.name for w in cfg.workers]
        pool = list(workers) if workers is not None else [w.name for w in cfg.workers if w.kind == "llm"]
        unknown = sorted(set(pool) - set(names))
        if unknown or not pool:
            raise ValueError(f"outage workers {unknown or pool} are not workers of team {cfg.name!r} ({names})")
        self.pool = pool
        self.out: str | None = None

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> None:
        super().reset(seed, options)
        self.out = str(self.rng.choice(self.pool)) if self.rng.random() < self.p else None
        if self.out is not None:
            self._event(agent=self.out)
        self._patch_infos()

    def _mask(self, mask: np.ndarray) -> np.ndarray:
        if self.out is None:
            return mask
        cfg = self.team_env.config
        out = mask.copy()
        for a in range(cfg.num_actions):
            if cfg.decode_action(a)[0] == self.out:
                out[a] = 0
        if not out.any() and mask.any():
            self._event(agent=self.out, lifted=True)
            return mask
        return out

    def _patch_infos(self) -> None:
        info = self.team_env.infos.get(CONDUCTOR)
        if info is not None and "action_mask" in info:
            info["action_mask"] = self._mask(np.asarray(info["action_mask"]))

    def observe(self, agent: str) -> Any:
        obs = self.env.observe(agent)
        if agent == CONDUCTOR and obs is not None:
            obs = {**obs, "action_mask": self._mask(obs["action_mask"])}
        return obs

    def step(self, action: Any) -> None:
        if self.out is not None and self._conductor_turn(action) and not isinstance(action, Instruct):
            a = int(action)
            if (
                self.team_env.config.decode_action(a)[0] == self.out
                and not self._mask(self.env.observe(CONDUCTOR)["action_mask"])[a]
            ):
                raise IllegalActionError(f"conductor action {a}: worker {self.out} is out for this episode")
        super().step(action)
        self._patch_infos()


WRAPPERS: dict[str, Any] = {  # kind -> wrapper class, built as Wrapper(env, strength, seed=seed)
    "drop": MessageDrop,
    "noise": TextNoise,
    "action_noise": ActionNoise,
    "outage": WorkerOutage,
}


def parse_perturbation(spec: str) -> tuple[str, float]:
    """``"drop=0.2"`` → ("drop", 0.2); a ValueError names the spec and the known kinds."""
    kind, sep, value = spec.partition("=")
    kind = kind.strip()
    if not sep or kind not in WRAPPERS:
        raise ValueError(f"perturbation {spec!r}: expected KIND=STRENGTH with KIND one of {sorted(WRAPPERS)}")
    try:
        strength = float(value)
    except ValueError as e:
        raise ValueError(f"perturbation {spec!r}: strength {value!r} is not a number") from e
    if not 0.0 <= strength <= 1.0:
        raise ValueError(f"perturbation {spec!r}: strength must be in [0, 1]")
    return kind, strength


ORDER = ("drop", "noise", "outage", "action_noise")  # innermost first: a noisy decision draws among available workers


def perturbed(env: Any, specs: Sequence[str], seed: int = 0) -> Any:
    """``env`` wrapped by one wrapper per ``kind=strength`` spec, stacked in :data:`ORDER` (message wrappers
    innermost, action noise outermost, so a noisy decision is drawn from the mask an outage left). A kind given twice
    is an error."""
    parsed = [parse_perturbation(s) for s in specs]
    kinds = [k for k, _ in parsed]
    if len(set(kinds)) != len(kinds):
        raise ValueError(f"perturbations {list(specs)}: each kind at most once")
    for kind, strength in sorted(parsed, key=lambda ks: ORDER.index(ks[0])):
        env = WRAPPERS[kind](env, strength, seed=seed)
    return env


__all__ = [
    "KINDS",
    "ORDER",
    "WRAPPERS",
    "ActionNoise",
    "MessageDrop",
    "Perturbation",
    "TextNoise",
    "WorkerOutage",
    "parse_perturbation",
    "perturbed",
]
