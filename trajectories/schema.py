"""Trajectory records: one `Episode` per JSONL line, made of `Step`s (docs/architecture.md §4).

Why validate so hard: these files are the only record of expensive LLM rollouts and the input of
offline RL. A record that is accepted when written must be readable later, and a record that is
wrong must be rejected with the exact field that is wrong (``steps[3].action.id: expected int, got
str``), not with a ``KeyError`` three layers down in a dataset builder.

Validation therefore happens in two places that share one code path:

- construction (``__post_init__``) checks types and invariants and *normalises* values: numpy
  scalars and arrays become plain Python numbers and lists, tuples become lists, and JSON payloads
  (``state``, ``usage``, ``metadata``) are deep-copied, so an env that keeps mutating its transcript
  dict cannot silently change a step that was already recorded;
- ``from_dict`` checks the JSON shape (missing and unknown fields, nested objects) and then builds
  the records, so the same invariants hold for what is read back.

Floats: ``observation`` and ``final_observation`` are rounded to 6 decimals when a step is built.
Observations are float32 vectors of O(1) features (docs/architecture.md §3); 6 decimals keeps them to within
float32 noise while the JSON stays short (``0.1`` instead of ``0.10000000149011612``). Rounding
happens at construction, so ``from_dict(json.loads(json.dumps(e.to_dict()))) == e`` holds exactly.
Observations, rewards, returns and scores must be finite (a NaN there is an encoder or reward bug);
log-probabilities may be ``-inf`` (a token impossible under the behaviour policy), which Python's
``json`` writes as ``-Infinity``.

The records are frozen dataclasses ("frozen-ish": the lists and dicts inside can still be mutated in
place, so the store re-validates an episode when it writes it).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Any, Literal, TypeVar

SCHEMA_VERSION = 1
"""Version written into every episode line; readers refuse versions they do not know."""

ActionKind = Literal["worker", "submit"]
ACTION_KINDS: tuple[str, ...] = ("worker", "submit")
VERDICTS: tuple[str, ...] = ("pass", "fail", "n/a")
"""A deterministic tool's verdict on its own output; LLM workers have ``verdict=None``."""

_T = TypeVar("_T")


class SchemaError(ValueError):
    """A record does not match the schema; ``path`` names the field (``steps[3].action.id``).

    The args are ``(path, message)`` so the exception survives pickling (multiprocessing rollouts).
    """

    def __init__(self, path: str, message: str) -> None:
        super().__init__(path, message)
        self.path = path
        self.message = message

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message

    def under(self, prefix: str) -> SchemaError:
        """The same error seen from an enclosing record (``action.id`` under ``steps[3]``)."""
        return SchemaError(_join(prefix, self.path), self.message)


# ----------------------------------------------------------------------------- value checkers
# Each checker returns the normalised value or raises SchemaError(path, ...). They accept numpy
# scalars (registered with the `numbers` ABCs) and arrays (via `.tolist()`), since envs produce them.


def _join(prefix: str, path: str) -> str:
    if not prefix:
        return path
    if not path:
        return prefix
    return prefix + path if path.startswith("[") else f"{prefix}.{path}"


def _type_name(value: Any) -> str:
    return "None" if value is None else type(value).__name__


def _int(value: Any, path: str, *, minimum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise SchemaError(path, f"expected int, got {_type_name(value)}")
    out = int(value)
    if minimum is not None and out < minimum:
        raise SchemaError(path, f"expected int >= {minimum}, got {out}")
    return out


def _float(value: Any, path: str, *, finite: bool = True) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise SchemaError(path, f"expected float, got {_type_name(value)}")
    out = float(value)
    if finite and not math.isfinite(out):
        raise SchemaError(path, f"expected a finite float, got {out}")
    if math.isnan(out):
        raise SchemaError(path, "expected a float, got NaN")
    return out


def _bool(value: Any, path: str) -> bool:
    if isinstance(value, bool):
        return value
    if type(value).__name__ == "bool_" and hasattr(value, "item"):  # numpy.bool_, without importing numpy
        return bool(value.item())
    raise SchemaError(path, f"expected bool, got {_type_name(value)}")


def _str(value: Any, path: str, *, nonempty: bool = False) -> str:
    if not isinstance(value, str):
        raise SchemaError(path, f"expected str, got {_type_name(value)}")
    if nonempty and not value:
        raise SchemaError(path, "expected a non-empty str")
    return value


def _opt_str(value: Any, path: str) -> str | None:
    return None if value is None else _str(value, path)


def _as_list(value: Any, path: str) -> list[Any]:
    if isinstance(value, list | tuple):
        return list(value)
    if hasattr(value, "tolist") and not isinstance(value, str | bytes):  # numpy arrays
        out = value.tolist()
        if isinstance(out, list):
            return out
    raise SchemaError(path, f"expected list, got {_type_name(value)}")


def _int_list(value: Any, path: str) -> list[int]:
    items = _as_list(value, path)
    if all(type(x) is int for x in items):  # fast path: token ids are long
        return items
    return [_int(x, f"{path}[{i}]") for i, x in enumerate(items)]


def _float_list(value: Any, path: str, *, finite: bool = True, decimals: int | None = None) -> list[float]:
    items = _as_list(value, path)
    if all(type(x) is float and math.isfinite(x) for x in items):  # fast path
        out = items
    else:
        out = [_float(x, f"{path}[{i}]", finite=finite) for i, x in enumerate(items)]
    if decimals is not None:
        out = [round(x, decimals) for x in out]
    return out


def _str_list(value: Any, path: str) -> list[str]:
    return [_str(x, f"{path}[{i}]") for i, x in enumerate(_as_list(value, path))]


def _str_dict(value: Any, path: str, check: Any) -> dict[str, Any]:
    """A JSON object with str keys whose values pass `check(value, path)`."""
    if not isinstance(value, dict):
        raise SchemaError(path, f"expected object, got {_type_name(value)}")
    out: dict[str, Any] = {}
    for key, item in value.items():
        if not isinstance(key, str):
            raise SchemaError(path, f"expected str keys, got key {key!r} ({_type_name(key)})")
        out[key] = check(item, _join(path, key))
    return out


def _json(value: Any, path: str) -> Any:
    """A normalised deep copy of a JSON value (str keys only; tuples -> lists; numpy -> Python).

    Rejecting non-str keys matters: ``json.dumps`` would silently turn ``{1: x}`` into ``{"1": x}``,
    and the record would no longer equal itself after a round trip.
    """
    if value is None or isinstance(value, str | bool):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if type(value).__name__ == "bool_" and hasattr(value, "item"):
        return bool(value.item())
    if isinstance(value, dict):
        return _str_dict(value, path, _json)
    if isinstance(value, list | tuple) or (hasattr(value, "tolist") and not isinstance(value, bytes)):
        return [_json(x, f"{path}[{i}]") for i, x in enumerate(_as_list(value, path))]
    raise SchemaError(path, f"not JSON-serialisable: {_type_name(value)}")


def _json_object(value: Any, path: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise SchemaError(path, f"expected object, got {_type_name(value)}")
    out: dict[str, Any] = _json(value, path)
    return out


def _instance(value: Any, path: str, cls: type[_T]) -> _T:
    if not isinstance(value, cls):
        raise SchemaError(path, f"expected {cls.__name__}, got {_type_name(value)}")
    return value


def _set(obj: object, name: str, value: Any) -> None:
    object.__setattr__(obj, name, value)  # the one sanctioned write into a frozen record


# ----------------------------------------------------------------------------- from_dict plumbing

_JSON_NAMES = {"return_": "return"}  # attribute -> JSON key, where Python reserves the word


def _kwargs(cls: type, data: Any, path: str) -> dict[str, Any]:
    """Check a JSON object against a record's fields: no missing, no unknown keys."""
    if not isinstance(data, dict):
        raise SchemaError(path, f"expected object, got {_type_name(data)}")
    attrs = {_JSON_NAMES.get(f.name, f.name): f for f in fields(cls)}
    for key in data:
        if key not in attrs:
            raise SchemaError(_join(path, str(key)), "unknown field")
    kwargs: dict[str, Any] = {}
    for key, f in attrs.items():
        if key in data:
            kwargs[f.name] = data[key]
        elif f.default is MISSING and f.default_factory is MISSING:  # a required field
            raise SchemaError(_join(path, key), "missing field")
    return kwargs


def _build(cls: type[_T], kwargs: dict[str, Any], path: str) -> _T:
    try:
        return cls(**kwargs)
    except SchemaError as err:
        raise err.under(path) from None


class _Record:
    """Shared `to_dict`; JSON keys equal attribute names except ``return_`` -> ``return``."""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (a deep copy: mutating it does not touch the record)."""
        return {_JSON_NAMES.get(k, k): v for k, v in asdict(self).items()}  # type: ignore[call-overload]


# ----------------------------------------------------------------------------- records


@dataclass(frozen=True)
class TaskRef(_Record):
    """Which task was played; enough to regenerate it (family + seed + difficulty)."""

    id: str
    family: str
    split: str
    seed: int
    difficulty: int

    def __post_init__(self) -> None:
        _str(self.id, "id", nonempty=True)
        _str(self.family, "family", nonempty=True)
        _str(self.split, "split", nonempty=True)
        _set(self, "seed", _int(self.seed, "seed"))
        _set(self, "difficulty", _int(self.difficulty, "difficulty"))

    @classmethod
    def from_dict(cls, data: Any, path: str = "") -> TaskRef:
        return _build(cls, _kwargs(cls, data, path), path)


@dataclass(frozen=True)
class TeamRef(_Record):
    """The worker team: names, and per worker the model id and prompt version that answered."""

    name: str
    workers: list[str]
    model_ids: dict[str, str]
    prompt_versions: dict[str, str]

    def __post_init__(self) -> None:
        _str(self.name, "name")
        _set(self, "workers", _str_list(self.workers, "workers"))
        _set(self, "model_ids", _str_dict(self.model_ids, "model_ids", _str))
        _set(self, "prompt_versions", _str_dict(self.prompt_versions, "prompt_versions", _str))

    @classmethod
    def from_dict(cls, data: Any, path: str = "") -> TeamRef:
        return _build(cls, _kwargs(cls, data, path), path)


@dataclass(frozen=True)
class ConductorRef(_Record):
    """The conductor policy that chose the actions (the behaviour policy, for offline RL)."""

    name: str
    checkpoint: str | None = None

    def __post_init__(self) -> None:
        _str(self.name, "name", nonempty=True)
        _opt_str(self.checkpoint, "checkpoint")

    @classmethod
    def from_dict(cls, data: Any, path: str = "") -> ConductorRef:
        return _build(cls, _kwargs(cls, data, path), path)


@dataclass(frozen=True)
class Action(_Record):
    """A conductor action: the discrete id plus its decoding, so files stay readable on their own.

    ``kind == "submit"`` has no worker and no instruction; ``kind == "worker"`` names the worker
    (the instruction may be None for teams without an instruction menu).

    An instruction in the conductor's own words (a human expert's, an instruction-writing LLM's: ``envs.Instruct``)
    keeps its ``text``; ``id`` and ``instruction`` are then the nearest declared instruction, the discrete action
    learners train on, and ``similarity`` is the cosine similarity of the two under the team's encoder. Both fields
    are left out of the JSON when absent, so files without free-text instructions read as they always did.
    """

    id: int
    kind: ActionKind
    worker: str | None = None
    instruction: str | None = None
    text: str | None = None
    similarity: float | None = None

    def __post_init__(self) -> None:
        _set(self, "id", _int(self.id, "id", minimum=0))
        if self.kind not in ACTION_KINDS:
            raise SchemaError("kind", f"expected one of {list(ACTION_KINDS)}, got {self.kind!r}")
        _opt_str(self.instruction, "instruction")
        if self.kind == "submit":
            if self.worker is not None or self.instruction is not None:
                raise SchemaError("worker", "a submit action has worker=None and instruction=None")
            if self.text is not None:
                raise SchemaError("text", "a submit action carries no instruction text")
        else:
            _str(self.worker, "worker", nonempty=True)
        if self.text is not None:
            _str(self.text, "text", nonempty=True)
            if self.similarity is None:
                raise SchemaError("similarity", "an action with an instruction text needs its similarity")
        if self.similarity is not None:
            if self.text is None:
                raise SchemaError("similarity", "a similarity without an instruction text")
            _set(self, "similarity", _float(self.similarity, "similarity"))

    def to_dict(self) -> dict[str, Any]:
        d = super().to_dict()
        for k in ("text", "similarity"):
            if d.get(k) is None:
                d.pop(k, None)
        return d

    @property
    def label(self) -> str:
        """``"worker:instruction"``, ``"worker"`` or ``"submit"``: the key of action histograms."""
        if self.kind == "submit":
            return "submit"
        return f"{self.worker}:{self.instruction}" if self.instruction is not None else str(self.worker)

    @classmethod
    def from_dict(cls, data: Any, path: str = "") -> Action:
        return _build(cls, _kwargs(cls, data, path), path)


@dataclass(frozen=True)
class Message(_Record):
    """What the chosen worker said, with what phase 2 needs: sampled token ids and their
    behaviour log-probs (equal lengths), the model id and prompt version that produced them.

    ``token_ids`` is empty when the backend returned token *strings* only (an OpenAI-compatible server such as
    llama.cpp's Python server): ``logprobs`` then holds the per-token log-probs in order, and such a message
    cannot be trained on by phase 2 (which needs the ids; text is never re-tokenised to fake them)."""

    worker: str
    instruction: str | None
    text: str
    token_ids: list[int]
    logprobs: list[float]
    model_id: str
    prompt_version: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    cached: bool
    verdict: str | None = None

    def __post_init__(self) -> None:
        _str(self.worker, "worker", nonempty=True)
        _opt_str(self.instruction, "instruction")
        _str(self.text, "text")
        _set(self, "token_ids", _int_list(self.token_ids, "token_ids"))
        _set(self, "logprobs", _float_list(self.logprobs, "logprobs", finite=False))
        if self.token_ids and len(self.token_ids) != len(self.logprobs):
            raise SchemaError(
                "logprobs", f"length {len(self.logprobs)} differs from len(token_ids) = {len(self.token_ids)}"
            )
        _str(self.model_id, "model_id")
        _str(self.prompt_version, "prompt_version")
        _str(self.finish_reason, "finish_reason")
        _set(self, "prompt_tokens", _int(self.prompt_tokens, "prompt_tokens", minimum=0))
        _set(self, "completion_tokens", _int(self.completion_tokens, "completion_tokens", minimum=0))
        _set(self, "cached", _bool(self.cached, "cached"))
        if self.verdict is not None and self.verdict not in VERDICTS:
            raise SchemaError("verdict", f"expected one of {list(VERDICTS)} or None, got {self.verdict!r}")

    @classmethod
    def from_dict(cls, data: Any, path: str = "") -> Message:
        return _build(cls, _kwargs(cls, data, path), path)


@dataclass(frozen=True)
class Reward(_Record):
    """The named reward vector (success, turn_cost, ...) and its weighted scalar, both logged so
    a different weighting can be replayed offline."""

    named: dict[str, float]
    scalar: float

    def __post_init__(self) -> None:
        _set(self, "named", _str_dict(self.named, "named", _float))
        _set(self, "scalar", _float(self.scalar, "scalar"))

    @classmethod
    def from_dict(cls, data: Any, path: str = "") -> Reward:
        return _build(cls, _kwargs(cls, data, path), path)


@dataclass(frozen=True)
class Step(_Record):
    """One conductor turn. ``state`` is the raw structured state (JSON) so datasets can be
    re-encoded later; ``observation`` is the vector the conductor actually saw."""

    t: int
    state: dict[str, Any]
    observation: list[float]
    action_mask: list[int]
    action: Action
    message: Message | None
    reward: Reward
    terminated: bool
    truncated: bool

    def __post_init__(self) -> None:
        _set(self, "t", _int(self.t, "t", minimum=0))
        _set(self, "state", _json_object(self.state, "state"))
        _set(self, "observation", _float_list(self.observation, "observation", decimals=6))
        mask = [int(x) if isinstance(x, bool) else x for x in _as_list(self.action_mask, "action_mask")]
        mask = _int_list(mask, "action_mask")
        for i, bit in enumerate(mask):
            if bit not in (0, 1):
                raise SchemaError(f"action_mask[{i}]", f"expected 0 or 1, got {bit}")
        _set(self, "action_mask", mask)
        action = _instance(self.action, "action", Action)
        if action.id >= len(mask):
            raise SchemaError("action.id", f"{action.id} is outside action_mask (length {len(mask)})")
        if mask[action.id] != 1:
            raise SchemaError("action.id", f"action {action.id} ({action.label}) is masked out (action_mask=0)")
        if self.message is not None:
            message = _instance(self.message, "message", Message)
            if action.kind == "worker" and message.worker != action.worker:
                raise SchemaError("message.worker", f"{message.worker!r} differs from action.worker {action.worker!r}")
        _instance(self.reward, "reward", Reward)
        _set(self, "terminated", _bool(self.terminated, "terminated"))
        _set(self, "truncated", _bool(self.truncated, "truncated"))

    @classmethod
    def from_dict(cls, data: Any, path: str = "") -> Step:
        kwargs = _kwargs(cls, data, path)
        kwargs["action"] = Action.from_dict(kwargs["action"], _join(path, "action"))
        if kwargs["message"] is not None:
            kwargs["message"] = Message.from_dict(kwargs["message"], _join(path, "message"))
        kwargs["reward"] = Reward.from_dict(kwargs["reward"], _join(path, "reward"))
        return _build(cls, kwargs, path)


@dataclass(frozen=True)
class EpisodeError(_Record):
    """Why an episode was cut short by a *fault* (not by the task): a backend that failed after its own
    retries, or an exception inside a backend. ``cause`` is a short machine key (``http_503``, ``timeout``,
    ``connection``, ``non_json``, ``malformed_reply``, ``backend_exception``, ...), ``message`` one line,
    ``worker`` the worker whose turn failed, ``attempts`` how many times the whole episode was played."""

    cause: str
    message: str
    worker: str | None = None
    attempts: int = 1

    def __post_init__(self) -> None:
        _str(self.cause, "cause", nonempty=True)
        _str(self.message, "message")
        _opt_str(self.worker, "worker")
        _set(self, "attempts", _int(self.attempts, "attempts", minimum=1))

    @classmethod
    def from_dict(cls, data: Any, path: str = "") -> EpisodeError:
        return _build(cls, _kwargs(cls, data, path), path)


@dataclass(frozen=True)
class Episode(_Record):
    """One episode = one JSONL line. ``return_`` is ``"return"`` in JSON.

    Invariants: step ``t``s are 0..n-1 in order; only the last step may be terminated or
    truncated (they end the episode); ``score`` is the verifier's score in [0, 1];
    ``usage["tokens"]``, when present, maps worker -> int.

    ``error`` is set when a fault (not the task) ended the episode: such an episode is never a success, is
    counted apart from task failures by every summary, and is left out of datasets by default. It is
    written only when set, so the JSON of an ordinary episode has no ``error`` key.
    """

    schema_version: int
    episode_id: str
    run_id: str
    task: TaskRef
    team: TeamRef
    conductor: ConductorRef
    seed: int
    steps: list[Step]
    return_: float
    success: bool
    score: float
    terminated: bool
    truncated: bool
    usage: dict[str, Any] = field(default_factory=dict)
    final_observation: list[float] | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    error: EpisodeError | None = None

    def __post_init__(self) -> None:
        _check_version(self.schema_version)
        _str(self.episode_id, "episode_id", nonempty=True)
        _str(self.run_id, "run_id")
        _instance(self.task, "task", TaskRef)
        _instance(self.team, "team", TeamRef)
        _instance(self.conductor, "conductor", ConductorRef)
        _set(self, "seed", _int(self.seed, "seed"))
        steps = _as_list(self.steps, "steps")
        last = len(steps) - 1
        for i, step in enumerate(steps):
            _instance(step, f"steps[{i}]", Step)
            if step.t != i:
                raise SchemaError(
                    f"steps[{i}].t", f"expected {i} (steps must be numbered 0..n-1 in order), got {step.t}"
                )
            if i < last and (step.terminated or step.truncated):
                flag = "terminated" if step.terminated else "truncated"
                raise SchemaError(
                    f"steps[{i}].{flag}", f"only the last step may be {flag} (this is step {i} of {last + 1})"
                )
        _set(self, "steps", steps)
        _set(self, "return_", _float(self.return_, "return"))
        _set(self, "success", _bool(self.success, "success"))
        score = _float(self.score, "score")
        if not 0.0 <= score <= 1.0:
            raise SchemaError("score", f"expected a score in [0, 1], got {score}")
        _set(self, "score", score)
        _set(self, "terminated", _bool(self.terminated, "terminated"))
        _set(self, "truncated", _bool(self.truncated, "truncated"))
        usage = _json_object(self.usage, "usage")
        if "tokens" in usage:
            _str_dict(usage["tokens"], "usage.tokens", _int)
        if "wall_time_s" in usage:
            _float(usage["wall_time_s"], "usage.wall_time_s")
        _set(self, "usage", usage)
        if self.final_observation is not None:
            _set(self, "final_observation", _float_list(self.final_observation, "final_observation", decimals=6))
        _set(self, "metadata", _json_object(self.metadata, "metadata"))
        if self.error is not None:
            _instance(self.error, "error", EpisodeError)
            if self.success:
                raise SchemaError("success", "an episode ended by a fault (error is set) cannot be a success")

    @property
    def errored(self) -> bool:
        """True when a fault, not the task, ended the episode (see `EpisodeError`)."""
        return self.error is not None

    def to_dict(self) -> dict[str, Any]:
        d = super().to_dict()
        if d.get("error") is None:
            d.pop("error", None)
        for step in d["steps"]:  # as Action.to_dict: no free-text instruction, no keys for it
            for k in ("text", "similarity"):
                if step["action"].get(k) is None:
                    step["action"].pop(k, None)
        return d

    @property
    def worker_turns(self) -> int:
        """Turns the conductor gave to workers (its decisions minus a final submit)."""
        return sum(1 for s in self.steps if s.message is not None)

    @property
    def price(self) -> float:
        """What the team's declared worker prices charged for the episode: minus the ``price`` reward components
        summed (0 for an unpriced team, or one recorded before prices existed)."""
        return -sum(s.reward.named.get("price", 0.0) for s in self.steps)

    @property
    def total_tokens(self) -> int:
        """Tokens spent: ``usage["tokens"]`` summed, else prompt + completion over the messages."""
        tokens = self.usage.get("tokens")
        if isinstance(tokens, dict):
            return sum(int(v) for v in tokens.values())
        return sum(s.message.prompt_tokens + s.message.completion_tokens for s in self.steps if s.message is not None)

    @classmethod
    def from_dict(cls, data: Any, path: str = "") -> Episode:
        """Validate and build an episode from its JSON object; raises `SchemaError` naming the field."""
        if isinstance(data, dict) and "schema_version" in data:
            try:  # the version first: a newer file fails with "unknown schema_version", not "unknown field"
                _check_version(data["schema_version"])
            except SchemaError as err:
                raise err.under(path) from None
        kwargs = _kwargs(cls, data, path)
        kwargs["task"] = TaskRef.from_dict(kwargs["task"], _join(path, "task"))
        kwargs["team"] = TeamRef.from_dict(kwargs["team"], _join(path, "team"))
        kwargs["conductor"] = ConductorRef.from_dict(kwargs["conductor"], _join(path, "conductor"))
        steps_path = _join(path, "steps")
        kwargs["steps"] = [
            Step.from_dict(s, f"{steps_path}[{i}]") for i, s in enumerate(_as_list(kwargs["steps"], steps_path))
        ]
        if kwargs.get("error") is not None:
            kwargs["error"] = EpisodeError.from_dict(kwargs["error"], _join(path, "error"))
        return _build(cls, kwargs, path)


def _check_version(version: Any) -> None:
    version = _int(version, "schema_version")
    if version != SCHEMA_VERSION:
        hint = "written by a newer orchestra; upgrade to read it" if version > SCHEMA_VERSION else "no migration exists"
        raise SchemaError(
            "schema_version", f"unknown schema_version {version} (this reader knows version {SCHEMA_VERSION}; {hint})"
        )
