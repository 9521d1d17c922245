"""Running the paired freshness experiment on the real-LLM team: one replicate pair (:func:`run_pair`), every pair's
row in ``pairs.csv``, resume, then the report (:mod:`~orchestra.experiments.freshness.llm_analysis`).

One replicate pair, k the last trainable worker (the critic; the upstream ones: the solver):

1. the team of the pair is built (its own LoRA init and sampling salt: :func:`~.llm_config.team_config`); with the
   null check, two batches S1, S2 are sampled from it first, each from its own seed;
2. the trainer runs scheme naive in the fixed order 0..n−1 and is stopped right after worker k − 1's update
   (:func:`~orchestra.teamtr.trainer.train_until`): the upstream workers have been updated on the stage's one batch
   S, sampled before any of them moved; the team's state there (adapters, optimizers, β) is copied, and the team is
   played once on the held-out tasks (success at the branch). If that update did not move the team (S carried no
   learning signal: :func:`~.llm_analysis.posed`), the pair ends here: F would be S exactly and fresh − stale 0 by
   construction, so the pair does not pose the question (its row keeps S's reward and the upstream update);
3. the FRESH batch F is sampled from that team with the generator state that sampled S (common random numbers: the
   same train tasks and the same episode seeds, so an episode differs only where an updated worker now speaks
   otherwise);
4. from the copied state, worker k is updated by the trainer's own :func:`~orchestra.teamtr.trainer.update_agents`
   once on S (arm ``stale``: what naive does next) and once on F (arm ``fresh``: what TeamTR would do), with
   identical optimizer copies and minibatch seed; after each, the team is played greedily on the held-out tasks
   (:func:`~orchestra.experiments.llm.run.evaluate`: the same tasks and episode seeds in every arm and pair);
5. the null check: two more arms the same way on S1 and S2 (the same kind of batch, only the seed differs), so
   their difference is 0 in expectation.

The measured stale gap, all for worker k, on the CRN-matched batches S and F: the share of episodes whose worker-k
turns (prompt and sampled token ids) differ, the mean |Â_S − Â_F| of the GRPO advantages episode by episode, and
the mean reward of each.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from orchestra.experiments.freshness.llm_analysis import ARM_NAMES, STEP_FIELDS, analyse, posed, summary_sections
from orchestra.experiments.freshness.llm_config import LLMFreshnessConfig, team_config, trainer_config
from orchestra.experiments.harness import (
    ExperimentResult,
    RowLog,
    Say,
    finish,
    open_run_dir,
    read_rows,
    stderr_say,
)
from orchestra.experiments.llm.run import evaluate, held_out_tasks
from orchestra.teamtr.config import TeamTRConfig, seeded_generator
from orchestra.teamtr.signals import compute_advantages
from orchestra.teamtr.trainer import Branch, Metrics, TeamSnapshot, train_until, update_agents

if TYPE_CHECKING:
    from orchestra.teamtr.llm import LLMTeam
    from orchestra.teamtr.llm_rollout import LLMRollout

# the arms of a pair, in the order they run: the worker updated on S, on F, and on the null batches S1 and S2
ARMS = tuple(ARM_NAMES)

# the columns of pairs.csv and how each is read back: the pair, the held-out success of every team state, the
# stale gap on the batches, the upstream update, every arm's step, the pair's wall time
PAIR_COLUMNS: dict[str, Callable[[str], Any]] = dict(
    pair=int,
    worker=str,
    success_branch=float,
    success_stale=float,
    success_fresh=float,
    diff=float,
    success_null_a=float,
    success_null_b=float,
    null_diff=float,
    rows_changed=float,
    adv_gap=float,
    reward_stale=float,
    reward_fresh=float,
    upstream_kl=float,
    upstream_steps=float,
    upstream_acted=float,
    **{f"{key}_{arm}": float for arm in ARMS for key in STEP_FIELDS},
    seconds=float,
)

# the null batches' seeds of a pair: purposes 2 and 3 of seeded_generator(cfg.seed, pair, purpose)
_NULL_PURPOSES = (2, 3)


def changed_rows(a: LLMRollout, b: LLMRollout, agent: int) -> list[bool]:
    """Per episode row of two batches of the same size: whether ``agent``'s turns differ (prompt or sampled token
    ids, turn by turn); rows are matched by position (common random numbers: the same task and episode seed)."""

    def by_row(batch: LLMRollout) -> list[list[tuple[tuple[int, ...], tuple[int, ...]]]]:
        rows: list[list[tuple[tuple[int, ...], tuple[int, ...]]]] = [[] for _ in range(batch.batch_size)]
        for t in batch.turns_of(agent):
            rows[t.row].append((t.prompt_ids, t.token_ids))
        return rows

    return [x != y for x, y in zip(by_row(a), by_row(b), strict=True)]


def _sample(team: LLMTeam, batch_size: int, generator: torch.Generator) -> LLMRollout:
    with torch.no_grad():
        return team.sample(batch_size, generator)


def _success(team: LLMTeam, tasks: Sequence[Any], cfg: LLMFreshnessConfig) -> float:
    """The team's held-out success: the mean over ``tasks`` played greedily, the same episode seeds every time."""
    return float(np.mean([r["success"] for r in evaluate(team, tasks, cfg)]))


def branch(team: LLMTeam, tcfg: TeamTRConfig) -> Branch:
    """The naive stage stopped right after the update of worker n − 2 (every upstream worker moved, the last not)."""
    return train_until(team, tcfg, stage=0, position=len(team.agent_names) - 2)


def _arm(team: LLMTeam, snapshot: TeamSnapshot, worker: int, batch: LLMRollout, tcfg: TeamTRConfig) -> dict[str, float]:
    """Worker ``worker`` updated once on ``batch`` from ``snapshot`` by the trainer's own update (the same fresh
    optimizer copy and minibatch seed in every arm); its step's :data:`STEP_FIELDS`."""
    states = snapshot.restore(team, tcfg)
    metrics, _ = update_agents(
        team, (worker,), batch, tcfg, states=states, shuffle=seeded_generator(tcfg.seed, 2, 0, worker)
    )
    name = team.agent_names[worker]
    return {key: float(metrics[f"agent/{name}/{field}"]) for key, field in STEP_FIELDS.items()}


def _upstream(team: LLMTeam, updates: Sequence[Metrics]) -> dict[str, float]:
    """The upstream updates' summed KL and steps, and the share of them in which the trust region acted."""
    names = team.agent_names
    per = [{k: u[f"agent/{names[int(u['rollout/agent'])]}/{f}"] for k, f in STEP_FIELDS.items()} for u in updates]
    return dict(
        upstream_kl=float(sum(p["kl"] for p in per)),
        upstream_steps=float(sum(p["steps"] for p in per)),
        upstream_acted=float(np.mean([p["acted"] for p in per])) if per else 0.0,
    )


def run_pair(cfg: LLMFreshnessConfig, pair: int, *, upstream: bool = True, say: Say | None = None) -> dict[str, Any]:
    """Replicate pair ``pair`` (module docstring): its row of ``pairs.csv``. ``upstream=False``: the upstream updates
    are undone before the branch (the team there is the stage-start one), so F has exactly S's episodes and both
    arms the same success (a check of the procedure). ``say``: the team's progress lines."""
    from orchestra.teamtr.llm import LLMTeam

    t0 = time.perf_counter()
    team = LLMTeam(team_config(cfg, pair), log=say)
    tcfg = trainer_config(cfg, pair)
    k, n, b_size = cfg.updated, len(team.agent_names), tcfg.batch_size
    start = tuple(team.state(i) for i in range(n))
    null_batches = (
        [_sample(team, b_size, seeded_generator(cfg.seed, pair, p)) for p in _NULL_PURPOSES] if cfg.null_check else []
    )
    br = branch(team, tcfg)  # workers 0..k−1 updated on the stale batch S
    up = _upstream(team, br.log.updates if upstream else [])
    if upstream and not posed(up):  # S carried no signal: F would be S exactly, the arms identical; not played
        return _unposed_row(pair, team.agent_names[k], br.point.batch, up, time.perf_counter() - t0)
    snapshot = br.snapshot
    if not upstream:
        snapshot = TeamSnapshot(start, (None,) * n, snapshot.kl_coefs)
        snapshot.restore(team, tcfg)
    tasks = held_out_tasks(cfg)
    at_branch = _success(team, tasks, cfg)
    stale = br.point.batch
    fresh = _sample(team, b_size, br.point.rollout_generator())  # F: S's random numbers, the updated team
    success: dict[str, float] = {}
    steps: dict[str, float] = {}
    for arm, batch in zip(ARMS, [stale, fresh, *null_batches], strict=False):
        steps.update({f"{key}_{arm}": v for key, v in _arm(team, snapshot, k, batch, tcfg).items()})
        success[arm] = _success(team, tasks, cfg)
    for arm in ARMS[len(success) :]:  # the null arms when the null check is off
        success[arm] = math.nan
        steps.update({f"{key}_{arm}": math.nan for key in STEP_FIELDS})
    adv_s, adv_f = compute_advantages(stale, tcfg), compute_advantages(fresh, tcfg)  # (B,) each, episode-matched
    return dict(
        pair=pair,
        worker=team.agent_names[k],
        success_branch=at_branch,
        success_stale=success["stale"],
        success_fresh=success["fresh"],
        diff=success["fresh"] - success["stale"],
        success_null_a=success["null_a"],
        success_null_b=success["null_b"],
        null_diff=success["null_b"] - success["null_a"],
        rows_changed=float(np.mean(changed_rows(stale, fresh, k))),
        adv_gap=float((adv_s - adv_f).abs().mean()),
        reward_stale=float(stale.rewards.mean()),
        reward_fresh=float(fresh.rewards.mean()),
        **up,
        **steps,
        seconds=time.perf_counter() - t0,
    )


def _unposed_row(pair: int, worker: str, stale: LLMRollout, up: dict[str, float], seconds: float) -> dict[str, Any]:
    """The row of a pair whose upstream update did not move the team (:func:`~.llm_analysis.posed`): its batch S's
    reward, the upstream update, NaN for everything the arms would have measured."""
    row: dict[str, Any] = {k: math.nan for k in PAIR_COLUMNS if PAIR_COLUMNS[k] is float}
    return {
        **row,
        "pair": pair,
        "worker": worker,
        "reward_stale": float(stale.rewards.mean()),
        **up,
        "seconds": seconds,
    }


# ----------------------------------------------------------------------------------------------------------------
# the experiment


def _pair(row: dict[str, Any]) -> int:
    return int(row["pair"])


def run_llm_freshness_experiment(
    cfg: LLMFreshnessConfig, out_dir: str | Path, say: Say | None = None, *, play: bool = True
) -> ExperimentResult:
    """Every replicate pair; ``pairs.csv`` (one row each), the table ``result.csv`` and ``summary.md`` in
    ``out_dir``. ``say``: the teams' progress and one line per finished pair (default: stderr).

    Resume: if ``out_dir`` holds the same ``config.json`` (``pairs`` may differ: more pairs extend the run), the pairs
    already in its ``pairs.csv`` are kept and only the missing ones run. ``play=False`` plays nothing and changes no
    table: the report of the pairs already in ``out_dir`` (marked interim while fewer than ``cfg.pairs``), which
    another process may still be extending.

    Raises:
        ConfigMismatchError: ``out_dir`` holds a ``config.json`` of a different config (naming every field).
        ValueError: ``play=False`` and ``out_dir`` holds no run (naming what is missing), or a damaged ``pairs.csv``.
    """
    if not play:
        return _report_only(cfg, Path(out_dir))
    talk = say or stderr_say(True)
    t0 = time.perf_counter()
    out, resume = open_run_dir(out_dir, cfg, may_differ=("pairs",))
    log = RowLog(
        out / "pairs.csv", PAIR_COLUMNS, _pair, lambda rows: {_pair(r) for r in rows}, nan="nan", resume=resume
    )
    reused = len(log.done)
    for pair in range(cfg.pairs):
        if pair in log.done:
            continue
        row = run_pair(cfg, pair, say=talk)
        log.add(pair, [row])
        talk(
            f"freshness-llm pair {pair}: held-out success stale {row['success_stale']:.1%}, fresh "
            f"{row['success_fresh']:.1%}; {row['rows_changed']:.0%} of the episodes changed ({row['seconds']:.0f} s)"
            if posed(row)
            else f"freshness-llm pair {pair}: the upstream update did not move the team (its batch carried no "
            f"signal), so the pair does not pose the question; its arms not played ({row['seconds']:.0f} s)"
        )
    rows = sorted((r for r in log.rows if r["pair"] < cfg.pairs), key=_pair)
    return report(cfg, rows, out, seconds=time.perf_counter() - t0, reused=reused)


def _report_only(cfg: LLMFreshnessConfig, out: Path) -> ExperimentResult:
    """The report of the pairs in ``out``: its config checked against ``cfg``, ``pairs.csv`` read, never rewritten
    (a running experiment may be appending to it)."""
    from trajectories.rundir import CONFIG_FILE, check_config

    for need in (CONFIG_FILE, "pairs.csv"):
        if not (out / need).exists():
            raise ValueError(f"{out / need}: not found; --report-only reads the run directory of an experiment")
    check_config(out / CONFIG_FILE, cfg, may_differ=("pairs",), hint="give the run's own options")
    rows = sorted((r for r in read_rows(out / "pairs.csv", PAIR_COLUMNS) if r["pair"] < cfg.pairs), key=_pair)
    return report(cfg, rows, out)


def report(
    cfg: LLMFreshnessConfig,
    rows: Sequence[dict[str, Any]],
    out: Path,
    *,
    seconds: float = math.nan,
    reused: int = 0,
) -> ExperimentResult:
    """The table and ``summary.md`` of some ``pairs.csv`` rows of ``cfg``'s experiment, written into ``out``."""
    tables = analyse(rows)
    return finish(out, tables, summary_sections(cfg, rows, tables, seconds=seconds, reused=reused), nan="nan")


__all__ = [
    "ARMS",
    "PAIR_COLUMNS",
    "branch",
    "changed_rows",
    "report",
    "run_llm_freshness_experiment",
    "run_pair",
]
