"""Phase 1 end to end: record with mixed rule-based conductors (+ ε-exploration), build a dataset per
team, train offline conductors with d3rlpy, estimate their value with FQE, evaluate them against every
rule-based conductor on the same held-out tasks, and distil the best one into readable rules.

``orchestra demo`` runs it at demo scale; ``orchestra reproduce conductor`` at the scale the README
quotes. Every stage writes into one run directory and a rerun continues where a killed one stopped
(recordings and evaluations resume; training is deterministic and cheap, so it is redone).
"""

from __future__ import annotations

import csv
import hashlib
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from envs.observation import ObservationEncoder
from orchestra.jobs.evaluate import EvaluateConfig, evaluate
from orchestra.jobs.record import RecordConfig, record
from orchestra.report.evaluation import (
    PAIRED_LEGEND,
    ResultRow,
    format_collapse_table,
    format_paired_table,
    format_table,
    mode_collapse,
    paired_comparison,
)
from orchestra.runtime.session import RunOptions, Session
from policies import RULE_BASED
from policies.dataset import ConductorDataset, FeatureSet, build_dataset
from policies.distill import DistillConfig, distill
from policies.offline import MODEL_FILE, FQEConfig, OfflineConductor, OfflineConfig, fqe_evaluate, train_offline
from trajectories import read_many


@dataclass
class Phase1Config:
    """Every knob of a phase-1 run (written to ``config.json`` in the run directory)."""

    teams: list[str] = field(default_factory=lambda: ["arithmetic", "blocksworld"])  # one per task family
    record_conductors: list[str] = field(default_factory=lambda: list(RULE_BASED))  # data sources
    explore_conductors: list[str] = field(default_factory=lambda: ["pipeline", "heuristic"])  # re-run with ε
    epsilon: float = 0.3  # share of random legal decisions in the exploring recordings
    train_episodes: int = 16  # training-split tasks recorded per source conductor
    eval_episodes: int = 32  # held-out tasks per family, the same for every conductor
    algos: list[str] = field(default_factory=lambda: ["bc", "cql"])  # offline algorithms to train
    n_steps: int = 2000  # gradient steps per algorithm
    # CQL conservatism. d3rlpy's default (1.0) is calibrated for large datasets from one behaviour
    # policy; here a few hundred episodes come from a handful of schedules widened by ε-exploration,
    # and α = 1 only re-learns the most frequent logged schedule. A small α lets the returns speak.
    cql_alpha: float = 0.02
    # Q ensemble of the value-based learners: targets take the minimum over 2 critics, a pessimism that
    # keeps actions seen only a few times in the logs (exploration) from looking better than they are
    n_critics: int = 2
    features: FeatureSet = "structural"  # observation columns the learned conductors see: structural | all
    n_steps_per_epoch: int = 500  # steps per metrics row / checkpoint
    fqe_steps: int = 1500  # FQE gradient steps per learned conductor
    distill_depth: int = 4  # depth of the distilled decision tree
    run: RunOptions = RunOptions()  # seed (tasks, exploration, training), envs, cache, progress

    @classmethod
    def demo(cls) -> Phase1Config:
        """``orchestra demo``: phase 1 end to end, sized for about ten minutes on 2 CPU cores."""
        return cls(train_episodes=16, eval_episodes=12, n_steps=1500, fqe_steps=800)

    @classmethod
    def reproduce(cls) -> Phase1Config:
        """The full-scale phase-1 run whose table the README quotes (``orchestra reproduce conductor``)."""
        return cls(algos=["bc", "fbc", "cql"], train_episodes=32, eval_episodes=50, n_steps=4000, fqe_steps=3000)


@dataclass
class OPERow:
    team: str
    conductor: str
    fqe_estimate: float  # FQE value of the initial states, from the training logs alone
    behaviour_return: float  # mean return of the logged episodes it was estimated from
    measured_return: float  # mean return measured on the held-out tasks
    measured_ci_low: float
    measured_ci_high: float


@dataclass
class Phase1Result:
    rows: list[ResultRow]
    ope: list[OPERow]
    rules: dict[str, str]  # team -> distilled rules
    paths: dict[str, Path]


def _stage(i: int, n: int, msg: str) -> None:
    print(f"[{i}/{n}] {msg}", flush=True)


def record_stage(cfg: Phase1Config, out: Path) -> dict[str, list[Path]]:
    files: dict[str, list[Path]] = {}
    for team in cfg.teams:
        session = Session.of(team, None, cfg.run)
        name = session.team.name
        rule = out / "record" / f"{name}-rule.jsonl"
        rc = RecordConfig(team, ",".join(cfg.record_conductors), cfg.train_episodes, "train", run=cfg.run)
        record(rc, rule, resume=True, session=session)
        files[name] = [rule]
        if cfg.explore_conductors and cfg.epsilon > 0:
            explore = out / "record" / f"{name}-explore.jsonl"
            rc = RecordConfig(
                team,
                ",".join(cfg.explore_conductors),
                cfg.train_episodes,
                "train",
                epsilon=cfg.epsilon,
                run=cfg.run,
            )
            record(rc, explore, resume=True, session=session)
            files[name].append(explore)
    return files


def model_digest(folder: Path) -> str:
    """sha256 over a learned conductor's checkpoint files (weights and conductor.json)."""
    h = hashlib.sha256()
    for f in sorted(p for p in folder.iterdir() if p.name in (MODEL_FILE, "conductor.json")):
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def drop_stale_evaluation(episodes: Path, model: Path) -> None:
    """A rerun resumes evaluations, but a learned conductor retrained into other weights (changed
    config, data or code) must be evaluated afresh: its episodes are kept only while the digest of the
    model they were recorded with matches."""
    digest_file = episodes.with_suffix(".model-sha256")
    digest = model_digest(model)
    if episodes.exists() and (not digest_file.exists() or digest_file.read_text().strip() != digest):
        print(f"  {episodes.name}: the model changed since it was evaluated; evaluating it again")
        episodes.unlink()
    episodes.parent.mkdir(parents=True, exist_ok=True)
    digest_file.write_text(digest + "\n", encoding="utf-8")


def ope_table_md(rows: list[OPERow]) -> str:
    lines = [
        "| team | conductor | FQE estimate (logs only) | logged behaviour return | measured return [95% CI] |",
        "|---|---|---:|---:|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.team} | {r.conductor} | {r.fqe_estimate:.3f} | {r.behaviour_return:.3f} | "
            f"{r.measured_return:.3f} [{r.measured_ci_low:.3f}, {r.measured_ci_high:.3f}] |"
        )
    return "\n".join(lines)


def run_phase1(cfg: Phase1Config, out: Path, command: str = "") -> Phase1Result:
    t0 = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps({"phase1": asdict(cfg)}, indent=2), encoding="utf-8")
    n = 6
    _stage(
        1,
        n,
        f"recording {len(cfg.record_conductors)} rule-based conductors (+{len(cfg.explore_conductors)} "
        f"with ε={cfg.epsilon:g}) on {cfg.train_episodes} training tasks per team: {', '.join(cfg.teams)}",
    )
    files = record_stage(cfg, out)

    _stage(2, n, "building datasets and training " + ", ".join(cfg.algos))
    datasets: dict[str, ConductorDataset] = {}
    learned: dict[str, dict[str, OfflineConductor]] = {}
    encoders: dict[str, ObservationEncoder] = {}
    for team_name, sources in files.items():
        session = Session(team_name, None, False, None)
        enc = ObservationEncoder(session.team.env)
        encoders[team_name] = enc
        ds = build_dataset(sources, session.team.env, enc)
        ds.save(out / "datasets" / f"{team_name}.npz")
        (out / "datasets" / f"{team_name}.summary.json").write_text(json.dumps(ds.summary(), indent=2))
        datasets[team_name] = ds
        learned[team_name] = {}
        for algo in cfg.algos:
            oc = OfflineConfig(
                algo=algo,
                n_steps=cfg.n_steps,
                n_steps_per_epoch=cfg.n_steps_per_epoch,
                cql_alpha=cfg.cql_alpha,
                n_critics=cfg.n_critics,
                features=cfg.features,
                seed=cfg.run.seed,
            )
            res = train_offline(ds, oc, out / "models" / team_name / algo)
            learned[team_name][algo] = res.conductor
            print(f"  {team_name}/{algo}: agreement with the logged actions {res.metrics[-1]['perf/agreement']:.3f}")

    _stage(3, n, "off-policy evaluation (FQE) of each learned conductor from the training logs")
    fqe: dict[tuple[str, str], tuple[float, float]] = {}
    for team_name, algos in learned.items():
        for algo, c in algos.items():
            r = fqe_evaluate(
                c.predict,
                datasets[team_name],
                encoders[team_name].legal_mask,
                FQEConfig(n_steps=cfg.fqe_steps, features=cfg.features, seed=cfg.run.seed),
            )
            fqe[(team_name, algo)] = (r.estimate, r.behaviour_return)
            print(f"  {team_name}/{algo}: FQE {r.estimate:.3f} (logged behaviour {r.behaviour_return:.3f})")

    _stage(4, n, f"evaluating every conductor on {cfg.eval_episodes} held-out tasks per family (paired)")
    for team_name, algos in learned.items():
        for algo in algos:
            drop_stale_evaluation(
                out / "eval" / "episodes" / f"{team_name}-{algo}.jsonl", out / "models" / team_name / algo
            )
    specs = list(RULE_BASED) + [f"{a}:{out / 'models'}/{{team}}/{a}" for a in cfg.algos]
    ec = EvaluateConfig(teams=tuple(cfg.teams), conductors=tuple(specs), episodes=cfg.eval_episodes, run=cfg.run)
    rows, paths = evaluate(ec, out / "eval")

    _stage(5, n, "FQE estimate vs measured return")
    by = {(r.team, r.conductor): r for r in rows}
    ope: list[OPERow] = []
    for (team_name, algo), (est, beh) in sorted(fqe.items()):
        m = by.get((team_name, algo))
        if m is None:
            continue
        ope.append(OPERow(team_name, algo, est, beh, m.mean_return, m.return_ci_low, m.return_ci_high))
    with (out / "eval" / "ope.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(OPERow.__dataclass_fields__))
        w.writeheader()
        w.writerows(asdict(o) for o in ope)

    _stage(6, n, f"distilling the learned conductors into depth-{cfg.distill_depth} decision trees")
    rules: dict[str, str] = {}
    for team_name, algos in learned.items():
        ds = datasets[team_name]
        for algo, c in algos.items():
            labels = c.predict(ds.observations, ds.masks)
            res_d = distill(
                labels,
                ds.observations,
                ds.masks,
                ds.feature_names,
                ds.action_labels,
                DistillConfig(max_depth=cfg.distill_depth, seed=cfg.run.seed),
                episode_index=ds.episode_index,
            )
            res_d.save(out / "distill" / team_name / algo)
            rules[f"{team_name}/{algo}"] = (
                f"fidelity {res_d.fidelity_heldout:.3f} on held-out states "
                f"({res_d.n_heldout}), {res_d.fidelity_train:.3f} on training states\n{res_d.rules}"
            )

    eps = read_many([p for p in (out / "eval" / "episodes").glob("*.jsonl")]).episodes
    paired = paired_comparison(eps, rows)
    summary = [
        "# Phase 1: learned conductors vs rule-based schedulers",
        "",
        f"Held-out tasks per family: {cfg.eval_episodes}; training tasks per source conductor: {cfg.train_episodes}; "
        f"seed {cfg.run.seed}." + (f" Produced by `{command}`." if command else ""),
        "",
        "## Results (success: 95% Wilson interval; return, turns, tokens: 95% bootstrap)",
        "",
        format_table(rows),
        "",
        "## Paired against the best rule-based conductor of each family",
        "",
        PAIRED_LEGEND,
        "",
        format_paired_table(paired),
        "",
        "## Mode collapse: how varied each conductor's action sequences are",
        "",
        format_collapse_table(mode_collapse(eps)),
        "",
        "## Off-policy evaluation: FQE from the logs vs measured",
        "",
        ope_table_md(ope),
        "",
        "## Distilled rules",
        "",
    ]
    for k, v in rules.items():
        summary += [f"### {k}", "", "```", v.rstrip(), "```", ""]
    elapsed = time.perf_counter() - t0
    summary.append(f"Run time: {elapsed:.0f} s on this machine.")
    md = out / "summary.md"
    md.write_text("\n".join(summary) + "\n", encoding="utf-8")
    paths = {**paths, "summary": md, "ope": out / "eval" / "ope.csv"}
    print()
    print("\n".join(summary))
    print(f"\nfinished in {elapsed:.0f} s; summary: {md}")
    return Phase1Result(rows, ope, rules, paths)


@dataclass(frozen=True)
class ReproduceConfig:
    """``orchestra reproduce conductor``: phase 1 at the scale the README's Results section quotes."""

    phase1: Phase1Config = field(default_factory=Phase1Config.reproduce)  # the full-scale run
    out: str = "runs/reproduce-conductor"  # run directory (a rerun continues it)
    report: str | None = None  # also copy the summary (markdown) here, e.g. docs/results/conductor.md


def reproduce(cfg: ReproduceConfig) -> Phase1Result:
    res = run_phase1(cfg.phase1, Path(cfg.out), command=f"orchestra reproduce conductor --seed {cfg.phase1.run.seed}")
    if cfg.report:
        Path(cfg.report).parent.mkdir(parents=True, exist_ok=True)
        Path(cfg.report).write_text(res.paths["summary"].read_text(encoding="utf-8"), encoding="utf-8")
    return res


__all__ = [
    "OPERow",
    "drop_stale_evaluation",
    "model_digest",
    "Phase1Config",
    "Phase1Result",
    "ReproduceConfig",
    "reproduce",
    "ope_table_md",
    "run_phase1",
]
