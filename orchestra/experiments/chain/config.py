"""The telephone-chain experiment's config: which chains, schemes and seeds, composed with the ``TeamTRConfig`` every
run trains with (one source of the trainer's settings: :data:`~orchestra.teamtr.config.CHAIN_TRAINER`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from orchestra.experiments.harness import episode_stage
from orchestra.teamtr.chain import ChainConfig, pass_for_success
from orchestra.teamtr.config import CHAIN_TRAINER, SCHEMES, Scheme, TeamTRConfig, derive_seed
from trajectories.rundir import ABSENT, config_differences, config_json

# controls that are not trainer schemes: naive with n × the batch (equal episodes per stage, every one stale)
CHAIN_VARIANTS: tuple[str, ...] = ("naive_bigB",)


@dataclass(frozen=True)
class ChainExperimentConfig:
    """Every knob of the telephone-chain experiment (defaults: the study's main setting, scaled to LoRA LMs).

    ``trainer`` is the config of every run; per run the experiment sets its ``scheme``, its ``num_stages``
    (:meth:`stages_for`) and its ``seed`` (derived from ``seed``, n and the run's seed), and reads the equal-stages
    accounting at ``trainer.num_stages``."""

    ns: tuple[int, ...] = (2, 3, 4, 6, 8)  # chain lengths n
    schemes: tuple[str, ...] = ("teamtr", "naive", "joint", "happo")  # trainer schemes or CHAIN_VARIANTS compared
    seeds: int = 8  # seeds per (n, scheme); seed s gives the same init for every scheme (paired)
    trainer: TeamTRConfig = field(default_factory=lambda: CHAIN_TRAINER)  # the trainer of every run (see above)
    extend_for_episodes: bool = True  # non-teamtr schemes run n × the stages (equal-episodes accounting)
    vocab_size: int = 8  # V message symbols (= keys)
    lora_r: int = 8  # LoRA rank (≥ V − 1: lm_head alone can express any V×V policy)
    lora_targets: tuple[str, ...] = ("lm_head",)  # LoRA target modules (lm_head only: fast and expressive enough)
    warm_pass: float = 0.85  # warm-start per-hop pass probability (the reliable-agent regime of the study)
    # warm-start team success J0, the same at every n: each n's per-hop pass is the one giving this J0
    # (teamtr.chain.pass_for_success), so chains of every length start equally far from the optimum; None = warm_pass
    warm_success: float | None = None
    drift_stages: int = 5  # drift per run = mean over its first this-many stages
    seed: int = 0  # root seed; team and trainer seeds derive from (seed, n, run seed)

    def __post_init__(self) -> None:
        if not self.ns or any(n < 1 for n in self.ns):
            raise ValueError(f"ns must be non-empty, each ≥ 1, got {self.ns}")
        bad = [s for s in self.schemes if s not in (*SCHEMES, *CHAIN_VARIANTS)]
        if not self.schemes or bad:
            raise ValueError(f"unknown schemes {bad}; expected some of {(*SCHEMES, *CHAIN_VARIANTS)}")
        if self.seeds < 1 or self.num_stages < 1 or self.drift_stages < 1:
            raise ValueError("need seeds ≥ 1, num_stages ≥ 1 and drift_stages ≥ 1")
        if self.warm_success is not None:
            for n in self.ns:
                pass_for_success(self.warm_success, n, self.vocab_size)  # raises for a J0 outside (1/V, 1)

    def warm_pass_for(self, n: int) -> float:
        """The warm-start per-hop pass probability of the chains of length n: ``warm_pass``, or the one that gives
        team success ``warm_success`` at n."""
        return self.warm_pass if self.warm_success is None else pass_for_success(self.warm_success, n, self.vocab_size)

    @property
    def num_stages(self) -> int:
        """Stages of the equal-stages accounting (every agent updated once per stage): ``trainer.num_stages``."""
        return self.trainer.num_stages

    @property
    def batch_size(self) -> int:
        """Episodes per sampled batch (teamtr samples n per stage, the others 1): ``trainer.batch_size``."""
        return self.trainer.batch_size

    @classmethod
    def smoke(cls, **overrides: Any) -> ChainExperimentConfig:
        """A tiny preset for tests and the demo: n ∈ {2, 3}, teamtr vs naive, 1 seed, 2 stages, V = 4, B = 32."""
        trainer = replace(CHAIN_TRAINER, num_stages=2, batch_size=32, num_epochs=1)
        base = cls(
            ns=(2, 3), schemes=("teamtr", "naive"), seeds=1, trainer=trainer, vocab_size=4, lora_r=4, drift_stages=2
        )
        return replace(base, **overrides)

    @classmethod
    def demo(cls, **overrides: Any) -> ChainExperimentConfig:
        """``orchestra demo``'s phase 2: n ∈ {2, 4}, all four schemes, 2 seeds, 6 stages (about a minute on 2 cores)."""
        return replace(
            cls(ns=(2, 4), seeds=2, trainer=replace(CHAIN_TRAINER, num_stages=6), drift_stages=3), **overrides
        )

    def stages_for(self, scheme: str, n: int) -> int:
        """Stages a (scheme, n) run trains for: where it has sampled teamtr's episodes at ``num_stages``
        (:func:`~orchestra.experiments.harness.episode_stage`)."""
        return episode_stage(scheme, n, self.num_stages, self.extend_for_episodes)

    def to_json(self) -> dict[str, Any]:
        """The config as plain JSON types (tuples → lists), as written to ``config.json``."""
        return config_json(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ChainExperimentConfig:
        """The config a ``config.json`` was written from (:meth:`to_json` inverted: lists → tuples). A field the file
        lacks (written before that knob existed) takes its default.

        Raises:
            ValueError: ``data`` is not the JSON of a config of this version (an unknown field, a value that does not
                read back to itself).
        """

        def fields(d: Mapping[str, Any]) -> dict[str, Any]:
            return {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}

        try:
            cfg = cls(**{**fields(data), "trainer": TeamTRConfig(**fields(data["trainer"]))})
        except (KeyError, TypeError) as e:
            raise ValueError(f"not a chain experiment config: {e}") from e
        if [d for d in config_differences(data, cfg) if d.saved != ABSENT]:  # a field the file lacks: its default
            raise ValueError("the chain experiment config does not read back to the JSON it came from")
        return cfg


def chain_config(cfg: ChainExperimentConfig, n: int, seed: int) -> ChainConfig:
    """The chain of run (n, seed): the same for every scheme (paired comparisons)."""
    return ChainConfig(
        n_agents=n,
        vocab_size=cfg.vocab_size,
        lora_r=cfg.lora_r,
        lora_targets=cfg.lora_targets,
        warm_pass=cfg.warm_pass_for(n),
        seed=derive_seed(cfg.seed, n, seed, 0, bits=31),
    )


def trainer_config(cfg: ChainExperimentConfig, n: int, seed: int, scheme: str) -> TeamTRConfig:
    """The trainer config of run (n, scheme, seed): ``cfg.trainer`` with this run's scheme, stages and seed (the seed
    depends on (n, seed) only, so every scheme of a (n, seed) pair shares it). ``naive_bigB`` is naive with n × the
    batch (teamtr's episodes per stage, all of them stale)."""
    trainer_scheme: Scheme = "naive" if scheme == "naive_bigB" else scheme  # type: ignore[assignment]
    batch = cfg.trainer.batch_size * (n if scheme == "naive_bigB" else 1)
    return replace(
        cfg.trainer,
        scheme=trainer_scheme,
        batch_size=batch,
        num_stages=cfg.stages_for(scheme, n),
        seed=derive_seed(cfg.seed, n, seed, 1, bits=31),
    )


__all__ = ["CHAIN_VARIANTS", "ChainExperimentConfig", "chain_config", "trainer_config"]
