"""Running the real-LLM fine-tuning experiment: every (scheme, seed) run, its held-out evaluations in ``evals.csv``,
resume, then the tables, plots and ``summary.md``.

Per (scheme, run seed) an :class:`~orchestra.teamtr.llm.LLMTeam` is built from that seed's config (its LoRA init
seeded by it, so every scheme of a seed starts from the same initial adapters) and trains with the same trainer seed,
so the schemes are PAIRED. The runs go scheme by scheme, every seed of one before the next. A run is
trained by :func:`orchestra.teamtr.trainer.train` into its own run directory (``runs/{scheme}-seed{s}/``: resolved
config, per-update and per-stage metrics, stage checkpoints) up to each evaluation stage in turn; the team is then
played, greedily by default, on the same held-out tasks with the same episode seeds, one ``evals.csv`` row per task.

Stage 0 of every scheme is the frozen team (the LoRA adapters start at B = 0: the base exactly). With greedy
evaluation (``eval_temperature`` 0) it is the same for every seed, so it is played once and its rows are reused for
every seed; with sampled evaluation it is played per seed.

Resume: a directory holding the same ``config.json`` keeps every complete evaluation of ``evals.csv`` and continues
each run from its latest checkpoint (bit-identically: :func:`~orchestra.teamtr.trainer.train`'s resume); the rows
file is the harness's (:class:`~orchestra.experiments.harness.RowLog`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from orchestra.experiments.harness import ExperimentResult, RowLog, Say, finish, stderr_say
from orchestra.experiments.llm.config import FROZEN, LLMExperimentConfig
from orchestra.teamtr.config import derive_seed
from trajectories.rundir import CONFIG_FILE, check_config, read_config, write_config

if TYPE_CHECKING:
    from orchestra.teamtr.llm_config import LLMTeamConfig

# the columns of evals.csv (one row per evaluation and held-out task) and how each is read back
EVAL_COLUMNS: dict[str, Callable[[str], Any]] = {
    "scheme": str,
    "seed": int,
    "stage": int,
    "episodes": int,
    "tokens": int,
    "train_seconds": float,
    "task": int,
    "difficulty": int,
    "success": float,
    "return": float,
    "eval_tokens": int,
}
EVAL_FIELDS = tuple(EVAL_COLUMNS)

Evaluation = tuple[str, int, int]  # (scheme, seed, stage)


# ----------------------------------------------------------------------------------------------------------------
# files


def _evaluation(row: dict[str, Any]) -> Evaluation:
    return row["scheme"], row["seed"], row["stage"]


def complete_evaluations(rows: Sequence[dict[str, Any]], n_tasks: int) -> set[tuple[str, int, int]]:
    """(scheme, seed, stage) keys holding one row for each of the ``n_tasks`` tasks."""
    tasks: dict[tuple[str, int, int], set[int]] = {}
    for r in rows:
        tasks.setdefault((r["scheme"], r["seed"], r["stage"]), set()).add(r["task"])
    return {k for k, t in tasks.items() if t == set(range(n_tasks))}


def expected_evaluations(cfg: LLMExperimentConfig) -> list[tuple[str, int, int]]:
    """Every (scheme, seed, stage) evaluation of a complete run, in the order the run plays them."""
    frozen = [(FROZEN, seed, 0) for seed in range(cfg.seeds)]
    return frozen + [(s, seed, k) for s in cfg.schemes for seed in range(cfg.seeds) for k in cfg.eval_stages(s)[1:]]


# ----------------------------------------------------------------------------------------------------------------
# one evaluation


class HeldOut(Protocol):
    """What the held-out evaluation reads from an experiment's config (:class:`LLMExperimentConfig`, and the LLM
    freshness experiment's): the team, how many tasks of which split, and the root seed they derive from."""

    @property
    def team(self) -> LLMTeamConfig: ...
    @property
    def eval_tasks(self) -> int: ...
    @property
    def eval_split(self) -> Literal["validation", "test"]: ...
    @property
    def seed(self) -> int: ...


def held_out_tasks(cfg: HeldOut) -> list[Any]:
    """The held-out tasks of every evaluation: ``eval_tasks`` tasks of ``eval_split`` (the team's family and
    difficulty), from the root seed only."""
    from orchestra.teamtr.llm import _load_team

    _, family = _load_team(cfg.team)
    return family.generate(cfg.eval_split, cfg.eval_tasks, derive_seed(cfg.seed, 7, bits=31), cfg.team.difficulty)


def evaluate(team: Any, tasks: Sequence[Any], cfg: HeldOut) -> list[dict[str, Any]]:
    """Play ``tasks`` with the team's held-out workers (``eval_temperature``); one row per task (success, return,
    the trainable workers' tokens)."""
    from orchestra.runtime.rollout import EpisodeJob, episode_seed

    seed = derive_seed(cfg.seed, 8, bits=31)
    jobs = [EpisodeJob(f"heldout-{i:05d}", replace(t), episode_seed(seed, i)) for i, t in enumerate(tasks)]
    order = {j.episode_id: i for i, j in enumerate(jobs)}
    rows: list[dict[str, Any]] = [{} for _ in jobs]
    for ep in team.eval_engine.run(jobs):
        i = order[ep.episode_id]
        tokens = sum(int(v) for w, v in (ep.usage.get("tokens") or {}).items() if w in cfg.team.workers)
        rows[i] = dict(
            task=i,
            difficulty=int(tasks[i].difficulty or 0),
            success=float(ep.success),
            **{"return": float(ep.return_)},
            eval_tokens=tokens,
        )
    return rows


# ----------------------------------------------------------------------------------------------------------------
# the experiment


def check_stored_config(path: Path, cfg: LLMExperimentConfig) -> None:
    """Refuse to continue an experiment under another config, with one exception: ``schemes`` may be extended at the
    end (a control added to a finished comparison). The runs already in were made under the same settings, and the
    runs go scheme by scheme, so every earlier evaluation stays valid; the Holm families then hold more comparisons.

    Raises:
        ConfigMismatchError: naming every field that differs (saved → current).
    """
    saved = read_config(path)
    hint = f"use another output directory (schemes may only be appended to {' '.join(saved.get('schemes') or [])})"
    check_config(path, cfg, saved=saved, may_extend=["schemes"], hint=hint)


def run_llm_experiment(
    cfg: LLMExperimentConfig,
    out_dir: str | Path,
    *,
    say: Say | None = None,
    tensorboard: bool = False,
    play: bool = True,
) -> ExperimentResult:
    """Run every (scheme, seed), evaluate each at its evaluation stages, write the tables, plots and
    ``summary.md`` into ``out_dir`` (``tensorboard``: each run's update and stage metrics also as event files in
    ``runs/SCHEME-seedS/tensorboard/``). ``play=False`` trains and plays nothing: the report of the evaluations
    already in ``out_dir``, marked interim when some are missing.

    Raises:
        ConfigMismatchError: ``out_dir`` holds a ``config.json`` of a different config (appending schemes is allowed:
            :func:`check_stored_config`).
    """
    from orchestra.experiments.llm.analysis import analyse, complete_seeds
    from orchestra.experiments.llm.report import plot, summary_sections
    from orchestra.teamtr.llm import LLMTeam
    from orchestra.teamtr.trainer import train

    talk = say or stderr_say(True)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    config_path, evals_path = out / CONFIG_FILE, out / "evals.csv"
    if config_path.exists():
        check_stored_config(config_path, cfg)
    write_config(out, cfg)
    evals = RowLog(
        evals_path, EVAL_COLUMNS, _evaluation, lambda got: complete_evaluations(got, cfg.eval_tasks), nan="nan"
    )
    rows, done = evals.rows, evals.done
    tasks = held_out_tasks(cfg)
    greedy = cfg.team.eval_temperature == 0

    def record(scheme: str, seed: int, stage: int, played: list[dict[str, Any]], log: Any) -> None:
        st = log.stages[stage - 1] if stage else {}
        extra = dict(
            scheme=scheme,
            seed=seed,
            stage=stage,
            episodes=int(st.get("rollout/episodes", 0)),
            tokens=int(st.get("rollout/tokens", 0)),
            train_seconds=float(st.get("perf/wall_seconds", 0.0)),
        )
        evals.add((scheme, seed, stage), [{**extra, **r} for r in played])
        mean = sum(r["success"] for r in played) / len(played)
        talk(f"llm {scheme} seed {seed} stage {stage}: held-out success {mean:.1%} ({len(played)} tasks)")

    # Seed-major: the frozen team first, then seed 0 of every scheme, seed 1 of every scheme, and so on, so an
    # experiment that spans several sessions holds, at every stop, complete seed-paired comparisons of every scheme
    # over the seeds it reached. A team is built per (scheme, seed) from that seed's config, so its initial adapters
    # are the same whichever scheme it serves (and the order of the runs changes no result).
    frozen_rows = sorted({r["seed"] for r in rows if r["scheme"] == FROZEN})
    for seed in range(cfg.seeds if play else 0):
        if (FROZEN, seed, 0) in done:
            continue
        source = (
            [r for r in rows if r["scheme"] == FROZEN and r["seed"] == frozen_rows[0]] if greedy and frozen_rows else []
        )
        if source:
            played = [{k: r[k] for k in EVAL_FIELDS[6:]} for r in source]
        else:
            played = evaluate(LLMTeam(cfg.team_config(seed), log=talk), tasks, cfg)
            frozen_rows = frozen_rows or [seed]
        record(FROZEN, seed, 0, played, None)
    for seed in range(cfg.seeds if play else 0):
        for scheme in cfg.schemes:
            stages = [k for k in cfg.eval_stages(scheme)[1:] if (scheme, seed, k) not in done]
            if not stages:
                continue
            team = LLMTeam(cfg.team_config(seed), log=talk)
            run_dir = out / "runs" / f"{scheme}-seed{seed}"
            t_run = time.perf_counter()
            for stage in stages:
                log = train(
                    team, cfg.trainer_config(scheme, seed, stage), out_dir=run_dir, resume=True, tensorboard=tensorboard
                )
                if len(log.stages) != stage:
                    raise RuntimeError(
                        f"{run_dir}: its checkpoint is past stage {stage} but evals.csv lacks that evaluation; "
                        "delete the run directory to re-run it"
                    )
                record(scheme, seed, stage, evaluate(team, tasks, cfg), log)
            talk(f"llm {scheme} seed {seed}: done in {time.perf_counter() - t_run:.0f} s")
            del team
    expected = expected_evaluations(cfg)
    missing = [key for key in expected if key not in done]
    # an interim report reads the seeds every scheme has completed (or, before seed 0 is complete, all of them,
    # where only the frozen team's comparisons can be whole)
    read = (complete_seeds(expected, done) or cfg.seeds) if missing else cfg.seeds
    tables = analyse(cfg, rows, out / "runs", seeds=read)
    plot(cfg, [r for r in rows if r["seed"] < read], tables, out)
    sections = summary_sections(
        cfg, tables, time.perf_counter() - t0 if play else None, missing=missing, seeds_read=read
    )
    return finish(out, tables, sections, nan="nan")


# what a run directory keeps besides its checkpoints: enough for ``--report-only`` to write the whole report
RUN_TABLES = ("config.json", "updates.csv", "stages.csv")


def publish_tables(out_dir: str | Path, dest: str | Path, cfg: LLMExperimentConfig | None = None) -> Path:
    """Copy the experiment's tables out of ``out_dir`` into ``dest`` without the checkpoints: ``config.json``,
    ``evals.csv`` and each run's :data:`RUN_TABLES`, so that ``orchestra experiment llm --report-only --out DEST``
    writes the same report on a fresh clone (the tables ship in git; the checkpoints, hundreds of MB, do not). With
    ``cfg``, only the runs whose every evaluation is in (:func:`complete_runs`): a run still training is left out
    (and one an earlier publish left is removed), so what is committed does not change under a run in progress."""
    import shutil

    from orchestra.experiments.harness import read_rows

    src, dst = Path(out_dir), Path(dest)
    dst.mkdir(parents=True, exist_ok=True)
    for name in (CONFIG_FILE, "evals.csv"):
        shutil.copyfile(src / name, dst / name)
    keep = None if cfg is None else complete_runs(cfg, read_rows(src / "evals.csv", EVAL_COLUMNS))
    for run in sorted(p for p in (src / "runs").glob("*-seed*") if p.is_dir()):
        scheme, _, seed = run.name.rpartition("-seed")
        if keep is not None and (scheme, int(seed)) not in keep:
            shutil.rmtree(dst / "runs" / run.name, ignore_errors=True)
            continue
        (dst / "runs" / run.name).mkdir(parents=True, exist_ok=True)
        for name in RUN_TABLES:
            if (run / name).exists():
                shutil.copyfile(run / name, dst / "runs" / run.name / name)
    return dst


def complete_runs(cfg: LLMExperimentConfig, rows: Sequence[dict[str, Any]]) -> set[tuple[str, int]]:
    """The (scheme, seed) runs of ``cfg`` whose every evaluation is complete among ``rows`` (the frozen team's
    included, as ``(FROZEN, seed)``)."""
    done = complete_evaluations(rows, cfg.eval_tasks)
    by_run: dict[tuple[str, int], list[tuple[str, int, int]]] = {}
    for key in expected_evaluations(cfg):
        by_run.setdefault(key[:2], []).append(key)
    return {run for run, keys in by_run.items() if all(k in done for k in keys)}


def resume_from_tables(cfg: LLMExperimentConfig, tables: str | Path, out_dir: str | Path) -> list[tuple[str, int]]:
    """Start ``out_dir`` from tables that :func:`publish_tables` wrote on another machine (or in an earlier session
    whose checkpoints are gone): its ``config.json`` (checked against ``cfg``), the ``evals.csv`` rows of every
    COMPLETE (scheme, seed) run and those runs' :data:`RUN_TABLES`. A run cut short there is left out whole and runs
    again from its start here, so no run mixes two machines (a run is bit-identical only on one). Returns the runs
    carried over; does nothing (and returns ``[]``) when ``out_dir`` already holds an ``evals.csv``: it is the live
    run, ahead of any published copy.

    Raises:
        FileNotFoundError: ``tables`` lacks ``config.json`` or ``evals.csv``.
        ConfigMismatchError: ``tables`` holds another experiment's config (naming every field).
    """
    import csv
    import shutil

    from orchestra.experiments.harness import read_rows

    src, out = Path(tables), Path(out_dir)
    if (out / "evals.csv").exists():
        return []
    for name in (CONFIG_FILE, "evals.csv"):
        if not (src / name).exists():
            raise FileNotFoundError(f"{src / name}: missing; --resume-from wants a directory written by --tables")
    check_config(src / CONFIG_FILE, cfg, hint="resume from tables of this experiment's config")
    runs = complete_runs(cfg, read_rows(src / "evals.csv", EVAL_COLUMNS))
    out.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src / CONFIG_FILE, out / CONFIG_FILE)
    with open(src / "evals.csv", newline="") as f_in, open(out / "evals.csv", "w", newline="") as f_out:
        reader = csv.DictReader(f_in)
        writer = csv.DictWriter(f_out, fieldnames=list(reader.fieldnames or ()))  # as write_rows writes
        writer.writeheader()
        writer.writerows(r for r in reader if (r["scheme"], int(r["seed"])) in runs)
    for scheme, seed in sorted(runs):
        if scheme == FROZEN:
            continue
        run = f"{scheme}-seed{seed}"
        (out / "runs" / run).mkdir(parents=True, exist_ok=True)
        for name in RUN_TABLES:
            if (src / "runs" / run / name).exists():
                shutil.copyfile(src / "runs" / run / name, out / "runs" / run / name)
    return sorted(runs)


__all__ = [
    "EVAL_COLUMNS",
    "EVAL_FIELDS",
    "FROZEN",
    "HeldOut",
    "complete_evaluations",
    "complete_runs",
    "evaluate",
    "expected_evaluations",
    "held_out_tasks",
    "publish_tables",
    "resume_from_tables",
    "run_llm_experiment",
]
