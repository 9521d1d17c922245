"""Conductor policies: the contract every conductor keeps (``base``: :class:`ConductorPolicy`, a masked discrete
choice of the next worker and instruction), the conductors that need no training (``conductors``: rule-based, human,
ε-exploration) and the learning of a conductor from data (``learning``: datasets, d3rlpy, MaskablePPO, distillation,
checkpoints). The rule-based ones and the human are named here for short."""

from policies.base import ConductorPolicy, PolicyError, first_legal
from policies.conductors.human import HumanConductor, QuitSession
from policies.conductors.rule_based import (
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
