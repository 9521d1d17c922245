"""Choosing the real-LLM experiment's learning rate, one protocol for every scheme (``orchestra experiment llm-tune``).

The protocol: every scheme of the comparison runs the same validation experiment (:func:`tuning_base`: the
experiment's team and trainer, ``validation`` tasks, the same run seeds, the same number of stages) once per learning
rate of one grid, so every scheme gets the same budget (equal sampled episodes: the one-batch schemes run n× the
stages, as in the experiment's equal-episodes accounting) and the same number of tries. Per scheme, the learning rate
with the highest mean held-out validation success at its equal-episodes stage is chosen; a tie goes to the smaller
learning rate (the smaller step is the one that changes the team less). The trust region's δ, the epochs and the
minibatches are the experiment's and are not tuned (the grid would triple).

Writes ``OUT/lr-{lr}/`` (each one an ``orchestra experiment llm`` run directory, resumable), ``OUT/tuning.csv`` (per
scheme and learning rate: validation success, and what the mechanism did: steps per update, the share of updates in
which the trust region acted, KL / δ, the clip fraction during the steps), ``OUT/selection.json`` (the rule, the
choice and the ``--lr-by-scheme`` flags that run the experiment with it) and ``OUT/summary.md``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from orchestra.experiments.harness import ExperimentResult, Say, cell, finish, open_run_dir, read_rows, stderr_say
from orchestra.experiments.llm.config import FROZEN, LLM_EXPERIMENT_TRAINER, TUNING_DELTA, LLMExperimentConfig
from trajectories.rundir import CONFIG_FILE

SELECTION_RULE = (
    "per scheme, the learning rate with the highest mean validation success at the scheme's equal-episodes stage; "
    "ties to the smaller learning rate"
)


def tuning_base() -> LLMExperimentConfig:
    """The validation experiment every learning rate runs: teamtr, naive and stale_indep, 1 seed, 2 stages (the
    one-batch naive runs 4: equal episodes), 60 validation tasks, the experiment's team and trainer otherwise, at the
    δ the published grid ran at (:data:`~orchestra.experiments.llm.config.TUNING_DELTA`)."""
    return LLMExperimentConfig(
        trainer=replace(LLM_EXPERIMENT_TRAINER, num_stages=2, delta=TUNING_DELTA),
        schemes=("teamtr", "naive", "stale_indep"),
        seeds=1,
        eval_tasks=60,
        eval_split="validation",
        equal_updates_control=False,
        lr_by_scheme=(),  # the grid sets every scheme's learning rate
    )


@dataclass(frozen=True)
class LLMTuneConfig:
    """Every knob of ``orchestra experiment llm-tune``."""

    experiment: LLMExperimentConfig = field(default_factory=tuning_base)  # the validation run of every learning rate
    lrs: tuple[float, ...] = (1e-4, 3e-4, 1e-3)  # the learning-rate grid every scheme is tried on

    def __post_init__(self) -> None:
        if self.experiment.eval_split != "validation":
            raise ValueError("experiment.eval_split: tuning plays the validation split only, got test")
        if self.experiment.lr_by_scheme:
            raise ValueError("experiment.lr_by_scheme: tuning sets the learning rate itself; leave it empty")
        if not self.lrs or len(set(self.lrs)) != len(self.lrs) or not all(lr > 0 for lr in self.lrs):
            raise ValueError(f"lrs: expected distinct positive learning rates, got {list(self.lrs)}")

    @classmethod
    def smoke(cls, **overrides: Any) -> LLMTuneConfig:
        """A tiny preset for tests: the experiment's smoke preset (random-init tiny model, teamtr vs naive) on
        validation, two learning rates. Its figures mean nothing."""
        base = replace(LLMExperimentConfig.smoke(), eval_split="validation", eval_every=0, equal_updates_control=False)
        return replace(cls(experiment=base, lrs=(1e-2, 3e-2)), **overrides)

    def run_config(self, lr: float) -> LLMExperimentConfig:
        """The validation experiment at learning rate ``lr``."""
        return replace(self.experiment, trainer=replace(self.experiment.trainer, lr=lr))


def lr_dir(lr: float) -> str:
    """The run directory of one learning rate: ``lr-1e-4``."""
    return "lr-" + f"{lr:.0e}".replace("e-0", "e-").replace("e+0", "e+")


def _score(cfg: LLMExperimentConfig, evals: list[dict[str, Any]], scheme: str) -> tuple[float, int]:
    """Mean validation success of ``scheme`` at its equal-episodes stage (the frozen team: stage 0) over seeds and tasks, and the rows read
    (NaN, 0 until every seed has every task)."""
    stage = 0 if scheme == FROZEN else cfg.episode_stage(scheme)
    got = [r["success"] for r in evals if r["scheme"] == scheme and r["stage"] == stage]
    if len(got) < cfg.seeds * cfg.eval_tasks:
        return math.nan, len(got)
    return sum(got) / len(got), len(got)


def choose(table: list[dict[str, Any]], schemes: tuple[str, ...]) -> dict[str, float]:
    """:data:`SELECTION_RULE` applied to ``tuning.csv`` rows; a scheme missing a score for any learning rate gets
    no choice."""
    out: dict[str, float] = {}
    for scheme in schemes:
        rows = [r for r in table if r["scheme"] == scheme]
        if not rows or any(math.isnan(r["val_success"]) for r in rows):
            continue
        best = max(rows, key=lambda r: (r["val_success"], -r["lr"]))
        out[scheme] = best["lr"]
    return out


def run_llm_tuning(
    cfg: LLMTuneConfig, out_dir: str | Path, *, say: Say | None = None, play: bool = True
) -> ExperimentResult:
    """Run the validation experiment per learning rate (resuming what is there), then tabulate and choose.

    Raises:
        ConfigMismatchError: ``out_dir`` holds the ``config.json`` of another tuning config.
    """
    from orchestra.experiments.llm.run import EVAL_COLUMNS, run_llm_experiment

    talk = say or stderr_say(True)
    out, _ = open_run_dir(out_dir, cfg)
    table: list[dict[str, Any]] = []
    frozen = math.nan  # the untrained team's validation success (the same in every learning rate's run)
    for lr in cfg.lrs:
        run_cfg, sub = cfg.run_config(lr), out / lr_dir(lr)
        if play or (sub / CONFIG_FILE).exists():
            talk(f"llm-tune: lr {lr:g}")
            run_llm_experiment(run_cfg, sub, say=talk, play=play)
        evals = read_rows(sub / "evals.csv", EVAL_COLUMNS) if (sub / "evals.csv").exists() else []
        mech_path = sub / "mechanism.csv"
        mech = {r["scheme"]: r for r in read_rows(mech_path, MECHANISM_COLUMNS)} if mech_path.exists() else {}
        if math.isnan(frozen):
            frozen, _ = _score(run_cfg, evals, FROZEN)
        for scheme in run_cfg.schemes:
            score, n = _score(run_cfg, evals, scheme)
            m = mech.get(scheme, {})
            table.append(
                dict(
                    scheme=scheme,
                    lr=lr,
                    stage=run_cfg.episode_stage(scheme),
                    val_success=score,
                    val_rows=n,
                    **{k: m.get(k, math.nan) for k in MECHANISM_COLUMNS if k != "scheme"},
                )
            )
    chosen = choose(table, cfg.experiment.schemes)
    for r in table:
        r["chosen"] = chosen.get(r["scheme"]) == r["lr"]
    flags = [f"{s}={lr:g}" for s, lr in chosen.items()]
    selection = dict(rule=SELECTION_RULE, lr_by_scheme=flags, flag="--lr-by-scheme " + " ".join(flags))
    (out / "selection.json").write_text(json.dumps(selection, indent=2) + "\n")
    return finish(out, {"tuning": table}, {"summary": _summary(cfg, table, chosen, frozen)}, nan="nan")


def publish_tuning_tables(cfg: LLMTuneConfig, out_dir: str | Path, dest: str | Path) -> Path:
    """Copy the tuning's tables out of ``out_dir`` into ``dest`` without checkpoints (its ``config.json`` and each
    learning rate's run tables: :func:`~orchestra.experiments.llm.run.publish_tables`), so that ``orchestra
    experiment llm-tune --report-only --out DEST`` writes the same table and choice on a fresh clone."""
    import shutil

    from orchestra.experiments.llm.run import publish_tables

    src, dst = Path(out_dir), Path(dest)
    dst.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src / CONFIG_FILE, dst / CONFIG_FILE)
    for lr in cfg.lrs:
        if (src / lr_dir(lr) / CONFIG_FILE).exists():
            publish_tables(src / lr_dir(lr), dst / lr_dir(lr))
    return dst


MECHANISM_COLUMNS = {
    "scheme": str,
    "agent_updates": int,
    "steps_per_update": float,
    "acted_share": float,
    "kl_over_delta": float,
    "step_clip_fraction": float,
}


def _summary(cfg: LLMTuneConfig, table: list[dict[str, Any]], chosen: dict[str, float], frozen: float) -> list[str]:
    e = cfg.experiment
    t = e.trainer
    lines = [
        "# Choosing the real-LLM experiment's learning rate: one protocol for every scheme",
        "",
        f"Every scheme ({', '.join(e.schemes)}) ran the same validation experiment once per learning rate "
        f"({', '.join(f'{lr:g}' for lr in cfg.lrs)}): {e.seeds} seed(s), {t.num_stages} stages at equal stages "
        f"(the one-batch schemes run {e.n_agents}× that: equal sampled episodes), batches of {t.batch_size} "
        f"episodes, {t.num_epochs} epoch(s) × {t.num_minibatches} minibatch(es), trust region {t.trust_region} with "
        f"δ = {t.delta}; held out: {e.eval_tasks} `{e.eval_split}` tasks, the same for every run.",
        "",
        f"Rule, fixed before the runs: {SELECTION_RULE}. δ, epochs and minibatches are not tuned.",
        "",
        "The untrained (frozen) team's validation success, the reference every score below is read against: "
        + ("—" if math.isnan(frozen) else f"{frozen:.1%}")
        + ".",
        "",
        "| scheme | lr | stage | validation success | steps / update | trust region acted | KL / δ | "
        "clip during steps | chosen |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in table:
        success = "—" if math.isnan(r["val_success"]) else f"{r['val_success']:.1%}"
        acted = "—" if math.isnan(r["acted_share"]) else f"{r['acted_share']:.0%}"
        lines.append(
            f"| {r['scheme']} | {r['lr']:g} | {r['stage']} | {success} | {cell(r['steps_per_update'], 2)} | "
            f"{acted} | {cell(r['kl_over_delta'], 2)} | {cell(r['step_clip_fraction'], 4)} | "
            f"{'yes' if r['chosen'] else ''} |"
        )
    n = e.seeds * e.eval_tasks
    lines += [
        "",
        "Chosen: " + (", ".join(f"{s} lr {lr:g}" for s, lr in chosen.items()) or "nothing yet (runs missing)") + ".",
        "",
        f"What this does not show: each validation score is {n} task outcomes of {e.seeds} seed(s) (a binomial "
        f"standard error of about {100 * math.sqrt(0.25 / n):.0f} points at 50%), so learning rates whose scores "
        "differ by a few points are not told apart; the rule picks one anyway, the same way for every scheme.",
        "",
    ]
    blank = [
        f"{r['scheme']} at {r['lr']:g}"
        for r in table
        if math.isnan(r["acted_share"]) and not math.isnan(r["val_success"])
    ]
    if blank:
        lines += [
            "The mechanism columns are blank for "
            + ("every run" if len(blank) == len(table) else ", ".join(blank))
            + ": those runs' per-update tables "
            "(`runs/{scheme}-seed{s}/updates.csv`) are not in this directory (a grid published before they were "
            "shipped with it keeps only its evaluations); re-running the grid restores them.",
            "",
        ]
    picked = [r for r in table if r["chosen"] and not math.isnan(r["acted_share"])]
    if picked:
        idle = [r["scheme"] for r in picked if r["acted_share"] == 0]
        lines += [
            "At the chosen learning rates the trust region acted in "
            + ", ".join(f"{r['acted_share']:.0%} of {r['scheme']}'s {r['agent_updates']}" for r in picked)
            + " agent-updates"
            + (
                f"; for {', '.join(idle)} it never did, so this grid's choice is a setting in which the mechanism "
                "under test may rarely act: the comparison's report measures it again over every run "
                '("What the update mechanism did").'
                if idle
                else "."
            ),
            "",
        ]
    return lines


__all__ = [
    "SELECTION_RULE",
    "LLMTuneConfig",
    "choose",
    "lr_dir",
    "publish_tuning_tables",
    "run_llm_tuning",
    "tuning_base",
]
