"""TeamTR benchmark on the telephone chain (DESIGN §5; study: ``research/telephone-chain.md``).

For every (n, scheme, seed) the chain team is built from a seed derived from (cfg.seed, n, seed) only, warm started
once per (n, seed) and reset to that warm state for every scheme, so comparisons between schemes are PAIRED (same
init, same trainer seed). Training hooks snapshot the exact policy matrices before and after every update, so the
drift definitions (b) and (d) of :mod:`orchestra.teamtr.chain` are computed exactly per stage.

Accounting (``research/telephone-chain.md`` §2):

* equal stages: every scheme read at stage ``num_stages``;
* equal sampled episodes: the non-teamtr schemes run ``n × num_stages`` stages (``extend_for_episodes``), and each
  (n, scheme, seed) run is read at the FIRST stage whose cumulative episodes reach teamtr's final count at the same
  (n, seed); if none does, the stage whose count is nearest (:func:`equal_episode_stage`).

Joint schemes (``joint``, ``joint_indep``) make ONE update per stage that moves every agent at once. For the drift
functions it is written as n virtual sequential updates in the stage's order: virtual update m changes agent
order[m]; snapshot m has agents order[:m] at their post-update matrices and the others at the stage start (exact,
since an agent's matrix depends only on its own adapter); every batch is the stage-start one (``"stale"``).
Train index: ``"fresh"`` for teamtr, ``"stale"`` for every other scheme.

Outputs of :func:`run_bench` (``out_dir``): ``config.json``, ``runs.csv`` (one row per (n, scheme, seed, stage),
stage 0 = the warm-started team, drift empty there), ``final.csv``, ``regressions.csv``, ``drift.csv``,
``alpha.csv``, ``learning_curves.png``, ``drift.png`` and ``summary.md`` (every table). Completed runs found in an
existing ``runs.csv`` with the same ``config.json`` are skipped (resume per run).
"""

from __future__ import annotations

import csv
import json
import math
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from orchestra.teamtr.chain import (
    ChainConfig,
    ChainTeam,
    Matrix,
    drift_b,
    drift_d,
    policy_matrices,
    warm_start,
)
from orchestra.teamtr.config import SCHEMES, Scheme, TeamTRConfig
from orchestra.teamtr.team import ChainTrainable
from orchestra.teamtr.trainer import TrainHooks, train

RUN_FIELDS = (
    "n", "scheme", "seed", "stage", "J", "drift_b", "drift_d", "episodes", "tokens",
    "agent_updates", "accepted", "bound", "kl_over", "kl_max_ratio",
)  # fmt: skip
REGRESSION_THRESHOLDS = (0.01, 0.001)
JOINT_SCHEMES = ("joint", "joint_indep")

# ----------------------------------------------------------------------------------------------------------------
# config


@dataclass(frozen=True)
class BenchConfig:
    """Every knob of the telephone-chain benchmark (defaults: the study's main setting, scaled to LoRA LMs)."""

    ns: tuple[int, ...] = (2, 3, 4, 6, 8)  # chain lengths n
    schemes: tuple[Scheme, ...] = ("teamtr", "naive", "joint", "happo")  # trainer schemes compared
    seeds: int = 8  # seeds per (n, scheme); seed s gives the same init for every scheme (paired)
    num_stages: int = 20  # stages of the equal-stages accounting (every agent updated once per stage)
    extend_for_episodes: bool = True  # non-teamtr schemes run n × num_stages stages (equal-episodes accounting)
    batch_size: int = 128  # episodes per sampled batch (teamtr samples n per stage, the others 1)
    num_epochs: int = 2  # PPO epochs per update
    delta: float = 0.03  # per-agent trust-region KL budget δ (backtracking)
    lr: float = 3e-2  # Adam learning rate of each agent's LoRA
    vocab_size: int = 8  # V message symbols (= keys)
    lora_r: int = 8  # LoRA rank (≥ V − 1: lm_head alone can express any V×V policy)
    lora_targets: tuple[str, ...] = ("lm_head",)  # LoRA target modules (lm_head only: fast and expressive enough)
    warm_pass: float = 0.85  # warm-start per-hop pass probability (the reliable-agent regime of the study)
    advantage: str = "grpo"  # "grpo": normalise per key group; "batch_mean": R − mean(R) over the batch (the study's)
    adv_scale: bool = True  # divide advantages by their std (False: mean-centred only, Dr. GRPO / the study)
    order: str = "fixed"  # agent order per stage ("fixed": 0..n−1; definition (b) is meant for it)
    drift_stages: int = 5  # drift per run = mean over its first this-many stages
    seed: int = 0  # root seed; team and trainer seeds derive from (seed, n, run seed)

    def __post_init__(self) -> None:
        if not self.ns or any(n < 1 for n in self.ns):
            raise ValueError(f"ns must be non-empty, each ≥ 1, got {self.ns}")
        bad = [s for s in self.schemes if s not in SCHEMES]
        if not self.schemes or bad:
            raise ValueError(f"unknown schemes {bad}; expected some of {SCHEMES}")
        if self.seeds < 1 or self.num_stages < 1 or self.drift_stages < 1:
            raise ValueError("need seeds ≥ 1, num_stages ≥ 1 and drift_stages ≥ 1")
        if self.advantage not in ("grpo", "batch_mean"):
            raise ValueError(f"advantage must be 'grpo' or 'batch_mean', got {self.advantage!r}")
        if self.order not in ("fixed", "random"):
            raise ValueError(f"order must be 'fixed' or 'random', got {self.order!r}")

    @classmethod
    def smoke(cls, **overrides: Any) -> BenchConfig:
        """A tiny preset for tests and the demo: n ∈ {2, 3}, teamtr vs naive, 1 seed, 2 stages, V = 4, B = 32."""
        base = cls(
            ns=(2, 3),
            schemes=("teamtr", "naive"),
            seeds=1,
            num_stages=2,
            batch_size=32,
            num_epochs=1,
            vocab_size=4,
            lora_r=4,
            drift_stages=2,
        )
        return replace(base, **overrides)

    @classmethod
    def demo(cls, **overrides: Any) -> BenchConfig:
        """``orchestra demo``'s phase 2: n ∈ {2, 4}, all four schemes, 2 seeds, 6 stages (about a minute on 2 cores)."""
        return replace(cls(ns=(2, 4), seeds=2, num_stages=6, drift_stages=3), **overrides)

    def stages_for(self, scheme: str, n: int) -> int:
        """Stages a (scheme, n) run trains for."""
        return self.num_stages if scheme == "teamtr" or not self.extend_for_episodes else n * self.num_stages

    def to_json(self) -> dict[str, Any]:
        """The config as plain JSON types (tuples → lists), as written to ``config.json``."""
        out: dict[str, Any] = json.loads(json.dumps(asdict(self)))
        return out


def derived_seed(*keys: int) -> int:
    """A 31-bit seed from a tuple of ints (independent streams per (root seed, n, run seed, purpose))."""
    return int(np.random.SeedSequence([k & 0xFFFFFFFF for k in keys]).generate_state(1)[0] & 0x7FFFFFFF)


def chain_config(cfg: BenchConfig, n: int, seed: int) -> ChainConfig:
    """The chain of run (n, seed): the same for every scheme (paired comparisons)."""
    return ChainConfig(
        n_agents=n,
        vocab_size=cfg.vocab_size,
        lora_r=cfg.lora_r,
        lora_targets=cfg.lora_targets,
        warm_pass=cfg.warm_pass,
        seed=derived_seed(cfg.seed, n, seed, 0),
    )


def trainer_config(cfg: BenchConfig, n: int, seed: int, scheme: Scheme) -> TeamTRConfig:
    """The trainer config of run (n, scheme, seed); its seed depends on (n, seed) only."""
    return TeamTRConfig(
        scheme=scheme,
        order="fixed" if cfg.order == "fixed" else "random",
        num_stages=cfg.stages_for(scheme, n),
        batch_size=cfg.batch_size,
        num_epochs=cfg.num_epochs,
        lr=cfg.lr,
        delta=cfg.delta,
        advantage="batch_mean" if cfg.advantage == "batch_mean" else "grpo",
        adv_scale=cfg.adv_scale,
        seed=derived_seed(cfg.seed, n, seed, 1),
    )


# ----------------------------------------------------------------------------------------------------------------
# pure helpers


def fit_alpha(ns: Sequence[float], drifts: Sequence[float]) -> float:
    """α = OLS slope of log drift vs log n. Points with a non-positive or non-finite drift are dropped; NaN if fewer
    than two distinct n remain."""
    x = np.asarray(ns, dtype=np.float64)
    y = np.asarray(drifts, dtype=np.float64)
    keep = np.isfinite(y) & (y > 0) & (x > 0)
    x, y = np.log(x[keep]), np.log(y[keep])
    if len(np.unique(x)) < 2:
        return math.nan
    return float(np.polyfit(x, y, 1)[0])


def equal_episode_stage(episodes: Sequence[float], target: float) -> int:
    """Index of the first stage whose cumulative episodes reach ``target``; if none does, the nearest one (ties: the
    earliest). ``episodes`` is non-decreasing, one entry per stage (index 0 = before training)."""
    eps = np.asarray(episodes, dtype=np.float64)
    if eps.size == 0:
        raise ValueError("need at least one stage")
    reached = np.flatnonzero(eps >= target)
    return int(reached[0]) if reached.size else int(np.argmin(np.abs(eps - target)))


def regression_fraction(success: Sequence[float], threshold: float) -> float:
    """Fraction of stages where the exact J fell by more than ``threshold``: #{s ≥ 1: J_s < J_{s−1} − thr} / S.
    ``success`` holds J before training (index 0) and after each of the S stages."""
    j = np.asarray(success, dtype=np.float64)
    if j.size < 2:
        return math.nan
    return float(np.mean(np.diff(j) < -threshold))


def _mean_sd(values: Sequence[float]) -> tuple[float, float]:
    v = np.asarray([x for x in values if math.isfinite(x)], dtype=np.float64)
    if v.size == 0:
        return math.nan, math.nan
    return float(v.mean()), float(v.std(ddof=1)) if v.size > 1 else 0.0


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

    def drifts(self, stage: int, train_index: str) -> tuple[float, float]:
        snaps, order = self.snaps[stage], self.orders[stage]
        ti: Any = train_index
        return drift_b(snaps, order, ti), drift_d(snaps, order, ti)


def run_one(
    cfg: BenchConfig, team: ChainTeam, warm: list[dict[str, torch.Tensor]], n: int, scheme: Scheme, seed: int
) -> tuple[list[dict[str, Any]], _Snapshots]:
    """Train ``scheme`` from the warm state ``warm`` of ``team``; rows of ``runs.csv`` and the recorded snapshots."""
    for i, state in enumerate(warm):
        team.load_adapter_state(i, state)
    for model in team.models:
        for p in model.parameters():
            p.grad = None
    rec = _Snapshots(team)
    log = train(ChainTrainable(team), trainer_config(cfg, n, seed, scheme), hooks=TrainHooks(rec.before, rec.after))
    train_index = "fresh" if scheme == "teamtr" else "stale"
    nan = math.nan
    rows: list[dict[str, Any]] = [
        dict(n=n, scheme=scheme, seed=seed, stage=0, J=log.stages[0]["perf/team_success_start"], drift_b=nan,
             drift_d=nan, episodes=0, tokens=0, agent_updates=0, accepted=0, bound=0, kl_over=0, kl_max_ratio=nan)
    ]  # fmt: skip
    for s, st in enumerate(log.stages):
        b, d = rec.drifts(s, train_index)
        trust = trust_counts([u for u in log.updates if int(u["rollout/stage"]) == s], team.adapter_names)
        rows.append(
            dict(n=n, scheme=scheme, seed=seed, stage=s + 1, J=st["perf/team_success"], drift_b=b, drift_d=d,
                 episodes=int(st["rollout/episodes"]), tokens=int(st["rollout/tokens"]), **trust)
        )  # fmt: skip
    return rows, rec


def trust_counts(updates: Sequence[dict[str, float]], names: Sequence[str]) -> dict[str, Any]:
    """Trust-region accounting of one stage's update records, per agent-update: how many, accepted (not reverted),
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
                     kl_max_ratio=float(r["kl_max_ratio"] or "nan"))
            )  # fmt: skip
    return rows


def _fmt_cell(v: Any) -> Any:
    if isinstance(v, float):
        return "" if math.isnan(v) else repr(v)
    return v


def _write_csv(path: Path, rows: Sequence[dict[str, Any]], fields: Sequence[str], mode: str = "w") -> None:
    new = mode == "w" or not path.exists()
    with path.open(mode, newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(fields))
        if new:
            w.writeheader()
        for r in rows:
            w.writerow({k: _fmt_cell(r[k]) for k in fields})


# ----------------------------------------------------------------------------------------------------------------
# analysis

Key = tuple[int, str, int]  # (n, scheme, seed)


def _curves(rows: Sequence[dict[str, Any]]) -> dict[Key, list[dict[str, Any]]]:
    runs: dict[Key, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        runs[(r["n"], r["scheme"], r["seed"])].append(r)
    for v in runs.values():
        v.sort(key=lambda r: r["stage"])
    return runs


def analyse(cfg: BenchConfig, rows: Sequence[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Tables from the ``runs.csv`` rows: ``final`` (both accountings), ``regressions``, ``drift``, ``alpha``."""
    runs = _curves(rows)
    seeds = range(cfg.seeds)
    final: list[dict[str, Any]] = []
    regressions: list[dict[str, Any]] = []
    drift: list[dict[str, Any]] = []
    for accounting in ("equal_stages", "equal_episodes"):
        if accounting == "equal_episodes" and "teamtr" not in cfg.schemes:
            continue
        for n in cfg.ns:
            picked: dict[str, dict[int, dict[str, Any]]] = {}
            for scheme in cfg.schemes:
                picked[scheme] = {}
                for s in seeds:
                    curve = runs.get((n, scheme, s))
                    if not curve:
                        continue
                    if accounting == "equal_stages":
                        idx = min(cfg.num_stages, len(curve) - 1)
                    else:
                        ref = runs.get((n, "teamtr", s))
                        if not ref:
                            continue
                        target = ref[min(cfg.num_stages, len(ref) - 1)]["episodes"]
                        idx = equal_episode_stage([r["episodes"] for r in curve], target)
                    picked[scheme][s] = curve[idx]
            for scheme in cfg.schemes:
                got = picked[scheme]
                j_mean, j_sd = _mean_sd([r["J"] for r in got.values()])
                diffs = [got[s]["J"] - picked["teamtr"][s]["J"] for s in got if s in picked.get("teamtr", {})]
                d_mean, d_sd = _mean_sd(diffs)
                final.append(
                    dict(accounting=accounting, n=n, scheme=scheme, seeds=len(got),
                         stage_mean=_mean_sd([r["stage"] for r in got.values()])[0],
                         episodes_mean=_mean_sd([r["episodes"] for r in got.values()])[0], J_mean=j_mean, J_sd=j_sd,
                         diff_vs_teamtr_mean=d_mean,
                         diff_vs_teamtr_se=d_sd / math.sqrt(len(diffs)) if len(diffs) > 1 else math.nan)
                )  # fmt: skip
    for n in cfg.ns:
        for scheme in cfg.schemes:
            curves = [runs[(n, scheme, s)][: cfg.num_stages + 1] for s in seeds if (n, scheme, s) in runs]
            reg = {
                f"regress_{thr:g}": _mean_sd([regression_fraction([r["J"] for r in c], thr) for c in curves])[0]
                for thr in REGRESSION_THRESHOLDS
            }
            regressions.append(dict(n=n, scheme=scheme, seeds=len(curves), **reg))
            per_run = {
                kind: [float(np.nanmean([r[kind] for r in c[1 : cfg.drift_stages + 1]])) for c in curves if len(c) > 1]
                for kind in ("drift_b", "drift_d")
            }
            b_mean, b_sd = _mean_sd(per_run["drift_b"])
            d_mean, d_sd = _mean_sd(per_run["drift_d"])
            drift.append(dict(n=n, scheme=scheme, drift_b=b_mean, drift_b_sd=b_sd, drift_d=d_mean, drift_d_sd=d_sd))
    alpha: list[dict[str, Any]] = []
    n_max = max(cfg.ns)
    by = {(r["n"], r["scheme"]): r for r in drift}
    for scheme in cfg.schemes:
        row: dict[str, Any] = {"scheme": scheme}
        for kind in ("drift_b", "drift_d"):
            row[f"alpha_{kind[-1]}"] = fit_alpha(cfg.ns, [by[(n, scheme)][kind] for n in cfg.ns])
            num, den = by[(n_max, scheme)][kind], by.get((n_max, "teamtr"), {}).get(kind, math.nan)
            row[f"ratio_{kind[-1]}_vs_teamtr_at_n{n_max}"] = num / den if den and math.isfinite(den) else math.nan
        alpha.append(row)
    trust: list[dict[str, Any]] = []
    for scheme in cfg.schemes:
        sel = [r for r in rows if r["scheme"] == scheme and r["stage"] > 0]
        tot = {k: sum(r[k] for r in sel) for k in ("agent_updates", "accepted", "bound", "kl_over")}
        ratios = [r["kl_max_ratio"] for r in sel if r["accepted"] and math.isfinite(r["kl_max_ratio"])]
        trust.append(dict(scheme=scheme, **tot, kl_max_ratio=max(ratios, default=math.nan)))
    tables = {"final": final, "regressions": regressions, "drift": drift, "alpha": alpha, "trust": trust}
    tables["checks"] = acceptance_checks(cfg, tables)
    return tables


def acceptance_checks(cfg: BenchConfig, tables: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The issue's acceptance criteria evaluated on these tables: one row per criterion with the measured value and
    whether it holds ("n/a" when this config cannot decide it, e.g. a scheme or an n was not run)."""
    checks: list[dict[str, Any]] = []

    def add(criterion: str, value: float | None, ok: bool | None, need: str) -> None:
        shown = "n/a" if value is None or not math.isfinite(value) else f"{value:.3f}"
        checks.append(dict(criterion=criterion, need=need, value=shown, ok="n/a" if ok is None else str(ok)))

    for r in tables["trust"]:
        acc = r["accepted"]
        add(f"{r['scheme']}: accepted updates with KL ≤ δ", 1 - r["kl_over"] / acc if acc else None,
            r["kl_over"] == 0 if acc else None, "= 1")  # fmt: skip
        bound = r["bound"] / r["agent_updates"] if r["agent_updates"] else None
        add(f"{r['scheme']}: fraction of updates where the trust region bound", bound,
            bound > 0 if bound is not None else None, "> 0")  # fmt: skip
    alpha = {r["scheme"]: r for r in tables["alpha"]}
    n_max = max(cfg.ns)
    if "teamtr" in alpha and "naive" in alpha:
        a_n, a_t = alpha["naive"]["alpha_b"], alpha["teamtr"]["alpha_b"]
        ratio = alpha["naive"][f"ratio_b_vs_teamtr_at_n{n_max}"]
        # the drift criteria: fixed order, ≥ 8 seeds, a warm-started (reliable, pass ≥ 0.8) chain, and
        # enough chain lengths to fit α (research/telephone-chain.md §1: the claim needs reliable agents)
        drift_ok = cfg.seeds >= 8 and cfg.order == "fixed" and cfg.warm_pass >= 0.8 and len(set(cfg.ns)) >= 3

        def decide(ok: bool) -> bool | None:
            return ok if drift_ok else None

        add("α (b) naive", a_n, decide(a_n >= 1.6), "≥ 1.6 (†)")
        add("α (b) teamtr", a_t, decide(a_t <= 1.5), "≤ 1.5 (†)")
        add("α (b) gap naive − teamtr", a_n - a_t, decide(a_n - a_t >= 0.5), "≥ 0.5 (†)")
        add(f"drift (b) naive / teamtr at n = {n_max}", ratio, decide(ratio >= 2.0) if n_max == 8 else None,
            "≥ 2 at n = 8 (†)")  # fmt: skip
        a_d = alpha["teamtr"]["alpha_d"]
        add("α (d) teamtr (own-step measure)", a_d, decide(0.8 <= a_d <= 1.2), "∈ [0.8, 1.2] (†)")
    final = {(r["n"], r["scheme"]): r for r in tables["final"] if r["accounting"] == "equal_stages"}
    success_ok = cfg.delta <= 0.03 and cfg.seeds >= 12  # the success criteria: δ ≤ 0.03, ≥ 12 seeds
    for scheme, bar in (("naive", 0.0), ("joint", -0.03)):
        got = final.get((8, scheme))
        if got is not None:
            d = -got["diff_vs_teamtr_mean"]
            add(f"n = 8, equal stages: mean J(teamtr) − J({scheme})", d, d >= bar if success_ok else None,
                f"≥ {bar:g} (δ ≤ 0.03, ≥ 12 seeds)")  # fmt: skip
    got = final.get((4, "teamtr"))
    if got is not None:
        add("n = 4, equal stages: mean J(teamtr)", got["J_mean"], got["J_mean"] >= 0.98 if success_ok else None,
            "≥ 0.98 (≥ 12 seeds)")  # fmt: skip
    return checks


def _cell(v: Any, digits: int = 3) -> str:
    if isinstance(v, float):
        return "—" if math.isnan(v) else f"{v:.{digits}f}"
    return str(v)


def _pivot(table: Sequence[dict[str, Any]], cfg: BenchConfig, fmt: Any, accounting: str | None = None) -> list[str]:
    """Markdown table: one row per n, one column per scheme."""
    lines = ["| n | " + " | ".join(cfg.schemes) + " |", "|---|" + "---|" * len(cfg.schemes)]
    by = {(r["n"], r["scheme"]): r for r in table if accounting is None or r.get("accounting") == accounting}
    for n in cfg.ns:
        cells = [fmt(by[(n, s)]) if (n, s) in by else "—" for s in cfg.schemes]
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    return lines


def summary_markdown(
    cfg: BenchConfig, tables: dict[str, list[dict[str, Any]]], seconds: float, reused: int = 0, total: int = 0
) -> str:
    """``summary.md``: the config and every table."""
    n_max = max(cfg.ns)
    lines = [
        "# TeamTR telephone-chain benchmark",
        "",
        f"Wall time of this invocation {seconds:.1f} s"
        + (f" ({reused} of {total} runs reused from an earlier invocation's `runs.csv`)" if reused else "")
        + ". Config (`config.json`): "
        + json.dumps(cfg.to_json()),
        "",
        "Runs are paired: for a given (n, seed) every scheme starts from the same warm-started team and trainer seed.",
        "",
    ]

    def j_cell(r: dict[str, Any]) -> str:
        return f"{_cell(r['J_mean'])}±{_cell(r['J_sd'])}"

    def diff_cell(r: dict[str, Any]) -> str:
        return f"{_cell(r['diff_vs_teamtr_mean'], 3)}±{_cell(r['diff_vs_teamtr_se'], 3)}"

    def stage_cell(r: dict[str, Any]) -> str:
        return f"{_cell(r['stage_mean'], 1)} ({_cell(r['episodes_mean'], 0)} ep)"

    for accounting, title in (
        ("equal_stages", f"equal stages (stage {cfg.num_stages})"),
        ("equal_episodes", "equal sampled episodes (first stage reaching teamtr's final episode count, else nearest)"),
    ):
        if not any(r["accounting"] == accounting for r in tables["final"]):
            continue
        lines += [f"## Final exact J, mean ± sd over seeds: {title}", ""]
        lines += _pivot(tables["final"], cfg, j_cell, accounting) + [""]
        lines += [f"Paired J_scheme − J_teamtr, mean ± SE ({title}):", ""]
        lines += _pivot(tables["final"], cfg, diff_cell, accounting) + [""]
        lines += ["Stage read (mean) and cumulative episodes:", ""]
        lines += _pivot(tables["final"], cfg, stage_cell, accounting) + [""]
    for thr in REGRESSION_THRESHOLDS:
        lines += [
            f"## Regressions: fraction of stages where exact J fell by more than {thr:g} (first {cfg.num_stages})"
        ]
        lines += [""] + _pivot(tables["regressions"], cfg, lambda r, t=thr: _cell(r[f"regress_{t:g}"])) + [""]
    for kind, label in (("drift_b", "(b)"), ("drift_d", "(d)")):
        lines += [f"## Drift {label}, mean ± sd over seeds of the mean over the first {cfg.drift_stages} stages", ""]
        lines += _pivot(tables["drift"], cfg, lambda r, k=kind: f"{_cell(r[k], 4)}±{_cell(r[k + '_sd'], 4)}") + [""]
    lines += [
        f"## Drift exponents α (OLS slope of log drift vs log n over n ∈ {list(cfg.ns)}) and ratio to teamtr at "
        f"n = {n_max}",
        "",
        f"| scheme | α (b) | α (d) | drift (b) / teamtr at n={n_max} | drift (d) / teamtr at n={n_max} |",
        "|---|---|---|---|---|",
    ]
    for r in tables["alpha"]:
        lines.append(
            f"| {r['scheme']} | {_cell(r['alpha_b'], 2)} | {_cell(r['alpha_d'], 2)} | "
            f"{_cell(r[f'ratio_b_vs_teamtr_at_n{n_max}'], 2)} | {_cell(r[f'ratio_d_vs_teamtr_at_n{n_max}'], 2)} |"
        )
    lines += [
        "",
        f"## Trust region, every agent-update of every run (KL = exact over the vocabulary, δ = {cfg.delta:g})",
        "",
        "| scheme | agent-updates | accepted | bound (full step broke δ) | accepted with KL > δ | max KL/δ accepted |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in tables["trust"]:
        share = r["bound"] / r["agent_updates"] if r["agent_updates"] else math.nan
        lines.append(
            f"| {r['scheme']} | {r['agent_updates']} | {r['accepted']} | {r['bound']} ({_cell(share * 100, 1)}%) | "
            f"{r['kl_over']} | {_cell(r['kl_max_ratio'], 3)} |"
        )
    lines += [
        "",
        "## Acceptance criteria (issue 4) on this run",
        "",
        "n/a: this run's config cannot decide the criterion. (†) drift criteria: fixed order, ≥ 8 seeds, a warm-started "
        "chain (warm pass ≥ 0.8) and ≥ 3 chain lengths.",
        "",
        "| criterion | need | measured | holds |",
    ]
    lines += ["|---|---|---|---|"] + [
        f"| {c['criterion']} | {c['need']} | {c['value']} | {c['ok']} |" for c in tables["checks"]
    ]
    lines += [
        "",
        "Files: `runs.csv`, `final.csv`, `regressions.csv`, `drift.csv`, `alpha.csv`, `trust.csv`, `checks.csv`, "
        "`learning_curves.png`, `drift.png`.",
        "",
    ]
    return "\n".join(lines)


def plot(cfg: BenchConfig, rows: Sequence[dict[str, Any]], tables: dict[str, list[dict[str, Any]]], out: Path) -> None:
    """``learning_curves.png`` (J vs cumulative episodes, mean ± sd per n) and ``drift.png`` (log-log with fits)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = _curves(rows)
    cols = len(cfg.ns)
    fig, axes = plt.subplots(1, cols, figsize=(4 * cols, 3.2), squeeze=False)
    for ax, n in zip(axes[0], cfg.ns, strict=True):
        for scheme in cfg.schemes:
            curves = [runs[(n, scheme, s)] for s in range(cfg.seeds) if (n, scheme, s) in runs]
            if not curves:
                continue
            length = min(len(c) for c in curves)
            j = np.array([[r["J"] for r in c[:length]] for c in curves])  # (seeds, stages)
            x = np.array([r["episodes"] for r in curves[0][:length]])
            mean, sd = j.mean(0), j.std(0)
            ax.plot(x, mean, label=scheme)
            ax.fill_between(x, mean - sd, mean + sd, alpha=0.2)
        ax.set_title(f"n = {n}")
        ax.set_xlabel("sampled episodes")
        ax.set_ylabel("exact J")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "learning_curves.png", dpi=100)
    plt.close(fig)

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6), squeeze=False)
    by = {(r["n"], r["scheme"]): r for r in tables["drift"]}
    alphas = {r["scheme"]: r for r in tables["alpha"]}
    ns = np.asarray(cfg.ns, dtype=np.float64)
    for ax, kind in zip(axes[0], ("drift_b", "drift_d"), strict=True):
        for scheme in cfg.schemes:
            y = np.array([by[(n, scheme)][kind] for n in cfg.ns])
            keep = np.isfinite(y) & (y > 0)
            if not keep.any():
                continue
            a = alphas[scheme][f"alpha_{kind[-1]}"]
            (line,) = ax.loglog(ns[keep], y[keep], "o", label=f"{scheme} α={_cell(a, 2)}")
            if math.isfinite(a):
                c = float(np.exp(np.mean(np.log(y[keep]) - a * np.log(ns[keep]))))
                ax.loglog(ns, c * ns**a, "-", color=line.get_color(), alpha=0.6)
        ax.set_title(f"drift ({kind[-1]}) vs n")
        ax.set_xlabel("n")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "drift.png", dpi=100)
    plt.close(fig)


# ----------------------------------------------------------------------------------------------------------------
# the benchmark


def run_bench(cfg: BenchConfig, out_dir: str | Path, progress: bool = True) -> Path:
    """Run every (n, scheme, seed), write the tables and plots into ``out_dir``; returns the ``summary.md`` path.

    Resume: if ``out_dir`` already holds this exact ``config.json``, runs complete in its ``runs.csv`` are skipped.

    Raises:
        FileExistsError: ``out_dir`` holds a ``config.json`` of a different config.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    config_path, runs_path = out / "config.json", out / "runs.csv"
    rows: list[dict[str, Any]] = []
    if config_path.exists():
        if json.loads(config_path.read_text()) != cfg.to_json():
            raise FileExistsError(f"{config_path} holds a different bench config; use another output directory")
        if runs_path.exists():
            rows = _read_runs(runs_path)
    config_path.write_text(json.dumps(cfg.to_json(), indent=2) + "\n")
    done = {
        k
        for k, c in _curves(rows).items()
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
                new, _ = run_one(cfg, team, warm, n, scheme, seed)
                _write_csv(runs_path, new, RUN_FIELDS, mode="a")
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
    summary.write_text(summary_markdown(cfg, tables, time.perf_counter() - t0, reused=len(done), total=total))
    return summary


__all__ = [
    "BenchConfig",
    "acceptance_checks",
    "analyse",
    "chain_config",
    "derived_seed",
    "equal_episode_stage",
    "fit_alpha",
    "regression_fraction",
    "run_bench",
    "run_one",
    "summary_markdown",
    "trainer_config",
    "trust_counts",
]
