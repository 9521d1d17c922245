"""Running the chain freshness experiment: one replicate pair (:func:`run_pair`), every pair's row in ``pairs.csv``,
resume, then the report (:mod:`~orchestra.experiments.freshness.analysis`).

One replicate pair (n, pair) at one step size, k = n − 1 the last worker:

1. the chain team of (n, pair) is built and warm started (as the chain experiment does; once per (n, pair), reset to
   that warm state for every step size);
2. the trainer runs scheme naive in the fixed order 0..n−1 and is stopped right after worker k − 1's update
   (:func:`~orchestra.teamtr.trainer.train_until`): workers 0..k−1 have each been updated on the stage's one batch S,
   sampled before any of them moved; the team's state there (parameters, optimizers, β) is copied;
3. the FRESH batch F is sampled from that team with the generator state that sampled S (common random numbers: the
   same keys and the same uniforms per agent, so an episode differs only where an upstream update changed a message);
4. from the copied state, worker k is updated by the trainer's own
   :func:`~orchestra.teamtr.trainer.update_agents` once on S (arm ``stale``: what naive does next) and once on F
   (arm ``fresh``: what TeamTR would do), with identical optimizer copies and minibatch seed; each arm is scored by
   the exact team success J (no evaluation noise);
5. the null check: two more stale arms, each on its own independent batch of the stage-start team (S1, S2: the same
   procedure, the same kind of batch, only the seed differs), so their difference is 0 in expectation by symmetry.

The measured stale gap, all for worker k: the exact KL and TV between its (key, input) occupancy in the stage-start
team and in the updated one (:func:`~orchestra.teamtr.chain.occupancies`), the exact stale gap of the stale arm's
change (its exact surrogate in the team S came from vs the team it acts in,
:func:`~orchestra.teamtr.chain.exact_surrogate`), and on the batches: the share of episodes whose worker-k context
differs between S and F, and the mean |Â_S − Â_F| of worker k's advantages episode by episode.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from orchestra.experiments.freshness.analysis import analyse, summary_sections
from orchestra.experiments.freshness.config import FreshnessConfig, StepSize, team_config, trainer_config
from orchestra.experiments.harness import ExperimentResult, RowLog, Say, finish, open_run_dir, read_rows, stderr_say
from orchestra.teamtr.chain import (
    ChainTeam,
    Matrix,
    exact_success,
    exact_surrogate,
    occupancies,
    policy_matrices,
    tv_distance,
    warm_start,
)
from orchestra.teamtr.chain_team import ChainRollout, ChainTrainable
from orchestra.teamtr.config import TeamTRConfig, seeded_generator
from orchestra.teamtr.signals import compute_advantages
from orchestra.teamtr.trainer import Branch, TeamSnapshot, train_until, update_agents

# the columns of pairs.csv and how each is read back: the setting, the exact J of every team state, the arms'
# realised steps, the stale gap, the null arms, the pair's wall time
PAIR_COLUMNS: dict[str, Callable[[str], Any]] = dict(
    step=str,
    lr=float,
    delta=float,
    num_epochs=int,
    batch_size=int,
    n=int,
    pair=int,
    worker=int,
    J_start=float,
    J_branch=float,
    J_stale=float,
    J_fresh=float,
    diff=float,
    upstream_kl=float,
    upstream_bound=int,
    kl_stale=float,
    kl_fresh=float,
    bound_stale=int,
    bound_fresh=int,
    ctx_kl=float,
    ctx_tv=float,
    surrogate_gap=float,
    rows_changed=float,
    adv_gap=float,
    J_null_a=float,
    J_null_b=float,
    null_diff=float,
    seconds=float,
)

# the stale-arm-vs-null seeds of a pair: purposes 2 and 3 of derive_seed(cfg.seed, n, pair, purpose)
_NULL_PURPOSES = (2, 3)


def _kl(p: Matrix, q: Matrix) -> float:
    """KL(p ‖ q) of two joint distributions with full support (softmax policies: every entry > 0)."""
    return float(np.sum(p * (np.log(p) - np.log(q))))


def _arm(
    trainable: ChainTrainable, snapshot: TeamSnapshot, worker: int, batch: ChainRollout, tcfg: TeamTRConfig
) -> tuple[list[Matrix], dict[str, float]]:
    """Worker ``worker`` updated once on ``batch`` from ``snapshot`` by the trainer's own update: the team's matrices
    after it and the update's metrics (the same fresh optimizer copy and minibatch seed in every arm)."""
    states = snapshot.restore(trainable, tcfg)
    metrics, _ = update_agents(
        trainable, (worker,), batch, tcfg, states=states, shuffle=seeded_generator(tcfg.seed, 2, 0, worker)
    )
    return policy_matrices(trainable.team), metrics


def _sample(trainable: ChainTrainable, batch_size: int, generator: torch.Generator) -> ChainRollout:
    with torch.no_grad():
        return trainable.sample(batch_size, generator)


def branch(trainable: ChainTrainable, tcfg: TeamTRConfig) -> Branch:
    """The naive stage stopped right after the update of worker n − 2 (every upstream worker moved, the last not)."""
    return train_until(trainable, tcfg, stage=0, position=len(trainable.agent_names) - 2)


def run_pair(
    cfg: FreshnessConfig,
    team: ChainTeam,
    warm: Sequence[dict[str, torch.Tensor]],
    n: int,
    pair: int,
    step: StepSize,
    *,
    upstream: bool = True,
) -> dict[str, Any]:
    """One replicate pair at one step size, from the warm state ``warm`` of ``team`` (module docstring): its row of
    ``pairs.csv``. ``upstream=False``: the upstream updates are undone before the branch (the team there is the
    stage-start one), so F has exactly S's episodes and both arms the same J (a check of the procedure)."""
    t0 = time.perf_counter()
    k = n - 1
    tcfg = trainer_config(cfg, n, pair, step)
    for i, state in enumerate(warm):
        team.load_adapter_state(i, state)
    trainable = ChainTrainable(team)
    start = policy_matrices(team)
    b_size = tcfg.batch_size
    null_batches = [
        _sample(trainable, b_size, seeded_generator(cfg.seed, n, pair, purpose)) for purpose in _NULL_PURPOSES
    ]
    br = branch(trainable, tcfg)  # workers 0..k−1 updated on the stale batch S
    snapshot = br.snapshot
    if not upstream:
        snapshot = TeamSnapshot(tuple(warm), (None,) * n, snapshot.kl_coefs)
        snapshot.restore(trainable, tcfg)
    stale = br.point.batch
    at_branch = policy_matrices(team)
    fresh = _sample(trainable, b_size, br.point.rollout_generator())  # F: S's random numbers, the updated team
    after_stale, m_stale = _arm(trainable, snapshot, k, stale, tcfg)
    after_fresh, m_fresh = _arm(trainable, snapshot, k, fresh, tcfg)
    after_null = [_arm(trainable, snapshot, k, b, tcfg)[0] for b in null_batches]

    names = team.adapter_names
    ups = br.log.updates if upstream else []
    d_start, d_branch = occupancies(start)[k], occupancies(at_branch)[k]
    adv_s, adv_f = compute_advantages(stale, tcfg), compute_advantages(fresh, tcfg)  # (B,) each, episode-matched
    j_stale, j_fresh = exact_success(after_stale), exact_success(after_fresh)
    j_null = [exact_success(m) for m in after_null]
    name = names[k]
    return dict(
        step=step.name,
        lr=step.lr,
        delta=step.delta,
        num_epochs=step.num_epochs,
        batch_size=b_size,
        n=n,
        pair=pair,
        worker=k,
        J_start=exact_success(start),
        J_branch=exact_success(at_branch),
        J_stale=j_stale,
        J_fresh=j_fresh,
        diff=j_fresh - j_stale,
        upstream_kl=float(sum(u[f"agent/{names[int(u['rollout/agent'])]}/kl_trust"] for u in ups)),
        upstream_bound=int(sum(u[f"agent/{names[int(u['rollout/agent'])]}/early_stopped"] for u in ups)),
        kl_stale=m_stale[f"agent/{name}/kl_trust"],
        kl_fresh=m_fresh[f"agent/{name}/kl_trust"],
        bound_stale=int(m_stale[f"agent/{name}/early_stopped"]),
        bound_fresh=int(m_fresh[f"agent/{name}/early_stopped"]),
        ctx_kl=_kl(d_start, d_branch),
        ctx_tv=tv_distance(d_start, d_branch),
        surrogate_gap=abs(
            exact_surrogate(start, k, at_branch[k], after_stale[k])
            - exact_surrogate(at_branch, k, at_branch[k], after_stale[k])
        ),
        rows_changed=float((stale.chain.input_ids[k] != fresh.chain.input_ids[k]).any(dim=-1).float().mean()),
        adv_gap=float((adv_s - adv_f).abs().mean()),
        J_null_a=j_null[0],
        J_null_b=j_null[1],
        null_diff=j_null[1] - j_null[0],
        seconds=time.perf_counter() - t0,
    )


# ----------------------------------------------------------------------------------------------------------------
# the experiment

Cell = tuple[str, int, int]  # (step, n, pair)


def _cell(row: dict[str, Any]) -> Cell:
    return row["step"], row["n"], row["pair"]


def run_freshness_experiment(cfg: FreshnessConfig, out_dir: str | Path, say: Say | None = None) -> ExperimentResult:
    """Every (n, pair) at every step size; ``pairs.csv`` (one row each), the per-cell table ``cells.csv`` and
    ``summary.md`` in ``out_dir``. ``say``: one line per finished pair (default: stderr).

    Resume: if ``out_dir`` holds the same ``config.json`` (``pairs`` may differ: more pairs extend the run), the pairs
    already in its ``pairs.csv`` are kept and only the missing ones run.

    Raises:
        ConfigMismatchError: ``out_dir`` holds a ``config.json`` of a different config (naming every field).
    """
    talk = say or stderr_say(True)
    t0 = time.perf_counter()
    out, resume = open_run_dir(out_dir, cfg, may_differ=("pairs",))
    log = RowLog(out / "pairs.csv", PAIR_COLUMNS, _cell, lambda rows: {_cell(r) for r in rows}, nan="", resume=resume)
    reused = len(log.done)
    for n in cfg.ns:
        for pair in range(cfg.pairs):
            todo = [s for s in cfg.steps if (s.name, n, pair) not in log.done]
            if not todo:
                continue
            team = ChainTeam(team_config(cfg, n, pair))
            warm_start(team)
            warm = [team.adapter_state(i) for i in range(n)]
            for step in todo:
                row = run_pair(cfg, team, warm, n, pair, step)
                log.add(_cell(row), [row])
                talk(
                    f"freshness n={n} {step.name} pair={pair}: fresh − stale {row['diff']:+.4f}, "
                    f"context KL {row['ctx_kl']:.4f} ({row['seconds']:.1f} s)"
                )
    rows = [r for r in log.rows if r["n"] in cfg.ns and r["pair"] < cfg.pairs]
    return report(rows, out, seconds=time.perf_counter() - t0, reused=reused)


def report(
    rows: Sequence[dict[str, Any]], out: Path, *, seconds: float = math.nan, reused: int = 0
) -> ExperimentResult:
    """The tables and ``summary.md`` of some ``pairs.csv`` rows, written into ``out``."""
    tables = analyse(rows)
    return finish(out, tables, summary_sections(rows, tables, seconds=seconds, reused=reused), nan="")


def report_from_csv(pairs_csv: str | Path, out: str | Path) -> ExperimentResult:
    """The report of a ``pairs.csv`` alone (e.g. the committed ``docs/results/freshness_chain.csv``), into ``out``."""
    out_path = Path(out)
    out_path.mkdir(parents=True, exist_ok=True)
    return report(read_rows(Path(pairs_csv), PAIR_COLUMNS), out_path)


__all__ = ["PAIR_COLUMNS", "branch", "report", "report_from_csv", "run_freshness_experiment", "run_pair"]
