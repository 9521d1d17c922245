"""Phase 1 end to end, as an evaluation protocol (docs/protocol.md).

1. **Record** training data on the *train* split: every rule of each team's menu (its team file's
   rules, ``orchestra.runtime.conductors.team_rules``) plus ``random``, and two rules with ε-exploration.
2. **Validation, menu**: every rule on the *validation* split; the best one there is the family's
   **best fixed schedule** (success, then return).
3. **Train** every learner configuration (BC, filtered BC, DQN, DoubleDQN, BCQ, CQL over several α) with
   d3rlpy, keeping a mid-training and the final checkpoint.
4. **Validation, learners**: each checkpoint on the validation split. Per algorithm the best
   configuration there is the one released (so CQL's α is chosen on validation, never on test).
5. **FQE model selection check**: FQE from the training logs, evaluated on the validation tasks'
   initial states, against the returns measured there, over every checkpoint (Spearman, regret).
6. **Test, once**: the menu, ``random`` and the released learners (each trained with every seed) on the
   *test* split; every test evaluation is appended to ``test_ledger.jsonl`` in the run directory.
7. **Report**: results, the oracle router over the menu, headroom and captured fraction, paired tests
   against the best fixed schedule, the LLM-required subset, the cost–quality plane, FQE selection,
   distilled rules, and the power of the test at this sample size.

``orchestra demo`` runs it at demo scale; ``orchestra reproduce conductor`` at the scale the README
quotes. Every stage writes into one run directory and a rerun continues where a killed one stopped
(recordings and evaluations resume; a learner whose config and dataset digest are unchanged is reused, as is an
FQE estimate whose model, dataset, config and initial states are; a learned conductor whose weights changed is
evaluated afresh).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from envs.config import TeamEnvConfig
from envs.observation import ObservationEncoder
from orchestra.jobs.record import RecordConfig, record
from orchestra.report import stats
from orchestra.report.benchmark import FQERow, HeadroomRow, fqe_table_md, headroom_table_md, not_shown, subset_table_md
from orchestra.report.evaluation import (
    PAIRED_LEGEND,
    ResultRow,
    format_collapse_table,
    format_paired_table,
    format_table,
    mode_collapse,
    paired_comparison,
    summarize,
    write_report,
)
from orchestra.report.plots import plot_cost_quality
from orchestra.runtime.conductors import team_rules
from orchestra.runtime.session import RunOptions, Session
from policies.dataset import ConductorDataset, FeatureSet, build_dataset
from policies.distill import DistillConfig, distill
from policies.offline import (
    ALGO_FILE,
    MODEL_FILE,
    FQEConfig,
    OfflineConductor,
    OfflineConfig,
    fqe_evaluate,
    train_offline,
)
from trajectories import Episode, read_many
from trajectories.rundir import atomic_path, write_config, write_table


@dataclass
class Phase1Config:
    """Every knob of a phase-1 run (written to ``config.json`` in the run directory)."""

    teams: list[str] = field(default_factory=lambda: ["arithmetic", "logic_grid"])  # one per task family
    # training-data sources; empty = each team's menu (every rule of its team file) plus random
    record_conductors: list[str] = field(default_factory=list)
    explore_conductors: list[str] = field(default_factory=lambda: ["pipeline", "heuristic"])  # re-run with ε
    epsilon: float = 0.3  # share of random legal decisions in the exploring recordings
    train_episodes: int = 16  # training-split tasks recorded per source conductor
    validation_episodes: int = 16  # validation tasks per family: the best fixed schedule and every hyperparameter
    eval_episodes: int = 32  # test tasks per family, the same for every conductor, evaluated once
    # fewer test tasks for a family whose pool of distinct test items is smaller (code_synthesis holds 81)
    test_caps: dict[str, int] = field(default_factory=lambda: {"code_synthesis": 80})
    algos: list[str] = field(default_factory=lambda: ["bc", "cql"])  # offline algorithms to train
    # CQL conservatism, one learner configuration per value, chosen on validation. d3rlpy's default (1.0) is
    # calibrated for large datasets from one behaviour policy; on a few hundred episodes it re-learns the most
    # frequent logged schedule, hence the small values
    cql_alphas: list[float] = field(default_factory=lambda: [0.02])
    seeds: list[int] = field(default_factory=lambda: [0])  # training seeds of the released learners (mean ± sd)
    n_steps: int = 2000  # gradient steps per algorithm
    # Q ensemble of the value-based learners: targets take the minimum over 2 critics, a pessimism that
    # keeps actions seen only a few times in the logs (exploration) from looking better than they are
    n_critics: int = 2
    features: FeatureSet = "structural"  # observation columns the learned conductors see: structural | all
    n_steps_per_epoch: int = 500  # steps per metrics row / checkpoint
    fqe_steps: int = 1500  # FQE gradient steps per policy
    distill_depth: int = 4  # depth of the distilled decision tree
    run: RunOptions = RunOptions()  # seed (tasks, exploration), envs, cache, progress

    @classmethod
    def demo(cls) -> Phase1Config:
        """``orchestra demo``: phase 1 end to end, sized for about ten minutes on 2 CPU cores."""
        return cls(train_episodes=8, validation_episodes=8, eval_episodes=10, n_steps=1000, fqe_steps=500)

    @classmethod
    def reproduce(cls) -> Phase1Config:
        """The full-scale phase-1 run whose tables the README quotes (``orchestra reproduce conductor``)."""
        return cls(
            teams=["arithmetic", "logic_grid", "code_synthesis"],
            algos=["bc", "fbc", "dqn", "ddqn", "bcq", "cql"],
            cql_alphas=[0.02, 0.1, 0.5],
            seeds=[0, 1, 2],
            train_episodes=32,
            validation_episodes=60,
            eval_episodes=150,
            n_steps=3000,
            fqe_steps=1000,
        )

    def learner_configs(self) -> dict[str, OfflineConfig]:
        """Every learner configuration by label (``cql-a0.1`` per α), trained with ``seeds[0]``."""
        out: dict[str, OfflineConfig] = {}
        for algo in self.algos:
            for alpha in self.cql_alphas if algo == "cql" else [None]:
                label = algo if alpha is None else f"cql-a{alpha:g}"
                out[label] = OfflineConfig(
                    algo=algo,
                    n_steps=self.n_steps,
                    n_steps_per_epoch=self.n_steps_per_epoch,
                    cql_alpha=alpha if alpha is not None else 1.0,
                    n_critics=self.n_critics,
                    features=self.features,
                    seed=self.seeds[0],
                    keep_epochs=True,
                )
        return out


@dataclass
class Phase1Result:
    rows: list[ResultRow]
    headroom: list[HeadroomRow]
    fqe: list[FQERow]
    rules: dict[str, str]  # team/learner -> distilled rules
    paths: dict[str, Path]


def _stage(i: int, n: int, msg: str) -> None:
    print(f"[{i}/{n}] {msg}", flush=True)


def record_stage(
    cfg: Phase1Config, out: Path, sessions: dict[str, Session], specs: dict[str, str]
) -> dict[str, list[Path]]:
    files: dict[str, list[Path]] = {}
    for name, session in sessions.items():
        team = specs[name]
        sources = cfg.record_conductors or [*team_rules(session.team), "random"]
        rule = out / "record" / f"{name}-rule.jsonl"
        rc = RecordConfig(team, ",".join(sources), cfg.train_episodes, "train", run=cfg.run)
        record(rc, rule, resume=True, session=session)
        files[name] = [rule]
        if cfg.explore_conductors and cfg.epsilon > 0:
            explore = out / "record" / f"{name}-explore.jsonl"
            rc = RecordConfig(
                team, ",".join(cfg.explore_conductors), cfg.train_episodes, "train", epsilon=cfg.epsilon, run=cfg.run
            )
            record(rc, explore, resume=True, session=session)
            files[name].append(explore)
    return files


def model_digest(folder: Path) -> str:
    """sha256 over a learned conductor's checkpoint files (weights, algorithm and conductor.json)."""
    h = hashlib.sha256()
    for f in sorted(p for p in folder.iterdir() if p.name in (MODEL_FILE, ALGO_FILE, "conductor.json")):
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


def fqe_estimate(
    path: Path,
    folder: Path,
    env: TeamEnvConfig,
    encoder: ObservationEncoder,
    ds: ConductorDataset,
    fcfg: FQEConfig,
    initial: tuple[np.ndarray, np.ndarray],
) -> float:
    """FQE's estimate for the model in ``folder``, kept in ``path`` with what it was computed from (model digest,
    dataset digest, FQE config, initial states) and reused by a rerun only when all of those are the same."""
    key = {
        "model_sha256": model_digest(folder),
        "dataset_sha256": ds.digest(),
        "fqe": asdict(fcfg),
        "initial_sha256": hashlib.sha256(initial[0].tobytes() + initial[1].tobytes()).hexdigest(),
    }
    key = json.loads(json.dumps(key))  # tuples as lists, as they read back
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
        if saved["key"] == key:
            return float(saved["estimate"])
    except (OSError, ValueError, KeyError, TypeError):
        pass  # none yet, or damaged: estimated afresh and rewritten
    c = OfflineConductor.load(folder, env, encoder)
    r = fqe_evaluate(c.predict, ds, encoder.legal_mask, fcfg, initial=initial)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path, "FQE estimate") as tmp:
        tmp.write_text(json.dumps({"key": key, "estimate": r.estimate}, indent=2), encoding="utf-8")
    return r.estimate


def play(
    cfg: Phase1Config, team: str, specs: Sequence[str], split: str, n: int, path: Path, session: Session
) -> list[Episode]:
    """Run conductors (NAME or LABEL:CHECKPOINT) on the same ``n`` tasks of ``split``; resumes ``path``. Episodes a
    backend fault ended stay in the file (``orchestra trajectories stats`` counts them) but are not outcomes: they
    are not returned."""
    res = record(RecordConfig(team, ",".join(specs), n, split, run=cfg.run), path, resume=True, session=session)  # type: ignore[arg-type]
    return [e for e in read_many([res.trajectories]).episodes if e.error is None]


def ledger_entry(path: Path, entry: dict[str, object]) -> bool:
    """Append a test evaluation to the run's ledger unless the same one is there already (a resumed run);
    returns whether it was new. The ledger is the record that the test split was used once per released
    configuration: a changed model or team file is a new line."""
    key = json.dumps(entry, sort_keys=True)
    seen = set()
    if path.exists():
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                seen.add(json.dumps({k: v for k, v in json.loads(line).items() if k != "time"}, sort_keys=True))
    if key in seen:
        return False
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps({**entry, "time": time.strftime("%Y-%m-%dT%H:%M:%S")}) + "\n")
    return True


def _best(rows: Sequence[ResultRow], names: Sequence[str]) -> ResultRow:
    cand = [r for r in rows if r.conductor in names]
    return max(cand, key=lambda r: (r.success_rate, r.mean_return, [-ord(c) for c in r.conductor]))


def _by_task(eps: Sequence[Episode]) -> dict[str, dict[tuple[str, int], Episode]]:
    out: dict[str, dict[tuple[str, int], Episode]] = {}
    for e in eps:
        out.setdefault(e.conductor.name, {})[(e.task.id, e.seed)] = e
    return out


def initial_states(eps: Sequence[Episode], encoder: ObservationEncoder) -> tuple[np.ndarray, np.ndarray]:
    """The first observation and action mask of each task (one per task id and seed), the observation re-encoded
    from the recorded state with ``encoder``, so it has the layout the learners were trained with even when the
    episodes were recorded under another encoder."""
    seen: dict[tuple[str, int], Episode] = {}
    for e in eps:
        seen.setdefault((e.task.id, e.seed), e)
    firsts = [seen[k] for k in sorted(seen)]
    return (
        encoder.encode_many([e.steps[0].state for e in firsts]).astype(np.float32),
        np.asarray([e.steps[0].action_mask for e in firsts], dtype=np.int8),
    )


def run_phase1(cfg: Phase1Config, out: Path, command: str = "") -> Phase1Result:
    t0 = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    write_config(out, {"phase1": cfg})
    n = 7
    configs = cfg.learner_configs()
    sessions: dict[str, Session] = {}  # one per team, reused by every stage (workers, backends, cache)
    specs: dict[str, str] = {}  # team name -> the team as given (built-in name or file)
    for t in cfg.teams:
        session = Session.of(t, None, cfg.run)
        sessions[session.team.name], specs[session.team.name] = session, t
    _stage(
        1, n, f"recording the menu (+ ε={cfg.epsilon:g}) on {cfg.train_episodes} training tasks: {', '.join(cfg.teams)}"
    )
    files = record_stage(cfg, out, sessions, specs)
    menus = {name: team_rules(session.team) for name, session in sessions.items()}
    _stage(2, n, f"the menu on {cfg.validation_episodes} validation tasks per family: the best fixed schedule")
    val_eps: dict[str, list[Episode]] = {}
    best_fixed: dict[str, str] = {}
    for name, session in sessions.items():
        team = specs[name]
        eps = play(cfg, team, menus[name], "validation", cfg.validation_episodes,
                   out / "validation" / name / "menu.jsonl", session)  # fmt: skip
        val_eps[name] = eps
        best_fixed[name] = _best(summarize(eps), menus[name]).conductor
        print(f"  {name}: best fixed schedule on validation: {best_fixed[name]}")

    _stage(3, n, f"building datasets and training {len(configs)} learner configurations: {', '.join(configs)}")
    datasets: dict[str, ConductorDataset] = {}
    encoders: dict[str, ObservationEncoder] = {}
    trained: dict[tuple[str, str], OfflineConductor] = {}
    for name, sources in files.items():
        env_cfg = sessions[name].team.env
        enc = ObservationEncoder(env_cfg)
        encoders[name] = enc
        ds = build_dataset(sources, env_cfg, enc)
        ds.save(out / "datasets" / f"{name}.npz")
        (out / "datasets" / f"{name}.summary.json").write_text(json.dumps(ds.summary(), indent=2))
        datasets[name] = ds
        for label, oc in configs.items():
            res = train_offline(ds, oc, out / "models" / name / label / f"s{oc.seed}", resume="if_same")
            trained[(name, label)] = res.conductor
            print(f"  {name}/{label}: agreement with the logged actions {res.metrics[-1]['perf/agreement']:.3f}")

    _stage(4, n, "every learner checkpoint (mid-training and final) on the validation tasks")
    epochs = max(1, cfg.n_steps // cfg.n_steps_per_epoch)
    marks = sorted({max(1, (epochs + 1) // 2), epochs})
    released: dict[str, dict[str, str]] = {}  # team -> algo -> config label
    val_policies: dict[str, list[tuple[str, Path]]] = {}
    for name, session in sessions.items():
        team = specs[name]
        pols = []
        for label, oc in configs.items():
            for ep in marks:
                folder = out / "models" / name / label / f"s{oc.seed}" / "epochs" / str(ep)
                pols.append((f"{label}@{ep}", folder))
        val_policies[name] = pols
        for pol, folder in pols:
            path = out / "validation" / name / f"{pol}.jsonl"
            drop_stale_evaluation(path, folder)
            val_eps[name] += play(cfg, team, [f"{pol}:{folder}"], "validation", cfg.validation_episodes, path, session)
        vrows = {r.conductor: r for r in summarize(val_eps[name])}
        released[name] = {}
        for algo in cfg.algos:
            cands = [lab for lab, oc in configs.items() if oc.algo == algo]
            pick = max(
                cands, key=lambda lab: (vrows[f"{lab}@{epochs}"].success_rate, vrows[f"{lab}@{epochs}"].mean_return)
            )
            released[name][algo] = pick
        print(f"  {name}: released (chosen on validation): " + ", ".join(f"{a}={c}" for a, c in released[name].items()))

    _stage(5, n, "FQE from the training logs at the validation tasks' initial states vs the returns measured there")
    fqe_rows: list[FQERow] = []
    selection: dict[str, stats.FQESelection] = {}
    for name in sessions:
        vrows = {r.conductor: r for r in summarize(val_eps[name])}
        s0, m0 = initial_states([e for e in val_eps[name] if e.conductor.name == best_fixed[name]], encoders[name])
        for pol, folder in val_policies[name]:
            fcfg = FQEConfig(n_steps=cfg.fqe_steps, features=cfg.features, seed=cfg.run.seed)
            estimate = fqe_estimate(out / "fqe" / name / f"{pol}.json", folder, sessions[name].team.env,
                                    encoders[name], datasets[name], fcfg, (s0, m0))  # fmt: skip
            m = vrows[pol]
            fqe_rows.append(FQERow(name, pol, estimate, m.mean_return, m.return_ci_low, m.return_ci_high))
        mine = [f for f in fqe_rows if f.team == name]
        if len(mine) >= 2:
            selection[name] = stats.fqe_selection([f.fqe_estimate for f in mine], [f.measured_return for f in mine])
            sel = selection[name]
            print(f"  {name}: Spearman {sel.spearman:+.2f} over {sel.n_policies} policies, regret {sel.regret:.3f}")
    write_table(out / "fqe.csv", fqe_rows, FQERow.__dataclass_fields__)

    _stage(
        6,
        n,
        f"test, once: the menu, random and the released learners × {len(cfg.seeds)} seeds on {cfg.eval_episodes} tasks",
    )
    test_eps: list[Episode] = []
    ledger = out / "test_ledger.jsonl"
    learners: dict[str, dict[str, list[str]]] = {}  # team -> algo -> labels per seed
    for name, session in sessions.items():
        team = specs[name]
        team_file = session.team.path.read_bytes()
        menu_path = out / "test" / name / "menu.jsonl"
        n_test = min(cfg.eval_episodes, cfg.test_caps.get(name, cfg.eval_episodes))
        ledger_entry(ledger, {"team": name, "conductors": [*menus[name], "random"], "tasks": n_test,
                              "team_file_sha256": hashlib.sha256(team_file).hexdigest()})  # fmt: skip
        test_eps += play(cfg, team, [*menus[name], "random"], "test", n_test, menu_path, session)
        learners[name] = {}
        for algo, label in released[name].items():
            learners[name][algo] = []
            for seed in cfg.seeds:
                folder = out / "models" / name / label / f"s{seed}"
                if seed != cfg.seeds[0]:
                    oc = dataclasses.replace(configs[label], seed=seed, keep_epochs=False)
                    train_offline(datasets[name], oc, folder, resume="if_same")
                lab = f"{algo}-s{seed}"
                path = out / "test" / name / f"{lab}.jsonl"
                drop_stale_evaluation(path, folder)
                ledger_entry(ledger, {"team": name, "conductor": lab, "config": label, "tasks": n_test,
                                      "model_sha256": model_digest(folder)})  # fmt: skip
                test_eps += play(cfg, team, [f"{lab}:{folder}"], "test", n_test, path, session)
                learners[name][algo].append(lab)

    _stage(7, n, "report: oracle router, headroom, paired tests, LLM-required subset, cost–quality plane")
    rows = summarize(test_eps)
    fam_of = {r.team: r.family for r in rows}
    baselines = {(fam_of[name], name): best_fixed[name] for name in sessions}
    paired = paired_comparison(test_eps, rows, baselines=baselines)
    report_dir = out / "report"
    paths = write_report(rows, report_dir, "Phase 1 (test split)", paired, mode_collapse(test_eps))
    head_rows: list[HeadroomRow] = []
    panels: dict[str, list[tuple[str, float, float, str]]] = {}
    subset_lines: list[str] = []
    power_lines: list[str] = []
    for name in sessions:
        eps = [e for e in test_eps if e.team.name == name]
        by = _by_task(eps)
        menu = [m for m in menus[name] if m in by]
        tasks = sorted(set.intersection(*(set(by[m]) for m in menu)))
        outcomes = {m: {t: (by[m][t].success, float(by[m][t].total_tokens))
                        for t in tasks} for m in menu}  # fmt: skip
        oracle = stats.oracle_router(outcomes)
        o_succ = float(np.mean([c.success for c in oracle.values()])) if oracle else float("nan")
        o_cost = float(np.mean([c.cost for c in oracle.values()])) if oracle else float("nan")
        team_rows = {r.conductor: r for r in rows if r.team == name}
        bf = team_rows[best_fixed[name]]
        bt = _best(list(team_rows.values()), menu)
        panels[fam_of[name]] = [(m, team_rows[m].mean_tokens, team_rows[m].success_rate, "rule") for m in menu]
        panels[fam_of[name]].append(("oracle", o_cost, o_succ, "oracle"))
        if "random" in team_rows:
            panels[fam_of[name]].append(
                ("random", team_rows["random"].mean_tokens, team_rows["random"].success_rate, "other")
            )
        for algo, labs in learners[name].items():
            succ = [team_rows[lab].success_rate for lab in labs]
            cap = [stats.captured_fraction(s, bf.success_rate, o_succ) for s in succ]
            sm, ss = stats.mean_sd(succ)
            cm, cs = stats.mean_sd(cap)
            head_rows.append(HeadroomRow(name, len(tasks), bf.conductor, bf.success_rate, bt.conductor, bt.success_rate,
                                         o_succ, stats.headroom(o_succ, bf.success_rate), f"{algo} ({released[name][algo]})",
                                         sm, ss, cm, cs, len(labs), o_cost))  # fmt: skip
            panels[fam_of[name]].append(
                (algo, float(np.mean([team_rows[lab].mean_tokens for lab in labs])), sm, "learned")
            )
            for lab in labs:
                common = [t for t in tasks if t in by[lab]]
                disc = (
                    float(np.mean([by[lab][t].success != by[bf.conductor][t].success for t in common]))
                    if common
                    else 0.0
                )
                power_lines.append(
                    f"| {name} | {lab} | {len(common)} | {100 * disc:.1f}% | "
                    f"{100 * stats.noninferiority_power(len(common), max(disc, 0.05)):.0f}% | "
                    f"{stats.tasks_for_noninferiority(max(disc, 0.05))} |"
                )
        hard = [t for t in tasks if not any(by[m][t].success for m in ("tool_only", "single_shot") if m in by)]
        subset_lines.append(f"| {name} | oracle | {len(hard)} | "
                            f"{100 * float(np.mean([oracle[t].success for t in hard])) if hard else float('nan'):.1f}% |")  # fmt: skip
        names = [*menu, *(lab for labs in learners[name].values() for lab in labs)]
        subset_lines.append(subset_table_md(name, names, by, hard))
    plot_cost_quality(panels, report_dir / "cost_quality.png", "Phase 1")
    paths["cost_quality"] = report_dir / "cost_quality.png"
    write_table(report_dir / "headroom.csv", head_rows, HeadroomRow.__dataclass_fields__)

    rules: dict[str, str] = {}
    for name in sessions:
        ds = datasets[name]
        for algo, label in released[name].items():
            c = trained[(name, label)]
            labels = c.predict(ds.observations, ds.masks)
            res_d = distill(labels, ds.observations, ds.masks, ds.feature_names, ds.action_labels,
                            DistillConfig(max_depth=cfg.distill_depth, seed=cfg.run.seed), episode_index=ds.episode_index)  # fmt: skip
            res_d.save(out / "distill" / name / algo)
            rules[f"{name}/{algo}"] = (
                f"fidelity {res_d.fidelity_heldout:.3f} on held-out states "
                f"({res_d.n_heldout}), {res_d.fidelity_train:.3f} on training states\n{res_d.rules}"
            )

    n_ledger = len([ln for ln in ledger.read_text(encoding="utf-8").splitlines() if ln.strip()])
    caveats = not_shown(head_rows, paired, cfg.seeds, cfg.run.seed)
    summary = [
        "# Phase 1: learned conductors vs a menu of fixed schedules",
        "",
        f"Tasks per family: train {cfg.train_episodes} per source conductor, validation {cfg.validation_episodes}, "
        f"test {cfg.eval_episodes}; training seeds {', '.join(map(str, cfg.seeds))}; run seed {cfg.run.seed}."
        + (f" Produced by `{command}`." if command else ""),
        "",
        "The menu is every rule of a team's file; the best fixed schedule and every learner's hyperparameters are "
        "chosen on validation; the test split is evaluated once per released configuration "
        f"(`test_ledger.jsonl`: {n_ledger} entries).",
        "",
        "## Headroom: the oracle router over the menu, and what each learner captures",
        "",
        "Oracle: per test task, the best schedule of the menu in hindsight (a success if any schedule succeeds; "
        "the cheapest such). Headroom = oracle − best fixed schedule; captured = (learner − best fixed) / headroom, "
        "per seed, then mean ± sd. 'best rule on test' shows the selection effect a test-set choice would hide.",
        "",
        headroom_table_md(head_rows),
        "",
        "## Results on the test split (success: 95% Wilson interval; return, turns, tokens: 95% bootstrap)",
        "",
        format_table(rows),
        "",
        "## Paired against the best fixed schedule (chosen on validation)",
        "",
        PAIRED_LEGEND,
        "",
        format_paired_table(paired),
        "",
        "## The LLM-required subset: test tasks neither `tool_only` nor `single_shot` solves",
        "",
        "| team | conductor | tasks | success |",
        "|---|---|---:|---:|",
        *[ln for ln in subset_lines if ln],
        "",
        "## Power of the non-inferiority test at this sample size",
        "",
        "Discordance: share of test tasks where the learner and the best fixed schedule differ in success. Power: "
        "of the one-sided test at a −5-point margin, α = 0.05, if the true difference were 0 at that discordance, "
        "floored at 5% (statsmodels TTestPower; before Holm); tasks for 80%: the sample that would give 80% power there.",
        "",
        "| team | learner | tasks | discordance | power | tasks for 80% |",
        "|---|---|---:|---:|---:|---:|",
        *power_lines,
        "",
        "## FQE as a model-selection tool (validation split)",
        "",
        "Every learner checkpoint (mid-training and final, seed "
        f"{cfg.seeds[0]}): FQE from the training logs evaluated at the validation tasks' initial states, against "
        "the return measured on those same tasks.",
        "",
        fqe_table_md(fqe_rows, selection),
        "",
        "## What these numbers do not show",
        "",
        *caveats,
        "",
        "## Mode collapse: how varied each conductor's action sequences are (test)",
        "",
        format_collapse_table(mode_collapse(test_eps)),
        "",
        "## Distilled rules of the released learners (seed " + str(cfg.seeds[0]) + ")",
        "",
    ]
    for k, v in rules.items():
        summary += [f"### {k}", "", "```", v.rstrip(), "```", ""]
    elapsed = time.perf_counter() - t0
    summary.append(f"Run time: {elapsed:.0f} s on this machine.")
    md = out / "summary.md"
    md.write_text("\n".join(summary) + "\n", encoding="utf-8")
    paths = {**paths, "summary": md, "fqe": out / "fqe.csv", "ledger": ledger, "headroom": report_dir / "headroom.csv"}
    print()
    print("\n".join(summary))
    print(f"\nfinished in {elapsed:.0f} s; summary: {md}")
    return Phase1Result(rows, head_rows, fqe_rows, rules, paths)


@dataclass(frozen=True)
class ReproduceConfig:
    """``orchestra reproduce conductor``: phase 1 at the scale the README's Results section quotes."""

    phase1: Phase1Config = field(default_factory=Phase1Config.reproduce)  # the full-scale run
    out: str = "runs/reproduce-conductor"  # run directory (a rerun continues it)
    report: str | None = None  # also copy the summary (markdown) here, e.g. docs/results/conductor.md


def reproduce(cfg: ReproduceConfig) -> Phase1Result:
    res = run_phase1(cfg.phase1, Path(cfg.out), command=f"orchestra reproduce conductor --seed {cfg.phase1.run.seed}")
    if cfg.report:
        report = Path(cfg.report)
        report.parent.mkdir(parents=True, exist_ok=True)
        text = res.paths["summary"].read_text(encoding="utf-8")
        plot = res.paths.get("cost_quality")
        if plot is not None and plot.exists():  # the cost–quality plane beside the copy, linked from it
            beside = report.with_name(f"{report.stem}_cost_quality.png")
            shutil.copyfile(plot, beside)
            text = text.rstrip("\n") + (
                "\n\n## The cost–quality plane\n\nMean tokens per task against test success, per family: the menu, "
                f"its hull, the oracle and the learners.\n\n![cost–quality plane]({beside.name})\n"
            )
        report.write_text(text, encoding="utf-8")
    return res


__all__ = [
    "drop_stale_evaluation",
    "ledger_entry",
    "model_digest",
    "Phase1Config",
    "Phase1Result",
    "ReproduceConfig",
    "reproduce",
    "run_phase1",
]
