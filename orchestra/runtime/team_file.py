"""Team files: YAML definitions of a team (workers, role prompts, backends, generation parameters,
instructions, turn budget, reward weights, rule-based conductor settings), validated on load.

Every error names the file and the field (``teams/arithmetic.yaml: workers[1].generation.max_tokens:
expected an integer, got 'many'``). The built-in teams in ``orchestra/teams/`` are such files.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from envs.config import (
    DEFAULT_REWARD_WEIGHTS,
    EMBEDDERS,
    REQUIREMENTS,
    REWARD_COMPONENTS,
    Requirement,
    TeamEnvConfig,
    WorkerSpec,
)
from orchestra.backends.base import GenerationParams

TEAMS_DIR = Path(__file__).parent.parent / "teams"  # orchestra/teams/


class TeamFileError(ValueError):
    """A team file is missing, unreadable or invalid; the message names the file and field."""


@dataclass(frozen=True)
class WorkerRuntime:
    """The LLM/tool side of a worker: which backend serves it and how it samples."""

    name: str
    kind: str  # "llm" or "tool"
    backend: str | None  # key into TeamSpec.backends (LLM workers)
    tool: str | None  # tool name in the task family (tool workers)
    generation: GenerationParams
    # the worker's LoRA adapter on its backend (an http backend sends it as the request's model: vLLM --enable-lora;
    # a transformers backend selects its loaded adapter of that name); None = the base model
    adapter: str | None = None


@dataclass(frozen=True)
class TeamSpec:
    path: Path
    family: str  # default task family
    env: TeamEnvConfig
    backends: Mapping[str, Mapping[str, Any]]
    workers: Mapping[str, WorkerRuntime]
    conductors: Mapping[str, Mapping[str, Any]]  # per rule-based conductor options
    description: str = ""
    raw: Mapping[str, Any] = field(default_factory=dict)  # the file as parsed (written to run dirs)

    @property
    def name(self) -> str:
        return self.env.name


def builtin_teams() -> list[str]:
    return sorted(p.stem for p in TEAMS_DIR.glob("*.yaml"))


def resolve_team_path(team: str | Path) -> Path:
    p = Path(team)
    if p.suffix in (".yaml", ".yml", ".toml") or p.exists():
        if not p.exists():
            raise TeamFileError(f"{p}: team file not found")
        return p
    builtin = TEAMS_DIR / f"{team}.yaml"
    if builtin.exists():
        return builtin
    raise TeamFileError(
        f"unknown team {team!r}: not a file and not a built-in team (built-in: {', '.join(builtin_teams())})"
    )


class _Fields:
    """Typed reads from a mapping that name the file and field path on error."""

    def __init__(self, where: str, data: Any, path: str) -> None:
        if not isinstance(data, Mapping):
            raise TeamFileError(f"{where}: {path or 'top level'}: expected a mapping, got {type(data).__name__}")
        self.where, self.data, self.path = where, data, path
        self._seen: set[str] = set()

    def _name(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def err(self, key: str, msg: str) -> TeamFileError:
        return TeamFileError(f"{self.where}: {self._name(key)}: {msg}")

    def get(
        self,
        key: str,
        typ: type | tuple[type, ...],
        default: Any = ...,
    ) -> Any:
        self._seen.add(key)
        if key not in self.data:
            if default is ...:
                raise self.err(key, "required field is missing")
            return default
        v = self.data[key]
        if typ is float and isinstance(v, int) and not isinstance(v, bool):
            v = float(v)
        if isinstance(v, bool) and typ in (int, float):
            raise self.err(key, f"expected {typ.__name__}, got a boolean")
        if not isinstance(v, typ):
            names = typ.__name__ if isinstance(typ, type) else " or ".join(t.__name__ for t in typ)
            raise self.err(key, f"expected {names}, got {type(v).__name__} {v!r}")
        if isinstance(v, float) and not math.isfinite(v):
            raise self.err(key, f"expected a finite number, got {v!r}")
        return v

    def sub(self, key: str, default: Any = ...) -> _Fields:
        return _Fields(self.where, self.get(key, dict, default), self._name(key))

    def check_unknown(self) -> None:
        extra = sorted(set(self.data) - self._seen)
        if extra:
            raise self.err(extra[0], f"unknown field (known here: {', '.join(sorted(self._seen))})")


def _examples(w: _Fields) -> tuple[tuple[str, str], ...]:
    """``examples``: a list of ``{task, reply}`` demonstrations (LLM workers)."""
    out = []
    for j, ex in enumerate(w.get("examples", list, [])):
        e = _Fields(w.where, ex, w._name(f"examples[{j}]"))
        out.append((e.get("task", str), e.get("reply", str)))
        e.check_unknown()
    return tuple(out)


def _price(w: _Fields) -> tuple[float, float]:
    """``price: {per_call, per_token}`` (both default 0; TeamEnvConfig checks them)."""
    p = w.sub("price", {})
    per_call, per_token = p.get("per_call", float, 0.0), p.get("per_token", float, 0.0)
    p.check_unknown()
    return per_call, per_token


def _verdicts(w: _Fields) -> list[str]:
    vs = w.get("answer_verdicts", list, ["pass"])
    for v in vs:
        if v not in ("pass", "fail", "n/a"):
            raise w.err("answer_verdicts", f"expected a list of pass, fail, n/a; got {v!r}")
    return [str(v) for v in vs]


def _requires(w: _Fields) -> tuple[tuple[str, Requirement], ...]:
    f = w.sub("requires", {})
    out: list[tuple[str, Requirement]] = []
    for ins in f.data:
        req = f.get(ins, str)
        if req not in REQUIREMENTS:
            raise f.err(ins, f"expected one of {', '.join(REQUIREMENTS)}, got {req!r}")
        out.append((str(ins), req))
    return tuple(out)


# the most new tokens a turn may ask for: the embedded SmolLM2's trained context (a backend that declares a smaller
# ``n_ctx`` bounds its workers by that instead)
MAX_CONTEXT_TOKENS = 8192


def _generation(f: _Fields, context: int = MAX_CONTEXT_TOKENS) -> GenerationParams:
    d = GenerationParams()
    stop = f.get("stop", list, list(d.stop))
    if not all(isinstance(s, str) for s in stop):
        raise f.err("stop", "expected a list of strings")
    params = GenerationParams(
        max_tokens=f.get("max_tokens", int, d.max_tokens),
        temperature=f.get("temperature", float, d.temperature),
        top_p=f.get("top_p", float, d.top_p),
        stop=tuple(stop),
        seed=f.get("seed", int, d.seed),
    )
    f.check_unknown()
    if not 1 <= params.max_tokens <= context:
        raise f.err(
            "max_tokens", f"must be between 1 and the model's context ({context} tokens), got {params.max_tokens}"
        )
    if params.temperature < 0:
        raise f.err("temperature", "must be >= 0")
    if not 0 < params.top_p <= 1:
        raise f.err("top_p", f"must be in (0, 1], got {params.top_p}")
    return params


def _family_tools(top: _Fields, family: str) -> set[str] | None:
    """The tool names of a registered family (None for a user's data file, whose tools depend on its records)."""
    from envs.tasks.registry import FAMILIES, get_family
    from envs.tasks.user_data import is_user_data

    if family in FAMILIES:
        return set(get_family(family).tools())
    if is_user_data(family):
        return None
    raise top.err("family", f"unknown task family {family!r} (known: {', '.join(sorted(FAMILIES))}, or a data file)")


def load_team(team: str | Path, *, overrides: Mapping[str, Any] | None = None) -> TeamSpec:
    """Load and validate a team file (a path, or the name of a built-in team)."""
    path = resolve_team_path(team)
    where = str(path)
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f" line {mark.line + 1}" if mark is not None else ""
        raise TeamFileError(f"{where}:{line}: not valid YAML: {e}") from e
    if overrides:
        raw = {**raw, **overrides}
    top = _Fields(where, raw, "")
    name = top.get("name", str)
    description = top.get("description", str, "")
    family = top.get("family", str)
    family_tools = _family_tools(top, family)
    backends_f = top.sub("backends", {})
    backends: dict[str, Mapping[str, Any]] = {}
    for bname in backends_f.data:
        b = backends_f.sub(bname)
        b.get("type", str)
        backends[bname] = dict(b.data)
        backends_f._seen.add(bname)
    ins_f = top.sub("instructions")
    instructions = {k: ins_f.get(k, str) for k in ins_f.data}
    workers_raw = top.get("workers", list)
    specs: list[WorkerSpec] = []
    runtimes: dict[str, WorkerRuntime] = {}
    for i, wraw in enumerate(workers_raw):
        w = _Fields(where, wraw, f"workers[{i}]")
        wname = w.get("name", str)
        kind = w.get("kind", str, "llm")
        if kind not in ("llm", "tool"):
            raise w.err("kind", f"expected 'llm' or 'tool', got {kind!r}")
        sees = w.get("sees", (str, list), "all")
        if isinstance(sees, str) and sees not in ("all", "own", "last", "task"):
            raise w.err("sees", f"expected all, own, last, task or a list of worker names, got {sees!r}")
        ins = w.get("instructions", list)
        backend = w.get("backend", str, None)
        tool = w.get("tool", str, None)
        adapter = w.get("adapter", str, None)
        if adapter is not None and kind != "llm":
            raise w.err("adapter", "only an llm worker has a LoRA adapter")
        if kind == "llm":
            if backend is None:
                raise w.err("backend", "an llm worker needs a backend (a key of the backends section)")
            if backend not in backends:
                raise w.err("backend", f"unknown backend {backend!r} (declared: {sorted(backends)})")
        elif tool is None:
            raise w.err("tool", "a tool worker needs the tool's name")
        elif family_tools is not None and tool not in family_tools:
            raise w.err(
                "tool", f"family {family!r} has no tool {tool!r} (its tools: {', '.join(sorted(family_tools))})"
            )
        n_ctx = backends.get(backend or "", {}).get("n_ctx", MAX_CONTEXT_TOKENS)
        gen = _generation(w.sub("generation", {}), int(n_ctx) if isinstance(n_ctx, int) else MAX_CONTEXT_TOKENS)
        examples = _examples(w)
        per_call, per_token = _price(w)
        specs.append(
            WorkerSpec(
                name=wname,
                kind=kind,
                instructions=tuple(str(x) for x in ins),
                sees=sees if isinstance(sees, str) else tuple(sees),  # type: ignore[arg-type]
                proposes_answer=w.get("proposes_answer", bool, kind == "llm"),
                answer_verdicts=tuple(_verdicts(w)),
                requires=_requires(w),
                role_prompt=w.get("role_prompt", str, ""),
                prompt_version=w.get("prompt_version", str, "v1"),
                examples=examples,
                price_per_call=per_call,
                price_per_token=per_token,
            )
        )
        runtimes[wname] = WorkerRuntime(wname, kind, backend, tool, gen, adapter)
        w.check_unknown()
    rw_f = top.sub("reward_weights", {})
    weights = dict(DEFAULT_REWARD_WEIGHTS)
    for k in rw_f.data:
        if k not in REWARD_COMPONENTS:
            raise rw_f.err(k, f"unknown reward component (known: {', '.join(REWARD_COMPONENTS)})")
        weights[k] = rw_f.get(k, float)
        if weights[k] < 0:
            raise rw_f.err(k, f"must be >= 0 (success is a reward, the rest are costs), got {weights[k]}")
    conductors_f = top.sub("conductors", {})
    conductors = {k: dict(conductors_f.sub(k).data) for k in conductors_f.data}
    try:
        env = TeamEnvConfig(
            name=name,
            workers=tuple(specs),
            instructions=instructions,
            max_turns=top.get("max_turns", int, 6),
            reward_weights=weights,
            embedder=top.get("embedder", str, "minilm"),
            recent_messages=top.get("recent_messages", int, 1),
            max_message_chars=top.get("max_message_chars", int, 2000),
            give_up=top.get("give_up", bool, False),
        )
    except ValueError as e:
        raise TeamFileError(f"{where}: {e}") from e
    if env.embedder not in EMBEDDERS:
        raise top.err("embedder", f"expected one of {', '.join(EMBEDDERS)}, got {env.embedder!r}")
    top.check_unknown()
    return TeamSpec(
        path=path,
        family=family,
        env=env,
        backends=backends,
        workers=runtimes,
        conductors=conductors,
        description=description,
        raw=raw,
    )
