"""The freshness experiment's config: which chains, which step sizes and how many replicate pairs, composed with the
chain experiment's team and trainer (one source of each: :func:`~orchestra.experiments.chain.config.chain_config`,
:data:`~orchestra.teamtr.config.CHAIN_TRAINER`)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from orchestra.experiments.chain.config import ChainExperimentConfig, chain_config
from orchestra.teamtr.chain import ChainConfig
from orchestra.teamtr.config import CHAIN_TRAINER, TeamTRConfig, derive_seed
from trajectories.rundir import config_json


@dataclass(frozen=True)
class StepSize:
    """How far one update may move an agent: the learning rate, the trust-region budget and the epochs over its batch
    (every other knob is the experiment's ``trainer``)."""

    name: str  # the setting's name in the tables
    lr: float  # learning rate (Adam)
    delta: float  # per-token KL budget δ of the backtracking trust region
    num_epochs: int  # optimizer steps over the update's batch (one minibatch per epoch)


# The two step sizes, fixed before any outcome was computed (docs/results/freshness.md, "Settings"):
# * default: the chain experiment's trainer (CHAIN_TRAINER), the regime its tables are about;
# * large: δ 10× the default. Worker k's context shift is bounded by the upstream steps' own KL (chain rule:
#   KL(d_k^before ‖ d_k^after) ≤ Σ_{j<k} E_{d_j} KL(π_j^before ‖ π_j^after) ≤ Σ_j δ_j), so a stale gap of order 0.1
#   needs δ ≥ 0.1; lr ×10 and 4 epochs let the step reach that budget instead of stopping short of it.
DEFAULT_STEP = StepSize("default", CHAIN_TRAINER.lr, CHAIN_TRAINER.deltas(1)[0], CHAIN_TRAINER.num_epochs)
LARGE_STEP = StepSize("large", 10 * CHAIN_TRAINER.lr, 10 * CHAIN_TRAINER.deltas(1)[0], 4)


def _chain_team() -> ChainConfig:
    # the chain experiment's team (V, LoRA on lm_head, warm-start pass 0.85); n and seed are set per pair
    return chain_config(ChainExperimentConfig(), n=2, seed=0)


@dataclass(frozen=True)
class FreshnessConfig:
    """Every knob of the chain freshness experiment. A replicate pair (n, pair) is one warm-started chain of n agents
    (its own init seed); the upstream workers 0..n−2 are updated in order on one stale batch (scheme naive), then
    the last worker n−1 is updated from that state once per arm (:mod:`~orchestra.experiments.freshness.run`)."""

    ns: tuple[int, ...] = (2, 4, 8)  # chain lengths n (the last worker follows n − 1 upstream updates)
    pairs: int = 30  # replicate pairs per (step size, n); each pair has its own team init and batches
    steps: tuple[StepSize, ...] = (DEFAULT_STEP, LARGE_STEP)  # step sizes (every pair runs each from one warm start)
    team: ChainConfig = field(default_factory=_chain_team)  # the chain (n_agents and seed are set per pair)
    trainer: TeamTRConfig = field(default_factory=lambda: CHAIN_TRAINER)  # batch, advantages, trust region
    seed: int = 0  # root seed; team, batch and null seeds derive from (seed, n, pair)

    def __post_init__(self) -> None:
        if not self.ns or any(n < 2 for n in self.ns):
            raise ValueError(f"ns must be non-empty, each ≥ 2 (an upstream worker and the last one), got {self.ns}")
        if self.pairs < 2:
            raise ValueError(f"pairs must be ≥ 2 (a CI over replicates), got {self.pairs}")
        names = [s.name for s in self.steps]
        if not names or len(set(names)) != len(names):
            raise ValueError(f"steps need distinct names, got {names}")

    @classmethod
    def smoke(cls, **overrides: Any) -> FreshnessConfig:
        """A tiny preset for tests: n ∈ {2, 3}, 3 pairs, V = 4, B = 32."""
        base = cls(
            ns=(2, 3),
            pairs=3,
            team=replace(_chain_team(), vocab_size=4, lora_r=4),
            trainer=replace(CHAIN_TRAINER, batch_size=32),
        )
        return replace(base, **overrides)

    def to_json(self) -> dict[str, Any]:
        """The config as plain JSON types, as written to ``config.json``."""
        return config_json(self)


def team_config(cfg: FreshnessConfig, n: int, pair: int) -> ChainConfig:
    """The chain of pair (n, pair): its own init seed, shared by every step size."""
    return replace(cfg.team, n_agents=n, seed=derive_seed(cfg.seed, n, pair, 0, bits=31))


def branch_trainer(trainer: TeamTRConfig, seed: int) -> TeamTRConfig:
    """The trainer a freshness pair branches from, on the chain and on the LLM team alike: naive (one stale batch for
    the stage), the fixed order 0..n−1, one stage, no per-stage evaluation (the arms are scored by the experiment),
    seeded by ``seed``; every other knob is ``trainer``'s."""
    return replace(
        trainer,
        scheme="naive",
        order="fixed",
        fixed_order=(),
        num_stages=1,
        evaluate=False,
        stale_gap_batch=0,
        seed=seed,
    )


def trainer_config(cfg: FreshnessConfig, n: int, pair: int, step: StepSize) -> TeamTRConfig:
    """The trainer of pair (n, pair) at ``step``: naive (one stale batch for the stage), fixed order 0..n−1, one
    stage, no per-stage evaluation (the arms are scored exactly by the experiment); its seed depends on (n, pair)
    only, so both step sizes draw the same stale batch."""
    return replace(
        branch_trainer(cfg.trainer, derive_seed(cfg.seed, n, pair, 1, bits=31)),
        lr=step.lr,
        delta=step.delta,
        num_epochs=step.num_epochs,
        num_minibatches=1,
    )


__all__ = [
    "DEFAULT_STEP",
    "LARGE_STEP",
    "FreshnessConfig",
    "StepSize",
    "branch_trainer",
    "team_config",
    "trainer_config",
]
