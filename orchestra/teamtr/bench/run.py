"""Running the telephone-chain benchmark (docs/architecture.md §5; the study: docs/telephone-chain.md): every
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

Outputs of :func:`run_bench` (``out_dir``): ``config.json``, ``runs.csv`` (one row per (n, scheme, seed, stage),
stage 0 = the warm-started team, drift empty there), ``final.csv``, ``regressions.csv``, ``drift.csv``,
``alpha.csv``, ``trust.csv``, ``checks.csv`` (:mod:`~orchestra.teamtr.bench.analysis`), ``learning_curves.png``,
``drift.png`` and ``summary.md`` (every table, :mod:`~orchestra.teamtr.bench.report`). Completed runs found in an
existing ``runs.csv`` with the same ``config.json`` are skipped (resume per run).
"""

from __future__ import annotations

import csv
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from orchestra.teamtr.bench.analysis import analyse, run_curves
from orchestra.teamtr.bench.config import BenchConfig, chain_config, trainer_config
from orchestra.teamtr.bench.report import join_sections, plot, summary_sections
from orchestra.teamtr.chain import ChainTeam, Matrix, drift_b, drift_d, policy_matrices, stale_gap_terms, warm_start
from orchestra.teamtr.chain_team import ChainTrainable
from orchestra.teamtr.trainer import TrainHooks, train
from trajectories.rundir import CONFIG_FILE, MetricsWriter, check_config, write_config, write_table

RUN_FIELDS = (
    "n", "scheme", "seed", "stage", "J", "drift_b", "drift_d", "episodes", "tokens",
    "agent_updates", "accepted", "bound", "kl_over", "kl_max_ratio", "stale_gap", "certificate",
)  # fmt: skip

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
    cfg: BenchConfig,
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
        dict(n=n, scheme=scheme, seed=seed, stage=0, J=log.stages[0]["perf/team_success_start"], drift_b=nan,
             drift_d=nan, episodes=0, tokens=0, agent_updates=0, accepted=0, bound=0, kl_over=0, kl_max_ratio=nan,
             stale_gap=nan, certificate=nan)
    ]  # fmt: skip
    for s, st in enumerate(log.stages):
        b, d, gap = rec.drifts(s, train_index)
        trust = trust_counts([u for u in log.updates if int(u["rollout/stage"]) == s], team.adapter_names)
        rows.append(
            dict(n=n, scheme=scheme, seed=seed, stage=s + 1, J=st["perf/team_success"], drift_b=b, drift_d=d,
                 episodes=int(st["rollout/episodes"]), tokens=int(st["rollout/tokens"]), **trust, stale_gap=gap,
                 certificate=st["certificate/proxy"])
        )  # fmt: skip
    return rows, rec


def trust_counts(updates: Sequence[dict[str, float]], names: Sequence[str]) -> dict[str, Any]:
    """Trust-region accounting of one stage's update records, per agent-update: how many, accepted (a step kept),
    bound (the full step broke KL ≤ δ, so it was shortened or reverted), accepted with KL > δ (must be 0), and the
    largest KL/δ among the accepted ones. KL is the trainer's trust-region estimate (exact over the vocabulary here).
    """
    out: dict[str, Any] = dict(agent_updates=0, accepted=0, bound=0, kl_over=0, kl_max_ratio=0.0)
    for u in updates:
        for name in names:
            key = f"agent/{name}/"
            if key + "kl_trust" not in u:
                continue
            ratio = u[key + "kl_trust"] / u[key + "delta"]
            accepted = u[key + "accepted"] > 0
            out["agent_updates"] += 1
            out["accepted"] += int(accepted)
            out["bound"] += int(u[key + "early_stopped"] > 0)
            if accepted:
                out["kl_over"] += int(ratio > 1.0)
                out["kl_max_ratio"] = max(out["kl_max_ratio"], ratio)
    return out


# ----------------------------------------------------------------------------------------------------------------
# files


def _read_runs(path: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        missing = [k for k in RUN_FIELDS if k not in (reader.fieldnames or [])]
        if missing:
            raise FileExistsError(f"{path} lacks the columns {missing} (an older format); use another output directory")
        for r in reader:
            rows.append(
                dict(n=int(r["n"]), scheme=r["scheme"], seed=int(r["seed"]), stage=int(r["stage"]), J=float(r["J"]),
                     drift_b=float(r["drift_b"] or "nan"), drift_d=float(r["drift_d"] or "nan"),
                     episodes=int(r["episodes"]), tokens=int(r["tokens"]),
                     **{k: int(r[k]) for k in ("agent_updates", "accepted", "bound", "kl_over")},
                     kl_max_ratio=float(r["kl_max_ratio"] or "nan"), stale_gap=float(r["stale_gap"] or "nan"),
                     certificate=float(r["certificate"] or "nan"))
            )  # fmt: skip
    return rows


def _fmt_cell(v: Any) -> Any:
    if isinstance(v, float):
        return "" if math.isnan(v) else repr(v)
    return v


def _write_csv(path: Path, rows: Sequence[dict[str, Any]], fields: Sequence[str], append: bool = False) -> None:
    write_table(path, ({k: _fmt_cell(r[k]) for k in fields} for r in rows), fields, append=append)


# ----------------------------------------------------------------------------------------------------------------
# the benchmark


@dataclass(frozen=True)
class BenchResult:
    """What :func:`run_bench` wrote: ``summary.md`` and its sections (:func:`~orchestra.teamtr.bench.report.summary_sections`)."""

    summary: Path  # OUT/summary.md
    sections: dict[str, list[str]]  # the summary's named sections (lines)

    def section(self, *names: str) -> str:
        """The named sections as markdown (stripped)."""
        return join_sections(self.sections, names).strip()


def run_bench(cfg: BenchConfig, out_dir: str | Path, progress: bool = True, tensorboard: bool = False) -> BenchResult:
    """Run every (n, scheme, seed), write the tables and plots into ``out_dir``; returns ``summary.md`` and its
    sections. ``tensorboard``: each run's metrics also under ``out_dir/runs/`` (event files included).

    Resume: if ``out_dir`` already holds this exact ``config.json``, runs complete in its ``runs.csv`` are skipped.

    Raises:
        ConfigMismatchError: ``out_dir`` holds a ``config.json`` of a different config (every differing field named).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    config_path, runs_path = out / CONFIG_FILE, out / "runs.csv"
    rows: list[dict[str, Any]] = []
    if config_path.exists():
        check_config(config_path, cfg, hint="use another output directory")
        if runs_path.exists():
            rows = _read_runs(runs_path)
    write_config(out, cfg)
    done = {
        k
        for k, c in run_curves(rows).items()
        if k[1] in cfg.schemes and c[-1]["stage"] == cfg.stages_for(k[1], k[0]) and len(c) == c[-1]["stage"] + 1
    }
    rows = [r for r in rows if (r["n"], r["scheme"], r["seed"]) in done]
    _write_csv(runs_path, rows, RUN_FIELDS)
    for n in cfg.ns:
        for seed in range(cfg.seeds):
            todo = [s for s in cfg.schemes if (n, s, seed) not in done]
            if not todo:
                continue
            team = ChainTeam(chain_config(cfg, n, seed))
            warm_start(team)
            warm = [team.adapter_state(i) for i in range(n)]
            for scheme in todo:
                t_run = time.perf_counter()
                new, _ = run_one(cfg, team, warm, n, scheme, seed, out / "runs" if tensorboard else None)
                _write_csv(runs_path, new, RUN_FIELDS, append=True)
                rows += new
                if progress:
                    print(
                        f"bench n={n} {scheme} seed={seed}: J {new[0]['J']:.3f} → {new[-1]['J']:.3f} "
                        f"({new[-1]['episodes']} episodes, {time.perf_counter() - t_run:.1f} s)",
                        file=sys.stderr,
                    )
    tables = analyse(cfg, rows)
    for name, table in tables.items():
        if table:
            _write_csv(out / f"{name}.csv", table, list(table[0]))
    plot(cfg, rows, tables, out)
    summary = out / "summary.md"
    total = len(cfg.ns) * cfg.seeds * len(cfg.schemes)
    sections = summary_sections(cfg, tables, time.perf_counter() - t0, reused=len(done), total=total)
    summary.write_text(join_sections(sections))
    return BenchResult(summary, sections)


__all__ = ["RUN_FIELDS", "BenchResult", "run_bench", "run_one", "trust_counts"]
