"""The one registry of conductor names for the CLI: rule-based ones from ``policies``, the LLM
speaker-selector (which needs a backend, so it lives here), and learned conductors given as
``LABEL:CHECKPOINT`` (a folder written by ``orchestra train`` or ``orchestra finetune-conductor``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from orchestra.backends import make_backend
from orchestra.backends.base import Backend, GenerationParams
from orchestra.runtime.llm_conductor import LLMConductor
from orchestra.runtime.team_file import TeamSpec
from policies import (
    ConductorPolicy,
    HeuristicConductor,
    HeuristicRules,
    HumanConductor,
    PipelineConductor,
    PolicyError,
    RandomConductor,
    RoundRobinConductor,
)

# llm_instruct: the LLM speaker-selector that may also write its own instruction (``solver: <text>``)
CONDUCTOR_NAMES = ("round_robin", "random", "pipeline", "heuristic", "human", "llm", "llm_instruct")
RULE_TYPES = ("round_robin", "pipeline", "heuristic")  # the deterministic rules a team file may name


def conductor_type(team: TeamSpec, name: str) -> str:
    """The kind of conductor ``name`` is in ``team``: a built-in name is its own type; a rule the team file
    names (``conductors: {solve_only: {type: pipeline, steps: [...]}}``) has the ``type`` it declares."""
    opts = team.conductors.get(name, {})
    kind = str(opts.get("type", name))
    if name not in CONDUCTOR_NAMES and name not in team.conductors:
        raise PolicyError(
            f"unknown conductor {name!r} (known: {', '.join(CONDUCTOR_NAMES)}; rules of {team.path.name}: "
            f"{', '.join(n for n in team.conductors if n not in CONDUCTOR_NAMES) or 'none'})"
        )
    if name not in CONDUCTOR_NAMES and kind not in RULE_TYPES:
        raise PolicyError(
            f"{team.path}: conductors.{name}.type: give one of {', '.join(RULE_TYPES)} for a named rule, got {kind!r}"
        )
    return kind


def team_rules(team: TeamSpec) -> list[str]:
    """The deterministic rules of a team: the built-in ones it configures and every named rule, in file
    order. This is the menu of fixed schedules the phase-1 protocol chooses from and routes over."""
    out = []
    for name in team.conductors:
        if name in CONDUCTOR_NAMES and name not in RULE_TYPES:
            continue
        conductor_type(team, name)
        out.append(name)
    return out


def split_spec(spec: str) -> tuple[str, str | None]:
    """``"cql:runs/x/cql"`` → ("cql", "runs/x/cql"); ``"heuristic"`` → ("heuristic", None)."""
    label, sep, checkpoint = spec.partition(":")
    label = label.strip()
    if not label:
        raise PolicyError(f"conductor {spec!r}: give a name before ':' (NAME[:CHECKPOINT])")
    if sep and not checkpoint.strip():
        raise PolicyError(f"conductor {spec!r}: give a checkpoint folder after ':'")
    return label, (checkpoint.strip() if sep else None)


def _options(team: TeamSpec, name: str) -> dict[str, Any]:
    return dict(team.conductors.get(name, {}))


def conductor_factory(
    name: str, team: TeamSpec, seed: int = 0, backends: dict[str, Backend] | None = None
) -> Callable[[], ConductorPolicy]:
    """A zero-argument constructor of fresh conductor instances (one per env slot and episode).

    ``name`` is a registered name or ``LABEL:CHECKPOINT`` for a learned conductor."""
    cfg = team.env
    label, checkpoint = split_spec(name)
    if checkpoint is not None:
        from envs.observation import ObservationEncoder
        from policies.learning.learned import load_conductor

        learned = load_conductor(checkpoint, cfg, ObservationEncoder(cfg), name=label)
        return lambda: learned  # learned conductors are stateless between decisions
    kind = conductor_type(team, name)
    opts = _options(team, name)
    opts.pop("type", None)
    where = f"{team.path}: conductors.{name}"
    try:
        if kind == "round_robin":
            rounds = int(opts.get("rounds", 1))
            RoundRobinConductor(cfg, rounds)  # validate now, not on the first episode
            return lambda: RoundRobinConductor(cfg, rounds)
        if kind == "random":
            return lambda: RandomConductor(cfg, seed)
        if kind == "pipeline":
            steps = opts.get("steps")
            if not steps:
                raise PolicyError(f"{where}.steps: the team file defines no pipeline (a list of 'worker:instruction')")
            PipelineConductor(cfg, steps)
            return lambda: PipelineConductor(cfg, steps)
        if kind == "heuristic":
            if "start" not in opts:
                raise PolicyError(f"{where}.start: the team file defines no heuristic rules")
            rules = HeuristicRules(**opts)
            HeuristicConductor(cfg, rules)
            return lambda: HeuristicConductor(cfg, rules)
        if kind == "human":
            person = HumanConductor(cfg)  # one expert for the whole session: the tally spans its episodes
            return lambda: person
        if kind in ("llm", "llm_instruct"):
            writes = kind == "llm_instruct"
            # llm_instruct takes the llm conductor's settings (conductors.llm in the team file) unless it has its own
            if writes and not opts:
                opts = _options(team, "llm")
                opts.pop("type", None)
                where = f"{team.path}: conductors.llm"
            key = opts.get("backend")
            if key is None:
                raise PolicyError(f"{where}.backend: name the backend the LLM conductor uses")
            if key not in team.backends:
                raise PolicyError(f"{where}.backend: unknown backend {key!r} (declared: {sorted(team.backends)})")
            backend = (backends or {}).get(key) or make_backend(dict(team.backends[key]))
            default_tokens = 40 if writes else 12  # a written instruction needs room
            params = GenerationParams(
                max_tokens=int(opts.get("max_tokens", default_tokens)), temperature=0.0, stop=("\n",)
            )
            # stateless between episodes; share the counters
            shared = LLMConductor(cfg, backend, params, write_instructions=writes)
            return lambda: shared
    except TypeError as e:
        raise PolicyError(f"{where}: {e}") from e
    raise PolicyError(f"unknown conductor {name!r} (known: {', '.join(CONDUCTOR_NAMES)})")
