"""Running the telephone-chain experiment (docs/architecture.md §5; the study: docs/telephone-chain.md): every
(n, scheme, seed) run, its rows in ``runs.csv``, resume, then the tables and plots.

For every (n, scheme, seed) the chain team is built from a seed derived from (cfg.seed, n, seed) only, warm started
once per (n, seed) and reset to that warm state for every scheme, so comparisons between schemes are PAIRED (same
init, same trainer seed). Training hooks snapshot the exact policy matrices before and after every update, so the
drift definitions (b) and (d) of :mod:`orchestra.teamtr.chain` are computed exactly per stage.

Joint schemes (``joint``, ``joint_indep``) make ONE update per stage that moves every agent at once. For the drift
functions it is written as n virtual sequential updates in the stage's order: virtual update m changes agent
order[m]; snapshot m has agents order[:m] at their post-update matrices and the others at the stage start (exact,
since an agent's matrix depends only on its own adapter); every batch is the stage-start one (``"stale"``).
Train index: ``"fresh"`` for teamtr, ``"stale"`` for every other scheme.

Outputs of :func:`run_chain_experiment` (``out_dir``): ``config.json``, ``runs.csv`` (one row per (n, scheme, seed, stage),
stage 0 = the warm-started team, drift empty there), ``final.csv``, ``regressions.csv``, ``drift.csv``,
``alpha.csv``, ``trust.csv``, ``checks.csv`` (:mod:`~orchestra.experiments.chain.analysis`), ``learning_curves.png``,
``drift.png`` and ``summary.md`` (every table, :mod:`~orchestra.experiments.chain.report`). Completed runs found in an
existing ``runs.csv`` with the same ``config.json`` are skipped (resume per run: :class:`~orchestra.experiments.harness.RowLog`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from orchestra.experiments.chain.analysis import analyse, run_curves
from orchestra.experiments.chain.config import ChainExperimentConfig, chain_config, trainer_config
from orchestra.experiments.chain.report import plot, summary_sections
from orchestra.experiments.harness import (
    ExperimentResult,
    RowLog,
    Say,
    finish,
    maybe_float,
    open_run_dir,
    stderr_say,
)
from orchestra.teamtr.chain import ChainTeam, Matrix, drift_b, drift_d, policy_matrices, stale_gap_terms, warm_start
from orchestra.teamtr.chain_team import ChainTrainable
from orchestra.teamtr.trainer import TrainHooks, train
from trajectories.rundir import MetricsWriter

# the columns of runs.csv and how each is read back (a NaN is written empty)
RUN_COLUMNS: dict[str, Callable[[str], Any]] = dict(
    n=int,
    scheme=str,
    seed=int,
    stage=int,
    J=float,
    drift_b=maybe_float,
    drift_d=maybe_float,
    episodes=int,
    tokens=int,
    agent_updates=int,
    steps=maybe_float,
    accepted=int,
    bound=int,
    kl_over=int,
    kl_max_ratio=maybe_float,
    stale_gap=maybe_float,
    certificate=maybe_float,
)
RUN_FIELDS = tuple(RUN_COLUMNS)
# columns added after runs were committed (docs/results/chain_hard/): an older runs.csv reads them as NaN
RUN_OPTIONAL = ("steps",)

# ----------------------------------------------------------------------------------------------------------------
# one run


class _Snapshots:
    """Training hooks that record the exact matrices around every update; drift (b) / (d) per stage."""

    def __init__(self, team: ChainTeam) -> None:
        self.team = team
        self.snaps: dict[int, list[list[Matrix]]] = {}
        self.orders: dict[int, list[int]] = {}

    def before(self, stage: int, agents: tuple[int, ...], batch: object) -> None:
        if stage not in self.snaps:
            self.snaps[stage] = [policy_matrices(self.team)]
            self.orders[stage] = []

    def after(self, stage: int, agents: tuple[int, ...], batch: object) -> None:
        new = policy_matrices(self.team)
        start = self.snaps[stage][-1]
        for k, agent in enumerate(agents, start=1):  # a joint update = len(agents) virtual sequential updates
            moved = set(agents[:k])
            self.snaps[stage].append([new[i] if i in moved else start[i] for i in range(len(new))])
            self.orders[stage].append(agent)

    def drifts(self, stage: int, train_index: str) -> tuple[float, float, float]:
        """Drift (b), (d) and the mean exact stale gap of the stage's updates."""
        snaps, order = self.snaps[stage], self.orders[stage]
        ti: Any = train_index
        return drift_b(snaps, order, ti), drift_d(snaps, order, ti), float(stale_gap_terms(snaps, order, ti).mean())


def run_one(
    cfg: ChainExperimentConfig,
    team: ChainTeam,
    warm: list[dict[str, torch.Tensor]],
    n: int,
    scheme: str,
    seed: int,
    tensorboard: Path | None = None,
) -> tuple[list[dict[str, Any]], _Snapshots]:
    """Train ``scheme`` from the warm state ``warm`` of ``team``; rows of ``runs.csv`` and the recorded snapshots.
    ``tensorboard``: a folder where the run's update and stage metrics go as JSONL, CSV and TensorBoard event files
    (``n{n}-{scheme}-s{seed}/``)."""
    for i, state in enumerate(warm):
        team.load_adapter_state(i, state)
    for model in team.models:
        for p in model.parameters():
            p.grad = None
    rec = _Snapshots(team)
    log = train(ChainTrainable(team), trainer_config(cfg, n, seed, scheme), hooks=TrainHooks(rec.before, rec.after))
    if tensorboard is not None:
        for name, metric_rows in (("updates", log.updates), ("stages", log.stages)):
            writer = MetricsWriter(tensorboard / f"n{n}-{scheme}-s{seed}", name, tensorboard=True)
            writer.append(metric_rows)
            writer.close()
    train_index = "fresh" if scheme == "teamtr" else "stale"
    nan = math.nan
    rows: list[dict[str, Any]] = [
        dict(
            n=n,
            scheme=scheme,
            seed=seed,
            stage=0,
            J=log.stages[0]["perf/team_success_start"],
            drift_b=nan,
            drift_d=nan,
            episodes=0,
            tokens=0,
            agent_updates=0,
            steps=0.0,
            accepted=0,
            bound=0,
            kl_over=0,
            kl_max_ratio=nan,
            stale_gap=nan,
            certificate=nan,
        )
    ]
    for s, st in enumerate(log.stages):
        b, d, gap = rec.drifts(s, train_index)
        trust = trust_counts([u for u in log.updates if int(u["rollout/stage"]) == s], team.adapter_names)
        rows.append(
            dict(
                n=n,
                scheme=scheme,
                seed=seed,
                stage=s + 1,
                J=st["perf/team_success"],
                drift_b=b,
                drift_d=d,
                episodes=int(st["rollout/episodes"]),
                tokens=int(st["rollout/tokens"]),
                **trust,
                stale_gap=gap,
                certificate=st["certificate/proxy"],
            )
        )
    return rows, rec


def trust_counts(updates: Sequence[dict[str, float]], names: Sequence[str]) -> dict[str, Any]:
    """Trust-region accounting of one stage's update records, per agent-update: how many, the optimizer steps kept
    (summed), accepted (a step kept),
    bound (the full step broke KL ≤ δ, so it was shortened or reverted), accepted with KL > δ (must be 0), and the
    largest KL/δ among the accepted ones. KL is the trainer's trust-region estimate (exact over the vocabulary here).
    """
    out: dict[str, Any] = dict(agent_updates=0, steps=0.0, accepted=0, bound=0, kl_over=0, kl_max_ratio=0.0)
    for u in updates:
        for name in names:
            key = f"agent/{name}/"
            if key + "kl_trust" not in u:
                continue
            ratio = u[key + "kl_trust"] / u[key + "delta"]
            accepted = u[key + "accepted"] > 0
            out["agent_updates"] += 1
            out["steps"] += u[key + "optimizer_steps"]
            out["accepted"] += int(accepted)
            out["bound"] += int(u[key + "early_stopped"] > 0)
            if accepted:
                out["kl_over"] += int(ratio > 1.0)
                out["kl_max_ratio"] = max(out["kl_max_ratio"], ratio)
    return out


# ----------------------------------------------------------------------------------------------------------------
# the experiment

Cell = tuple[int, str, int]  # (n, scheme, seed)


def _cell(row: dict[str, Any]) -> Cell:
    return row["n"], row["scheme"], row["seed"]


def complete_runs(cfg: ChainExperimentConfig, rows: Sequence[dict[str, Any]]) -> set[Cell]:
    """The (n, scheme, seed) runs of ``cfg`` whose every stage is in ``rows``."""
    return {
        k
        for k, c in run_curves(rows).items()
        if k[1] in cfg.schemes and c[-1]["stage"] == cfg.stages_for(k[1], k[0]) and len(c) == c[-1]["stage"] + 1
    }


def run_chain_experiment(
    cfg: ChainExperimentConfig, out_dir: str | Path, say: Say | None = None, tensorboard: bool = False
) -> ExperimentResult:
    """Run every (n, scheme, seed), write the tables and plots into ``out_dir``; returns ``summary.md``, its
    sections and the tables. ``say``: one line per finished run (default: stderr). ``tensorboard``: each run's
    metrics also under ``out_dir/runs/`` (event files included).

    Resume: if ``out_dir`` already holds this exact ``config.json``, runs complete in its ``runs.csv`` are skipped.

    Raises:
        ConfigMismatchError: ``out_dir`` holds a ``config.json`` of a different config (naming every field).
    """
    talk = say or stderr_say(True)
    t0 = time.perf_counter()
    out, resume = open_run_dir(out_dir, cfg)
    runs_path = out / "runs.csv"
    log = RowLog(
        runs_path,
        RUN_COLUMNS,
        _cell,
        lambda rows: complete_runs(cfg, rows),
        nan="",
        resume=resume,
        optional=RUN_OPTIONAL,
    )
    reused = len(log.done)
    for n in cfg.ns:
        for seed in range(cfg.seeds):
            todo = [s for s in cfg.schemes if (n, s, seed) not in log.done]
            if not todo:
                continue
            team = ChainTeam(chain_config(cfg, n, seed))
            warm_start(team)
            warm = [team.adapter_state(i) for i in range(n)]
            for scheme in todo:
                t_run = time.perf_counter()
                new, _ = run_one(cfg, team, warm, n, scheme, seed, out / "runs" if tensorboard else None)
                log.add((n, scheme, seed), new)
                talk(
                    f"chain n={n} {scheme} seed={seed}: J {new[0]['J']:.3f} → {new[-1]['J']:.3f} "
                    f"({new[-1]['episodes']} episodes, {time.perf_counter() - t_run:.1f} s)"
                )
    tables = analyse(cfg, log.rows)
    plot(cfg, log.rows, tables, out)
    total = len(cfg.ns) * cfg.seeds * len(cfg.schemes)
    sections = summary_sections(cfg, tables, time.perf_counter() - t0, reused=reused, total=total)
    return finish(out, tables, sections, nan="")


__all__ = [
    "RUN_COLUMNS",
    "RUN_FIELDS",
    "RUN_OPTIONAL",
    "complete_runs",
    "run_chain_experiment",
    "run_one",
    "trust_counts",
]
