"""Conductor policies: rule-based schedulers now; learned conductors (d3rlpy, SB3) build on the same contract."""

from policies.base import ConductorPolicy, PolicyError, first_legal
from policies.human import HumanConductor, QuitSession
from policies.rule_based import (
    HeuristicConductor,
    HeuristicRules,
    PipelineConductor,
    RandomConductor,
    RoundRobinConductor,
    parse_label,
)

RULE_BASED = ("round_robin", "random", "pipeline", "heuristic")

__all__ = [
    "RULE_BASED",
    "ConductorPolicy",
    "HeuristicConductor",
    "HeuristicRules",
    "HumanConductor",
    "PipelineConductor",
    "PolicyError",
    "QuitSession",
    "RandomConductor",
    "RoundRobinConductor",
    "first_legal",
    "parse_label",
]
