"""The tables of the real-LLM fine-tuning experiment, from its per-task ``evals.csv`` rows (pure functions).

The unit of every paired comparison is the held-out *task*: every evaluation played the same tasks with the same
episode seeds. For scheme A against B (the frozen team, or another scheme) at one accounting, task t gives
d_t = mean over seeds of (x_A,s,t − x_B,s,t); the table reports mean(d), its two-sided 95% t interval
(statsmodels' ``DescrStatsW.tconfint_mean``) and the one-sample t-test p (scipy), Holm-adjusted across
the table's comparisons at that accounting (statsmodels). That interval is over tasks with the trained teams held
fixed: it says how sure we are of the effect of THESE trained adapters on the task distribution, not how a fresh
training seed would do, so the task-level tables are descriptive only. The verdicts are over seeds (a run is the
unit; :mod:`orchestra.experiments.verdicts`): ``seed_verdicts`` (the primary family teamtr − naive and
teamtr − stale_indep, Holm-corrected together across the accountings; the rest secondary), ``null_check`` and
``seed_iqm``, from each run's held-out success.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping, Sequence
from itertools import combinations
from pathlib import Path
from typing import Any

import numpy as np

from orchestra.experiments.harness import STILL_KL
from orchestra.experiments.llm.config import FROZEN, LLMExperimentConfig
from orchestra.experiments.verdicts import seed_tables
from orchestra.report import stats

ACCOUNTINGS = ("equal_stages", "equal_episodes", "equal_updates")
MEASURES = ("success", "return")


def accounting_stage(cfg: LLMExperimentConfig, scheme: str, accounting: str) -> int | None:
    """The stage a scheme is read at: ``num_stages`` (equal stages), :meth:`~LLMExperimentConfig.episode_stage`
    (equal sampled episodes: teamtr's episode count at ``num_stages``) or ``long_stages`` (the equal-updates control;
    None when it is off); 0 for the frozen team."""
    if accounting == "equal_updates" and cfg.long_stages is None:
        return None
    if scheme == FROZEN:
        return 0
    if accounting == "equal_stages":
        return cfg.num_stages
    return cfg.episode_stage(scheme) if accounting == "equal_episodes" else cfg.long_stages


def outcome_matrix(
    rows: Sequence[dict[str, Any]], scheme: str, stage: int, seeds: int, n_tasks: int, measure: str
) -> np.ndarray | None:
    """(seeds, tasks) outcomes of one (scheme, stage) evaluation; None unless every seed has every task."""
    m = np.full((seeds, n_tasks), math.nan)
    for r in rows:
        if r["scheme"] == scheme and r["stage"] == stage and r["seed"] < seeds:
            m[r["seed"], r["task"]] = r[measure]
    return None if np.isnan(m).any() else m


def paired_row(a: np.ndarray, b: np.ndarray) -> dict[str, Any]:
    """A against B from their (seeds, tasks) outcomes: the task-level interval and test (seed-averaged differences)
    and the seed-level view (module docstring)."""
    from scipy import stats as sps
    from statsmodels.stats.weightstats import DescrStatsW

    d_task = (a - b).mean(axis=0)
    mean = float(d_task.mean())
    lo, hi = (float(v) for v in DescrStatsW(d_task).tconfint_mean()) if np.ptp(d_task) > 0 else (mean, mean)
    # no spread (e.g. two teams that played every task alike): no test, nan (Holm leaves it out)
    p = float(sps.ttest_1samp(d_task, 0.0).pvalue) if d_task.size > 1 and np.ptp(d_task) > 0 else math.nan
    d_seed = (a - b).mean(axis=1)
    p_seeds = float(sps.ttest_1samp(d_seed, 0.0).pvalue) if d_seed.size > 1 and np.ptp(d_seed) > 0 else math.nan
    return dict(
        diff=mean,
        lo=lo,
        hi=hi,
        p=p,
        tasks=int(d_task.size),
        seeds=int(d_seed.size),
        per_seed=" ".join(f"{v:+.3f}" for v in d_seed),
        p_seeds=p_seeds,
        mdd=detectable(d_task),
        won=int((a > b).sum()),
        lost=int((a < b).sum()),
    )


def detectable(d_task: np.ndarray, power: float = 0.8, alpha: float = 0.05) -> float:
    """The smallest true mean difference the two-sided t-test over these tasks detects with ``power`` at ``alpha``
    (before Holm), taking the observed SD of the per-task differences as the true one (statsmodels'
    ``TTestPower``); nan without spread. What a null result at this sample size can and cannot rule out."""
    from statsmodels.stats.power import TTestPower

    if d_task.size < 2 or np.ptp(d_task) == 0:
        return math.nan
    effect = TTestPower().solve_power(nobs=d_task.size, alpha=alpha, power=power, alternative="two-sided")
    return float(effect) * float(d_task.std(ddof=1))


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm-adjusted p-values (statsmodels); nan entries stay nan and do not count as comparisons."""
    from statsmodels.stats.multitest import multipletests

    p = np.asarray(pvalues, dtype=np.float64)
    out = np.full(p.shape, math.nan)
    ok = np.isfinite(p)
    if ok.any():
        out[ok] = multipletests(p[ok], method="holm")[1]
    return [float(v) for v in out]


def _holm_in_place(table: list[dict[str, Any]], group: str) -> None:
    for key in sorted({r[group] for r in table}):
        sub = [r for r in table if r[group] == key]
        for r, h in zip(sub, holm([r["p"] for r in sub]), strict=True):
            r["p_holm"] = h


def training_curves(runs_dir: Path, cfg: LLMExperimentConfig, seeds: int | None = None) -> list[dict[str, Any]]:
    """Per (scheme, seed, update): the mean reward of the batch it trained on and the episodes sampled so far, from
    each run directory's ``updates.csv`` of the first ``seeds`` seeds (default all; missing runs are skipped)."""
    out: list[dict[str, Any]] = []
    for scheme in cfg.schemes:
        for seed in range(cfg.seeds if seeds is None else seeds):
            path = runs_dir / f"{scheme}-seed{seed}" / "updates.csv"
            if not path.exists():
                continue
            with path.open(newline="") as f:
                for r in csv.DictReader(f):
                    out.append(
                        dict(
                            scheme=scheme,
                            seed=seed,
                            stage=int(float(r["rollout/stage"])) + 1,
                            episodes=int(float(r["rollout/episodes"])),
                            tokens=int(float(r["rollout/tokens"])),
                            reward=float(r["rollout/reward_mean"]),
                            **update_mechanism(r, cfg.team.workers),
                        )
                    )
    return out


MECHANISM_FIELDS = ("agents", "steps", "acted", "still", "kl_over_delta", "step_clip")


def update_mechanism(record: Mapping[str, str], workers: Sequence[str]) -> dict[str, float]:
    """What the trust region and the clip did in one update (a row of a run's ``updates.csv``), summed over the
    agents it updated: ``agents`` updated, optimizer ``steps`` kept, agents whose trust region ``acted`` (a step
    shortened or reverted, or the KL penalty on), agents ``still`` after it (steps kept, yet a realised KL below
    :data:`~orchestra.experiments.harness.STILL_KL`: a batch without learning signal; an update whose every step
    was reverted counts as the trust region acting instead), ``kl_over_delta`` (the realised KL estimate / δ) and
    ``step_clip`` (the clip fraction of the losses the steps were taken on). NaN where the run predates a column."""

    def num(key: str) -> float:
        text = record.get(key, "")
        return float(text) if text not in ("", None) else math.nan

    names = [w for w in workers if record.get(f"agent/{w}/kl_trust", "") not in ("", None)]
    return dict(
        agents=float(len(names)),
        steps=sum(num(f"agent/{w}/optimizer_steps") for w in names),
        acted=sum(num(f"agent/{w}/trust_region_acted") for w in names),
        still=float(
            sum(num(f"agent/{w}/kl_trust") < STILL_KL and num(f"agent/{w}/optimizer_steps") > 0 for w in names)
        ),
        kl_over_delta=sum(num(f"agent/{w}/kl_trust") / num(f"agent/{w}/delta") for w in names),
        step_clip=sum(num(f"agent/{w}/step_clip_fraction") for w in names),
    )


def mechanism(training: Sequence[dict[str, Any]], schemes: Sequence[str]) -> list[dict[str, Any]]:
    """Per scheme, over every agent-update of every seed: steps per update, the share of updates in which the trust
    region acted, the share that left the agent where it was (no learning signal), the mean realised KL / δ and the
    mean clip fraction during the steps."""
    out = []
    for scheme in schemes:
        rows = [r for r in training if r["scheme"] == scheme and r.get("agents", 0) > 0]
        n = sum(r["agents"] for r in rows)
        if not n:
            continue
        out.append(
            dict(
                scheme=scheme,
                agent_updates=int(n),
                steps_per_update=sum(r["steps"] for r in rows) / n,
                acted_share=sum(r["acted"] for r in rows) / n,
                still_share=sum(r["still"] for r in rows) / n,
                kl_over_delta=sum(r["kl_over_delta"] for r in rows) / n,
                step_clip_fraction=sum(r["step_clip"] for r in rows) / n,
            )
        )
    return out


def analyse(
    cfg: LLMExperimentConfig, rows: Sequence[dict[str, Any]], runs_dir: Path, seeds: int | None = None
) -> dict[str, list[dict[str, Any]]]:
    """Every table: ``final`` (each scheme at each accounting), ``vs_frozen``, ``pairwise`` (task level,
    descriptive), ``curves`` (held-out success per evaluation stage), ``training`` (training-batch reward per update)
    and the verdicts over seeds (``seed_iqm``, ``seed_verdicts``, ``null_check``), all read over the first ``seeds``
    seeds (default ``cfg.seeds``; an interim report reads the seeds complete so far: :func:`complete_seeds`)."""
    n_tasks = cfg.eval_tasks
    seeds = cfg.seeds if seeds is None else seeds
    rows = [r for r in rows if r["seed"] < seeds]
    schemes = [FROZEN, *cfg.schemes]
    final: list[dict[str, Any]] = []
    mats: dict[tuple[str, str, str], np.ndarray] = {}
    for accounting in ACCOUNTINGS:
        for scheme in schemes:
            stage = accounting_stage(cfg, scheme, accounting)
            if stage is None:
                continue
            m = {ms: outcome_matrix(rows, scheme, stage, seeds, n_tasks, ms) for ms in MEASURES}
            if m["success"] is None or m["return"] is None:
                continue
            for ms, v in m.items():
                assert v is not None
                mats[(accounting, scheme, ms)] = v
            sub = [r for r in rows if r["scheme"] == scheme and r["stage"] == stage and r["task"] == 0]
            per_seed = m["success"].mean(axis=1)
            final.append(
                dict(
                    accounting=accounting,
                    scheme=scheme,
                    stage=stage,
                    success=float(m["success"].mean()),
                    success_seed_sd=float(per_seed.std(ddof=1)) if seeds > 1 else math.nan,
                    ret=float(m["return"].mean()),
                    episodes=float(np.mean([r["episodes"] for r in sub])),
                    tokens=float(np.mean([r["tokens"] for r in sub])),
                    train_seconds=float(np.mean([r["train_seconds"] for r in sub])),
                    eval_tokens=float(
                        np.mean([r["eval_tokens"] for r in rows if r["scheme"] == scheme and r["stage"] == stage])
                    ),
                )
            )
    vs_frozen: list[dict[str, Any]] = []
    pairwise: list[dict[str, Any]] = []
    for accounting in ACCOUNTINGS:
        for ms in MEASURES:
            base = mats.get((accounting, FROZEN, ms))
            for scheme in cfg.schemes:
                a = mats.get((accounting, scheme, ms))
                if a is not None and base is not None:
                    vs_frozen.append(dict(accounting=accounting, measure=ms, scheme=scheme, **paired_row(a, base)))
            for x, y in combinations(cfg.schemes, 2):
                a, b = mats.get((accounting, x, ms)), mats.get((accounting, y, ms))
                if a is not None and b is not None:
                    pairwise.append(dict(accounting=accounting, measure=ms, scheme=x, vs=y, **paired_row(a, b)))
    for table in (vs_frozen, pairwise):
        for r in table:
            r["group"] = f"{r['accounting']}/{r['measure']}"
        _holm_in_place(table, "group")
        for r in table:
            del r["group"]
    curves: list[dict[str, Any]] = []
    keys = sorted({(r["scheme"], r["seed"], r["stage"]) for r in rows})
    for scheme, seed, stage in keys:
        sub = [r for r in rows if (r["scheme"], r["seed"], r["stage"]) == (scheme, seed, stage)]
        curves.append(
            dict(
                scheme=scheme,
                seed=seed,
                stage=stage,
                episodes=sub[0]["episodes"],
                tokens=sub[0]["tokens"],
                success=float(np.mean([r["success"] for r in sub])),
                ret=float(np.mean([r["return"] for r in sub])),
            )
        )
    training = training_curves(runs_dir, cfg, seeds)
    # the verdicts over seeds: one score per run, its held-out success (the mean over the tasks of its evaluation)
    readings = {
        accounting: {
            scheme: {s: float(mat[s].mean()) for s in range(seeds)}
            for scheme in schemes
            if (mat := mats.get((accounting, scheme, "success"))) is not None
        }
        for accounting in ACCOUNTINGS
    }
    return dict(
        final=final,
        vs_frozen=vs_frozen,
        pairwise=pairwise,
        curves=curves,
        headroom=headroom(rows),
        training=training,
        mechanism=mechanism(training, cfg.schemes),
        **seed_tables({a: by for a, by in readings.items() if by}),
    )


def complete_seeds(expected: Sequence[tuple[str, int, int]], done: set[tuple[str, int, int]]) -> int:
    """How many seeds, counted from seed 0, have every expected (scheme, seed, stage) evaluation in ``done``: the
    runs go seed-major, so at any stop seeds 0 … k−1 hold complete seed-paired comparisons of every scheme."""
    seeds = sorted({seed for _, seed, _ in expected})
    k = 0
    for seed in seeds:
        if any(key not in done for key in expected if key[1] == seed):
            break
        k += 1
    return k


def headroom(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Two ceilings from the evaluations played. In sample (``oracle``): the share of held-out tasks that at least one
    evaluated team (any scheme, seed and stage, the frozen team included) solves, a per-task choice of the best of
    ``teams`` teams made with the answer in hand, so training-seed luck counts as headroom; ``never``, the share no
    evaluated team solves. Capturable (:func:`crossfit_headroom`): the per-task choice made on half the seeds and
    scored on the other half, against the best single configuration chosen the same way."""
    if not rows:
        return []
    tasks = sorted({r["task"] for r in rows})
    solved = {r["task"] for r in rows if r["success"] > 0}
    frozen = [r["success"] for r in rows if r["scheme"] == FROZEN]
    return [
        dict(
            teams=len({(r["scheme"], r["seed"], r["stage"]) for r in rows if r["scheme"] != FROZEN}) + 1,
            tasks=len(tasks),
            frozen=float(np.mean(frozen)) if frozen else math.nan,
            oracle=len(solved) / len(tasks),
            never=1 - len(solved) / len(tasks),
            **crossfit_headroom(rows),
        )
    ]


def crossfit_headroom(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The headroom a per-task choice among the evaluated configurations (scheme and stage, the frozen team included)
    could capture, cross-fitted over seeds: the seeds split into two halves (first and second); on one half each task
    gets the configuration with the highest mean success there (ties: the configuration ranked higher over all tasks
    on that half), scored by its mean success on the task over the other half, and the same both ways (mean of the
    two). This is :func:`~orchestra.report.stats.replicate_oracle` with a half of the seeds as the replicate run.
    ``crossfit_fixed`` scores the best single configuration chosen on one half the same way, the strongest simple
    baseline; ``capturable`` = ``crossfit_oracle`` − ``crossfit_fixed``. Below two seeds there is no other half: nan."""
    seeds = sorted({r["seed"] for r in rows})
    configs = sorted({(r["scheme"], r["stage"]) for r in rows}, key=lambda c: (c[0] != FROZEN, c))
    if len(seeds) < 2:
        return dict(configs=len(configs), crossfit_oracle=math.nan, crossfit_fixed=math.nan, capturable=math.nan)
    tasks = sorted({r["task"] for r in rows})
    t_of = {t: i for i, t in enumerate(tasks)}
    c_of = {c: i for i, c in enumerate(configs)}
    s_of = {s: i for i, s in enumerate(seeds)}
    x = np.full((len(configs), len(seeds), len(tasks)), np.nan)
    for r in rows:
        x[c_of[(r["scheme"], r["stage"])], s_of[r["seed"]], t_of[r["task"]]] = r["success"]
    half = len(seeds) // 2
    a, b = x[:, :half].mean(axis=1), x[:, half:].mean(axis=1)  # (config, task) mean success on each half
    label = [f"{scheme}@{stage}" for scheme, stage in configs]
    oracle, fixed = [], []
    for fit, score in ((a, b), (b, a)):
        rank = np.argsort(np.argsort(-fit.mean(axis=1), kind="stable"), kind="stable")  # 0: the best single config
        # the rank is the oracle's tie-break (its "cost"): a task tied on the fitting half goes to the better config
        choice = stats.replicate_oracle(_by_config(fit, rank, label), _by_config(score, rank, label))
        oracle.append(float(np.mean([c.success for c in choice.values()])))
        fixed.append(float(score[int(np.argmin(rank))].mean()))
    return dict(
        configs=len(configs),
        crossfit_oracle=float(np.mean(oracle)),
        crossfit_fixed=float(np.mean(fixed)),
        capturable=float(np.mean(oracle) - np.mean(fixed)),
    )


def _by_config(m: np.ndarray, rank: np.ndarray, label: Sequence[str]) -> dict[str, dict[int, tuple[float, float]]]:
    """``m[config, task]`` as the oracle's outcomes, each configuration's rank the cost that breaks ties."""
    return {label[c]: {t: (float(m[c, t]), float(rank[c])) for t in range(m.shape[1])} for c in range(len(label))}


def acceptance(tables: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """The issue's criterion read off the tables: does teamtr's held-out success exceed the frozen team's, with the
    task-level 95% interval above 0 (and the Holm-adjusted p below 0.05), at each accounting."""
    out: dict[str, Any] = {}
    for r in tables["vs_frozen"]:
        if r["scheme"] == "teamtr" and r["measure"] == "success":
            out[r["accounting"]] = bool(r["lo"] > 0 and r["p_holm"] < 0.05)
    return out


__all__ = [
    "ACCOUNTINGS",
    "accounting_stage",
    "acceptance",
    "analyse",
    "complete_seeds",
    "crossfit_headroom",
    "detectable",
    "outcome_matrix",
    "paired_row",
]
