"""The env's view of a team: workers, instruction vocabulary, turn budget, reward weights.

This is the pure part of a team file (``orchestra/teams/*.yaml``); the LLM side (backends,
generation parameters) is parsed in ``orchestra.runtime.team_file``. Every knob is declared with a default.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, get_args

# Named reward components (docs/architecture.md §3). Each step reports all of them; the scalar reward is the
# weighted sum with ``TeamEnvConfig.reward_weights``.
#   success    verifier score of the submitted answer in [0, 1], on the submit step only
#   turn_cost  -1 for each worker turn the conductor spends
#   token_cost -(completion tokens of the worker's message) / 100
#   progress   +1 when a tool says PASS on the current candidate answer, -1 when it says FAIL
#   format     -1 when an answer-proposing LLM message contains no extractable answer
#   price      -(the acting worker's price for the turn): its ``price_per_call`` + ``price_per_token`` × its completion
#              tokens, in the team's own currency (a priced team weighs it against success; 0 for an unpriced worker)
REWARD_COMPONENTS: tuple[str, ...] = ("success", "turn_cost", "token_cost", "progress", "format", "price")
DEFAULT_REWARD_WEIGHTS: Mapping[str, float] = {
    "success": 1.0,
    "turn_cost": 0.02,
    "token_cost": 0.01,
    "progress": 0.0,
    "format": 0.02,
    "price": 0.0,
}

Visibility = Literal["all", "own", "last", "task"]


Requirement = Literal["message", "candidate"]
REQUIREMENTS: tuple[str, ...] = ("message", "candidate")


@dataclass(frozen=True)
class WorkerSpec:
    """One worker as the env sees it."""

    name: str  # unique agent name in the AEC env
    kind: Literal["llm", "tool"] = "llm"  # tools are deterministic functions (no tokens, no sampling)
    instructions: tuple[str, ...] = ()  # instruction names the conductor may give this worker
    # which part of the transcript the worker sees: all messages, only its own, only the latest
    # message, or only the task; or an explicit tuple of worker names whose messages it sees
    sees: Visibility | tuple[str, ...] = "all"
    proposes_answer: bool = True  # its messages are candidate answers that "submit" can submit
    # for tools: the verdicts whose message carries an answer (a calculator's FAIL states the right
    # value; a checker's FAIL only names the broken clue)
    answer_verdicts: tuple[str, ...] = ("pass",)
    # preconditions of instructions: ("check", "candidate") masks check until a candidate answer
    # exists, ("revise", "message") masks revise until some worker has spoken; the conductor is never
    # offered a turn that has nothing to work on
    requires: tuple[tuple[str, Requirement], ...] = ()
    role_prompt: str = ""  # system prompt (LLM workers)
    prompt_version: str = "v1"  # bump when the role prompt changes; logged in every message
    # demonstrations (LLM workers): (task prompt, reply) pairs played as earlier user/assistant turns of the chat, each
    # user turn laid out like the real one (the worker's first instruction, then the task); a small model follows a
    # format it has seen answered far better than one it is only told about
    examples: tuple[tuple[str, str], ...] = ()
    # what a turn of this worker costs (the reward's ``price`` component): per call, plus per completion token
    price_per_call: float = 0.0
    price_per_token: float = 0.0

    def price(self, tokens: int) -> float:
        """This worker's price for one turn of ``tokens`` completion tokens."""
        return self.price_per_call + self.price_per_token * tokens


Embedder = Literal["minilm", "hash", "none"]  # sentence encoders of the observation (none: no embedding features)
EMBEDDERS: tuple[str, ...] = get_args(Embedder)


@dataclass(frozen=True)
class TeamEnvConfig:
    """Everything the env needs to run one team on one task family."""

    name: str  # team name, logged in trajectories
    workers: tuple[WorkerSpec, ...]
    instructions: Mapping[str, str]  # instruction name -> text appended to the worker's chat
    max_turns: int = 6  # worker turns before truncation (the turn budget)
    reward_weights: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_REWARD_WEIGHTS))
    embedder: Embedder = "minilm"  # sentence encoder of the observation
    recent_messages: int = 1  # how many latest messages are embedded into the observation
    max_message_chars: int = 2000  # transcript entries are cut to this length in worker chats
    # submit is legal before any candidate answer exists: the conductor may end a hopeless episode
    # unanswered (scored as a failure) instead of spending turns until the budget truncates it
    give_up: bool = False

    def __post_init__(self) -> None:
        names = [w.name for w in self.workers]
        if not names:
            raise ValueError("workers: a team needs at least one worker")
        if len(set(names)) != len(names):
            raise ValueError(f"workers: duplicate worker names in {names}")
        if "conductor" in names:
            raise ValueError("workers: 'conductor' is reserved for the scheduling agent")
        for i, w in enumerate(self.workers):
            if not w.instructions:
                raise ValueError(f"workers[{i}] ({w.name}).instructions: give at least one instruction")
            for ins, req in w.requires:
                if ins not in w.instructions:
                    raise ValueError(
                        f"workers[{i}] ({w.name}).requires: {ins!r} is not one of its instructions "
                        f"{list(w.instructions)}"
                    )
                if req not in REQUIREMENTS:
                    raise ValueError(
                        f"workers[{i}] ({w.name}).requires.{ins}: expected one of {list(REQUIREMENTS)}, got {req!r}"
                    )
            for ins in w.instructions:
                if ins not in self.instructions:
                    raise ValueError(
                        f"workers[{i}] ({w.name}).instructions: {ins!r} is not declared under instructions "
                        f"(declared: {sorted(self.instructions)})"
                    )
            for key, v in (("per_call", w.price_per_call), ("per_token", w.price_per_token)):
                if v < 0:
                    raise ValueError(f"workers[{i}] ({w.name}).price.{key}: must be >= 0, got {v}")
            if w.examples and w.kind != "llm":
                raise ValueError(f"workers[{i}] ({w.name}).examples: only an llm worker reads demonstrations")
            if isinstance(w.sees, tuple):
                for other in w.sees:
                    if other not in names:
                        raise ValueError(f"workers[{i}] ({w.name}).sees: unknown worker {other!r}")
        if self.max_turns < 1:
            raise ValueError("max_turns: must be >= 1")
        for k in self.reward_weights:
            if k not in REWARD_COMPONENTS:
                raise ValueError(f"reward_weights.{k}: unknown component (known: {', '.join(REWARD_COMPONENTS)})")
        if self.recent_messages < 0:
            raise ValueError("recent_messages: must be >= 0")

    def scalarise(self, vector: Mapping[str, float]) -> float:
        """The scalar reward: the weighted sum of the named components."""
        return float(sum(self.reward_weights.get(k, 0.0) * v for k, v in vector.items()))

    @property
    def worker_names(self) -> tuple[str, ...]:
        return tuple(w.name for w in self.workers)

    @property
    def instruction_names(self) -> tuple[str, ...]:
        return tuple(self.instructions)

    @property
    def num_actions(self) -> int:
        """Conductor actions: one per (worker, instruction) pair, plus submit (the last id)."""
        return len(self.workers) * len(self.instructions) + 1

    @property
    def submit_action(self) -> int:
        return self.num_actions - 1

    def action_id(self, worker: str, instruction: str) -> int:
        w = self.worker_names.index(worker)
        k = self.instruction_names.index(instruction)
        return w * len(self.instructions) + k

    def decode_action(self, action: int) -> tuple[str | None, str | None]:
        """(worker, instruction) of an action id; (None, None) for submit."""
        if not 0 <= action < self.num_actions:
            raise ValueError(f"action {action} out of range [0, {self.num_actions})")
        if action == self.submit_action:
            return None, None
        w, k = divmod(action, len(self.instructions))
        return self.worker_names[w], self.instruction_names[k]

    def action_label(self, action: int) -> str:
        worker, instruction = self.decode_action(action)
        return "submit" if worker is None else f"{worker}:{instruction}"
