"""``orchestra experiment llm``: the config and its accountings, the paired statistics against scipy, the smoke run's
files and tables, resume after a cut-short evaluation, bad input, the CLI."""

from __future__ import annotations

import csv
import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy import stats as sps

from orchestra.experiments.harness import read_rows
from orchestra.experiments.llm.analysis import (
    acceptance,
    analyse,
    complete_seeds,
    crossfit_headroom,
    mechanism,
    paired_row,
    update_mechanism,
)
from orchestra.experiments.llm.config import LLMExperimentConfig
from orchestra.experiments.llm.report import findings, summary_sections
from orchestra.experiments.llm.run import (
    EVAL_COLUMNS,
    EVAL_FIELDS,
    publish_tables,
    resume_from_tables,
    run_llm_experiment,
)
from orchestra.report.findings import check_findings
from trajectories.rundir import ConfigMismatchError

pytestmark = pytest.mark.usefixtures("one_thread")

SMOKE = LLMExperimentConfig.smoke()
# the analysis tests' setting, independent of the experiment's defaults: 6 stages (12 for equal episodes and the
# equal-updates control), 3 seeds
SIX = replace(
    LLMExperimentConfig(),
    trainer=replace(LLMExperimentConfig().trainer, num_stages=6),
    seeds=3,
    equal_updates_control=True,
)


def _csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


# ----------------------------------------------------------------------------------------------------------------
# config


def test_accountings_and_evaluation_stages() -> None:
    cfg = SIX  # 2 trainable workers
    assert cfg.n_agents == 2 and cfg.num_stages == 6
    assert cfg.episode_stage("teamtr") == 6 and cfg.episode_stage("stale_indep") == 6
    assert cfg.episode_stage("naive") == cfg.episode_stage("joint") == cfg.episode_stage("happo") == 12
    # the equal-updates control: teamtr also runs to the one-batch schemes' last stage, read at 6 and at 12
    assert cfg.long_stages == 12 and all(cfg.stages_for(s) == 12 for s in ("teamtr", "stale_indep", "naive", "happo"))
    assert cfg.eval_stages("teamtr") == (0, 6, 12) and cfg.eval_stages("naive") == (0, 6, 12)
    off = replace(cfg, equal_updates_control=False)
    assert off.long_stages is None and off.stages_for("teamtr") == 6 and off.eval_stages("teamtr") == (0, 6)
    assert off.stages_for("naive") == 12
    assert replace(cfg, eval_every=4).eval_stages("naive") == (0, 4, 6, 8, 12)
    assert replace(cfg, extend_for_episodes=False).stages_for("naive") == 6
    assert replace(cfg, extend_for_episodes=False).long_stages is None
    # every scheme of a seed shares the team seed and the trainer seed; seeds differ from each other
    assert (
        cfg.trainer_config("teamtr", 1).seed
        == cfg.trainer_config("happo", 1).seed
        != cfg.trainer_config("teamtr", 2).seed
    )
    assert cfg.team_config(0).seed != cfg.team_config(1).seed and cfg.team_config(0).eval_tasks == 0
    assert cfg.trainer_config("naive", 0, 3).num_stages == 3 and cfg.trainer_config("naive", 0).scheme == "naive"
    # per-scheme learning rates (the tuning's choice) override trainer.lr for the schemes they name only
    tuned = replace(cfg, lr_by_scheme=("naive=1e-3",))
    assert tuned.trainer_config("naive", 0).lr == 1e-3 and tuned.trainer_config("teamtr", 0).lr == cfg.trainer.lr
    for bad in ("naive", "naive=x", "nope=1e-3", "naive=-1", "naive=0"):
        with pytest.raises(ValueError, match="lr_by_scheme"):
            replace(cfg, lr_by_scheme=(bad,))
    with pytest.raises(ValueError, match="lr_by_scheme"):
        replace(cfg, lr_by_scheme=("naive=1e-3", "naive=3e-4"))


@pytest.mark.parametrize(
    "bad",
    [
        dict(schemes=("teamtr", "bogus")),
        dict(schemes=("teamtr", "teamtr")),
        dict(schemes=()),
        dict(seeds=0),
        dict(eval_tasks=0),
        dict(eval_every=-1),
        dict(eval_split="train"),
    ],
)
def test_bad_config_is_refused(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        LLMExperimentConfig(**bad)
    with pytest.raises(ValueError, match="multiple of team.group_size"):
        LLMExperimentConfig(trainer=replace(LLMExperimentConfig().trainer, batch_size=6))


# ----------------------------------------------------------------------------------------------------------------
# statistics


def test_paired_row_matches_scipy_and_reads_seeds_apart() -> None:
    rng = np.random.default_rng(0)
    b = (rng.random((3, 200)) < 0.3).astype(float)
    a = np.maximum(b, (rng.random((3, 200)) < 0.15).astype(float))  # A solves what B does, and more
    r = paired_row(a, b)
    d = (a - b).mean(axis=0)
    assert r["diff"] == pytest.approx(d.mean())
    t = sps.ttest_1samp(d, 0.0)
    lo, hi = t.confidence_interval(0.95)
    assert (r["lo"], r["hi"]) == (pytest.approx(lo), pytest.approx(hi)) and r["p"] == pytest.approx(t.pvalue)
    assert r["lo"] > 0 and r["tasks"] == 200 and r["seeds"] == 3
    per_seed = (a - b).mean(axis=1)
    assert r["per_seed"] == " ".join(f"{v:+.3f}" for v in per_seed)
    assert r["p_seeds"] == pytest.approx(sps.ttest_1samp(per_seed, 0.0).pvalue)
    same = paired_row(b, b)  # identical teams: no spread, no test
    assert same["diff"] == 0 and math.isnan(same["p"]) and math.isnan(same["mdd"])
    # MDD: a true difference of that size, with the observed spread, is detected with 80% power (two-sided, 5%)
    from statsmodels.stats.power import TTestPower

    power = TTestPower().power(effect_size=r["mdd"] / d.std(ddof=1), nobs=d.size, alpha=0.05, alternative="two-sided")
    assert power == pytest.approx(0.8, abs=1e-4)  # solve_power solves to about 1e-6
    assert paired_row(a[:, :50], b[:, :50])["mdd"] > r["mdd"]  # fewer tasks detect only larger effects
    assert (r["won"], r["lost"]) == (int((a > b).sum()), 0)  # A solves what B does: it never loses a (seed, task)
    assert (paired_row(b, a)["won"], paired_row(b, a)["lost"]) == (0, r["won"])


def _rows(cfg: LLMExperimentConfig, outcome: dict[str, Any]) -> list[dict[str, Any]]:
    """Synthetic evals.csv rows: scheme → (seeds, tasks) success at every evaluation stage of the scheme, or
    scheme → {stage: (seeds, tasks) success}."""
    rows = []
    for scheme, by_stage in outcome.items():
        stages = (0,) if scheme == "frozen" else cfg.eval_stages(scheme)[1:]
        for stage in stages:
            m = by_stage[stage] if isinstance(by_stage, dict) else by_stage
            for s in range(cfg.seeds):
                for t in range(cfg.eval_tasks):
                    rows.append(
                        dict(
                            scheme=scheme,
                            seed=s,
                            stage=stage,
                            episodes=stage * 16,
                            tokens=stage * 100,
                            train_seconds=float(stage),
                            task=t,
                            difficulty=1,
                            success=float(m[s, t]),
                            **{"return": float(m[s, t]) - 0.1},
                            eval_tokens=10,
                        )
                    )
    return rows


def _grid(x: dict[tuple[str, int], np.ndarray]) -> list[dict[str, Any]]:
    """evals rows from (scheme, stage) -> a (seed, task) success matrix."""
    return [
        dict(scheme=scheme, stage=stage, seed=s, task=t, success=float(m[s, t]))
        for (scheme, stage), m in x.items()
        for s in range(m.shape[0])
        for t in range(m.shape[1])
    ]


def test_crossfit_headroom_captures_task_structure_and_not_seed_luck() -> None:
    # structure: one configuration solves the first half of the tasks on every seed, another the second half
    left = np.tile(np.arange(200) < 100, (4, 1)).astype(float)
    room = crossfit_headroom(_grid({("frozen", 0): np.zeros((4, 200)), ("a", 4): left, ("b", 4): 1 - left}))
    assert room["configs"] == 3
    assert room["crossfit_oracle"] == pytest.approx(1.0) and room["crossfit_fixed"] == pytest.approx(0.5)
    assert room["capturable"] == pytest.approx(0.5)
    # luck: every run solves each task at random; in sample the oracle looks like headroom, cross-fitted it is none
    rng = np.random.default_rng(0)
    luck = {(f"s{i}", 4): (rng.random((8, 4000)) < 0.3).astype(float) for i in range(3)}
    rows = _grid(luck)
    room = crossfit_headroom(rows)
    in_sample = np.mean(np.max([m.max(axis=0) for m in luck.values()], axis=0))
    assert in_sample > 0.9
    assert abs(room["capturable"]) < 0.02 and room["crossfit_fixed"] == pytest.approx(0.3, abs=0.02)
    # a task tied on the fitting half goes to the best single configuration there, not to the first in order
    best = np.ones((2, 3))
    worse = np.array([[1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    room = crossfit_headroom(_grid({("frozen", 0): worse, ("a", 4): best}))
    assert room["crossfit_fixed"] == pytest.approx(1.0) and room["crossfit_oracle"] == pytest.approx(1.0)
    # one seed has no other half
    assert math.isnan(crossfit_headroom(_grid({("a", 4): left[:1]}))["crossfit_oracle"])


def test_analysis_finds_an_injected_effect_and_only_it(tmp_path: Path) -> None:
    cfg = replace(SIX, schemes=("teamtr", "naive"), eval_tasks=200)
    rng = np.random.default_rng(1)
    frozen = np.repeat((rng.random((1, 200)) < 0.3).astype(float), 3, axis=0)  # greedy: the same for every seed
    better = np.maximum(frozen, (rng.random((3, 200)) < 0.2).astype(float))
    tables = analyse(cfg, _rows(cfg, {"frozen": frozen, "teamtr": better, "naive": frozen.copy()}), tmp_path)
    vs = {(r["accounting"], r["measure"], r["scheme"]): r for r in tables["vs_frozen"]}
    assert vs[("equal_stages", "success", "teamtr")]["lo"] > 0
    assert vs[("equal_stages", "success", "teamtr")]["p_holm"] < 0.05
    assert vs[("equal_stages", "success", "naive")]["diff"] == 0
    assert acceptance(tables) == {"equal_stages": True, "equal_episodes": True, "equal_updates": True}
    pair = next(r for r in tables["pairwise"] if r["measure"] == "success" and r["accounting"] == "equal_episodes")
    assert (pair["scheme"], pair["vs"]) == ("teamtr", "naive") and pair["lo"] > 0
    final = {(r["accounting"], r["scheme"]): r for r in tables["final"]}
    assert final[("equal_episodes", "naive")]["stage"] == 12 and final[("equal_stages", "naive")]["stage"] == 6
    assert final[("equal_episodes", "teamtr")]["stage"] == 6 and final[("equal_updates", "teamtr")]["stage"] == 12
    assert final[("equal_updates", "naive")]["stage"] == 12
    assert final[("equal_stages", "teamtr")]["success"] == pytest.approx(better.mean())
    # headroom: the share of tasks some evaluated team solves, here what better's three seeds solve between them
    (room,) = tables["headroom"]
    assert (
        room["oracle"] == pytest.approx(better.max(axis=0).mean()) and room["teams"] == 1 + 2 * 3 * 2
    )  # frozen + 2 schemes × 3 seeds × 2 stages
    assert room["never"] == pytest.approx(1 - room["oracle"]) and room["frozen"] == pytest.approx(frozen.mean())
    reading = "\n".join(summary_sections(cfg, tables, 0.0)["reading"])
    assert (
        f"the best of the 13 evaluated teams (every scheme, seed and stage, and the frozen team) solves {room['oracle']:.1%}"
        in reading
    )
    assert f"reaches {room['crossfit_oracle']:.1%}, against {room['crossfit_fixed']:.1%}" in reading
    assert "Other schemes that improve" not in reading  # naive plays as the frozen team
    # no effect: the acceptance reads False
    null = analyse(cfg, _rows(cfg, {"frozen": frozen, "teamtr": frozen.copy(), "naive": frozen.copy()}), tmp_path)
    assert acceptance(null) == {"equal_stages": False, "equal_episodes": False, "equal_updates": False}
    off = analyse(
        replace(cfg, equal_updates_control=False),
        _rows(cfg, {"frozen": frozen, "teamtr": better, "naive": frozen.copy()}),
        tmp_path,
    )
    assert acceptance(off) == {"equal_stages": True, "equal_episodes": True}  # no control, no third reading
    # noise without an effect: not an improvement, and the reading says how large an effect the test could have seen
    flip = rng.random((3, 200)) < np.where(frozen == 1, 0.14, 0.06)  # as many losses as gains on average
    noisy = np.where(flip, 1.0 - frozen, frozen)
    tables = analyse(cfg, _rows(cfg, {"frozen": frozen, "teamtr": noisy, "naive": frozen.copy()}), tmp_path)
    row = next(r for r in tables["vs_frozen"] if r["scheme"] == "teamtr" and r["measure"] == "success")
    reading = "\n".join(summary_sections(cfg, tables, 0.0)["reading"])
    assert not acceptance(tables)["equal_stages"]
    assert f"With 200 tasks the test detects a true Δ of {100 * row['mdd']:.1f} points with 80% power" in reading


def test_findings_quote_the_tables_below_them(tmp_path: Path) -> None:
    cfg = replace(SIX, schemes=("teamtr", "naive", "stale_indep"), seeds=6, eval_tasks=100)
    rng = np.random.default_rng(2)
    frozen = np.repeat((rng.random((1, 100)) < 0.3).astype(float), 6, axis=0)
    better = np.maximum(frozen, (rng.random((6, 100)) < 0.25).astype(float))
    noisy = np.where(rng.random((6, 100)) < 0.1, 1.0 - frozen, frozen)  # naive: run-to-run noise, no effect
    tables = analyse(
        cfg,
        _rows(cfg, {"frozen": frozen, "teamtr": better, "naive": noisy, "stale_indep": frozen.copy()}),
        tmp_path,
    )
    tables["mechanism"] = [
        dict(
            scheme="teamtr",
            agent_updates=24,
            steps_per_update=3.25,
            acted_share=0.375,
            still_share=0.0,
            kl_over_delta=0.8,
            step_clip_fraction=0.01,
        ),
        dict(
            scheme="naive",
            agent_updates=48,
            steps_per_update=4.0,
            acted_share=0.0625,
            still_share=0.125,
            kl_over_delta=0.3,
            step_clip_fraction=0.0,
        ),
    ]
    page = "\n".join(line for sec in summary_sections(cfg, tables, 0.0).values() for line in sec)
    got = findings(cfg, tables)
    texts = [f.text for f in got]
    assert "3.25 steps per update, the trust region acting in 38% of updates;" in texts[0]  # no still update
    assert "6% of updates, 12% of updates without learning signal (the agent did not move)" in texts[0]
    assert "| naive | 48 | 4.00 | 6% | 12% | 0.30 |" in page
    assert any("the null check passes" in t for t in texts)  # naive: noise around the frozen team, halved
    primary = next(
        t for t in texts if "teamtr − naive" in t and t.startswith("Held-out success in points, equal stages")
    )
    assert "teamtr better" in primary and "Holm p" in primary
    assert page.index("## Findings") < page.index("## What the update mechanism did")
    assert check_findings(page, got) == []
    # a table that no longer says what the findings say is caught: the mechanism row, a verdict's interval
    assert check_findings(page.replace("| teamtr | 24 | 3.25 |", "| teamtr | 24 | 3.50 |"), got)
    row = next(r for r in tables["seed_verdicts"] if r["vs"] == "naive" and r["accounting"] == "equal_stages")
    ci = f"[{100 * row['lo']:+.1f}, {100 * row['hi']:+.1f}]"
    below = page.split("## Findings")[1].split("\n## ", 1)[1]
    assert ci in below
    assert check_findings(page.replace("\n## ", "\n## ", 1).replace(below, below.replace(ci, "[+0.0, +0.0]")), got)


def test_equal_updates_control_tells_more_updates_from_the_scheme(tmp_path: Path) -> None:
    """Both schemes gain only with 12 updates per worker: naive's lead at equal episodes (its 12 updates against
    teamtr's 6) vanishes at equal updates, and the reading says so; a gain teamtr keeps at equal updates survives."""
    cfg = replace(SIX, schemes=("teamtr", "naive"), eval_tasks=200)
    rng = np.random.default_rng(2)
    frozen = np.repeat((rng.random((1, 200)) < 0.3).astype(float), 3, axis=0)
    better = np.maximum(frozen, (rng.random((3, 200)) < 0.3).astype(float))
    updates_only = {6: frozen, 12: better}
    tables = analyse(cfg, _rows(cfg, {"frozen": frozen, "teamtr": updates_only, "naive": updates_only}), tmp_path)
    pair = {r["accounting"]: r for r in tables["pairwise"] if r["measure"] == "success"}
    assert pair["equal_episodes"]["hi"] < 0 and pair["equal_episodes"]["p_holm"] < 0.05
    assert pair["equal_updates"]["diff"] == 0 and pair["equal_stages"]["diff"] == 0
    reading = "\n".join(summary_sections(cfg, tables, 0.0)["reading"])
    assert "Control, teamtr − naive" in reading and "does not survive when the updates are equal" in reading
    assert "Over seeds, at equal updates: +0.0 / +0.0 / +0.0 points (no seed shows a difference)" in reading
    gain = next(
        r
        for r in tables["vs_frozen"]
        if r["accounting"] == "equal_episodes" and r["scheme"] == "naive" and r["measure"] == "success"
    )
    assert (
        gain["lo"] > 0
        and (
            "Other schemes that improve held-out success over the frozen team at equal sampled episodes "
            f"(teamtr's episodes at stage 6) (95% interval above 0, Holm p < 0.05 over tasks): naive +{100 * gain['diff']:.1f} points"
        )
        in reading
    )
    # teamtr ahead of a naive that never learns, at 6 updates and at 12: the difference survives
    fresh = {6: better, 12: np.maximum(better, (rng.random((3, 200)) < 0.3).astype(float))}
    tables = analyse(cfg, _rows(cfg, {"frozen": frozen, "teamtr": fresh, "naive": frozen.copy()}), tmp_path)
    reading = "\n".join(summary_sections(cfg, tables, 0.0)["reading"])
    assert "survives when the updates are equal" in reading and "does not survive" not in reading
    seeds = next(r for r in tables["pairwise"] if r["accounting"] == "equal_updates" and r["measure"] == "success")
    assert "(every seed favours teamtr), p over seeds" in reading and min(map(float, seeds["per_seed"].split())) > 0


def test_freshness_control_reads_teamtr_against_stale_indep(tmp_path: Path) -> None:
    """stale_indep (per-worker stale batches) gains at 12 updates, teamtr does not: the reading names the freshness
    control at equal updates with the sign of teamtr − stale_indep and each seed's; at equal stages (both alike) it
    says no difference survives. Without stale_indep in the run there is no such sentence."""
    cfg = replace(SIX, schemes=("teamtr", "naive", "stale_indep"), eval_tasks=200)
    rng = np.random.default_rng(3)
    frozen = np.repeat((rng.random((1, 200)) < 0.3).astype(float), 3, axis=0)
    better = np.maximum(frozen, (rng.random((3, 200)) < 0.3).astype(float))
    tables = analyse(
        cfg,
        _rows(
            cfg,
            {
                "frozen": frozen,
                "teamtr": frozen.copy(),
                "naive": frozen.copy(),
                "stale_indep": {6: frozen.copy(), 12: better},
            },
        ),
        tmp_path,
    )
    row = next(
        r
        for r in tables["pairwise"]
        if r["accounting"] == "equal_updates"
        and r["measure"] == "success"
        and (r["scheme"], r["vs"]) == ("teamtr", "stale_indep")
    )
    assert row["hi"] < 0 and row["p_holm"] < 0.05
    reading = "\n".join(summary_sections(cfg, tables, 0.0)["reading"])
    at_updates = next(line for line in reading.splitlines() if line.startswith("- Freshness control after 12 stages"))
    assert "teamtr − stale_indep" in at_updates and f": {100 * row['diff']:+.1f} points" in at_updates
    assert "fresh sampling does worse than the stale batches" in at_updates
    assert "(every seed favours stale_indep)" in at_updates
    at_stages = next(line for line in reading.splitlines() if line.startswith("- Freshness control after 6 stages"))
    assert ": +0.0 points" in at_stages and "no difference survives Holm" in at_stages
    assert "Control, teamtr − stale_indep" not in reading  # the equal-updates control is for one-batch schemes
    two = replace(cfg, schemes=("teamtr", "naive"))
    tables = analyse(two, _rows(two, {"frozen": frozen, "teamtr": frozen.copy(), "naive": better}), tmp_path)
    assert "Freshness control" not in "\n".join(summary_sections(two, tables, 0.0)["reading"])


# ----------------------------------------------------------------------------------------------------------------
# the smoke run (the tiny random model: its numbers mean nothing; every path of the full run is taken)


@pytest.fixture(scope="module")
def smoke_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import torch

    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("experiment_llm")
    run_llm_experiment(SMOKE, out, say=lambda _line: None)
    return out


def test_smoke_run_writes_every_file_and_evaluation(smoke_dir: Path) -> None:
    for name in (
        "config.json",
        "evals.csv",
        "final.csv",
        "vs_frozen.csv",
        "pairwise.csv",
        "curves.csv",
        "training.csv",
        "mechanism.csv",
        "learning_curves.png",
        "summary.md",
    ):
        assert (smoke_dir / name).exists(), name
    rows = read_rows(smoke_dir / "evals.csv", EVAL_COLUMNS)
    keys = {(r["scheme"], r["seed"], r["stage"]) for r in rows}
    want = {("frozen", 0, 0)} | {("teamtr", 0, k) for k in (1, 2, 3, 4)} | {("naive", 0, k) for k in (1, 2, 3, 4)}
    assert keys == want
    assert len(rows) == len(want) * SMOKE.eval_tasks
    by = {(r["scheme"], r["stage"]): r for r in rows if r["task"] == 0}
    # the accountings: teamtr at stage 2 sampled as many episodes as naive at stage 4, twice naive's at stage 2
    assert by[("teamtr", 2)]["episodes"] == by[("naive", 4)]["episodes"] == 2 * by[("naive", 2)]["episodes"] == 16
    assert by[("teamtr", 4)]["episodes"] == 32  # the equal-updates control: 4 updates each, teamtr 2× the episodes
    for scheme in SMOKE.schemes:
        updates = _csv(smoke_dir / "runs" / f"{scheme}-seed0" / "updates.csv")
        assert updates and all(math.isfinite(float(u["rollout/reward_mean"])) for u in updates)
    # the mechanism table: 2 epochs × 2 minibatches, so up to 4 steps per agent-update, counted from updates.csv
    mech = {r["scheme"]: r for r in _csv(smoke_dir / "mechanism.csv")}
    for scheme in SMOKE.schemes:
        updates = _csv(smoke_dir / "runs" / f"{scheme}-seed0" / "updates.csv")
        cells = [(u, w) for u in updates for w in SMOKE.team.workers if u.get(f"agent/{w}/kl_trust", "") != ""]
        steps = [float(u[f"agent/{w}/optimizer_steps"]) for u, w in cells]
        acted = [float(u[f"agent/{w}/trust_region_acted"]) for u, w in cells]
        assert int(mech[scheme]["agent_updates"]) == len(cells) == 8  # 4 stages × 2 workers
        assert float(mech[scheme]["steps_per_update"]) == pytest.approx(sum(steps) / len(steps))
        assert float(mech[scheme]["acted_share"]) == pytest.approx(sum(acted) / len(acted))
        assert max(steps) > 1
    summary = (smoke_dir / "summary.md").read_text()
    for scheme, r in mech.items():  # the report's mechanism table is mechanism.csv
        row = (
            f"| {scheme} | {r['agent_updates']} | {float(r['steps_per_update']):.2f} | {float(r['acted_share']):.0%} |"
        )
        assert row in summary.split("## What the update mechanism did")[1]
    for needle in (
        "Against the frozen team",
        "Between schemes",
        "equal sampled episodes",
        "teamtr − naive",
        "equal updates, the control",
        "Control, teamtr − naive",
        "What the numbers show, and what they do not",
    ):
        assert needle in summary


def test_resume_redoes_only_a_cut_short_evaluation(smoke_dir: Path, tmp_path: Path) -> None:
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(smoke_dir, copy)
    lines = (copy / "evals.csv").read_text().splitlines(keepends=True)
    (copy / "evals.csv").write_text("".join(lines[:-2]))  # the last evaluation (naive, stage 4) cut short
    said: list[str] = []
    run_llm_experiment(SMOKE, copy, say=said.append)
    assert [s for s in said if "held-out success" in s] == [s for s in said if "naive seed 0 stage 4" in s]
    assert len([s for s in said if "held-out success" in s]) == 1  # nothing else was played again
    again = sorted(read_rows(copy / "evals.csv", EVAL_COLUMNS), key=lambda r: (r["scheme"], r["stage"], r["task"]))
    first = sorted(read_rows(smoke_dir / "evals.csv", EVAL_COLUMNS), key=lambda r: (r["scheme"], r["stage"], r["task"]))
    assert again == first  # the re-played evaluation repeats exactly


def test_resume_from_published_tables_keeps_complete_runs_and_reruns_a_cut_one(smoke_dir: Path, tmp_path: Path) -> None:
    """Across sessions (checkpoints gone) or machines: the tables of --tables carry every complete run; a run cut
    short there is dropped whole and trained again from its start, ending where the uninterrupted run ended."""
    tables = publish_tables(smoke_dir, tmp_path / "tables")
    lines = (tables / "evals.csv").read_text().splitlines(keepends=True)
    (tables / "evals.csv").write_text("".join(lines[: -SMOKE.eval_tasks]))  # naive's last evaluation never came
    out = tmp_path / "out"
    assert resume_from_tables(SMOKE, tables, out) == [("frozen", 0), ("teamtr", 0)]
    kept = read_rows(out / "evals.csv", EVAL_COLUMNS)
    assert {r["scheme"] for r in kept} == {"frozen", "teamtr"}  # naive's complete stages went with its cut run
    assert sorted(p.name for p in (out / "runs").iterdir()) == ["teamtr-seed0"]
    assert resume_from_tables(SMOKE, tables, out) == []  # OUT holds its own evaluations now: left alone
    said: list[str] = []
    run_llm_experiment(SMOKE, out, say=said.append)
    played = [s.split(":")[0] for s in said if "held-out success" in s]
    assert played and all(s.startswith("llm naive seed 0") for s in played)  # teamtr and frozen not played again
    # publishing with the config copies only complete runs' tables, and drops a run an earlier publish left
    import shutil

    cut = tmp_path / "cut"
    shutil.copytree(smoke_dir, cut, ignore=shutil.ignore_patterns("checkpoints", "*.pt"))
    (cut / "evals.csv").write_text("".join(lines[: -SMOKE.eval_tasks]))
    everything = publish_tables(cut, tmp_path / "partial")  # without the config: every run directory's tables
    assert sorted(p.name for p in (everything / "runs").iterdir()) == ["naive-seed0", "teamtr-seed0"]
    partial = publish_tables(cut, tmp_path / "partial", SMOKE)
    assert sorted(p.name for p in (partial / "runs").iterdir()) == ["teamtr-seed0"]

    def outcomes(d: Path) -> list[tuple[Any, ...]]:  # every column but the wall time
        return sorted(
            tuple(v for k, v in r.items() if k != "train_seconds") for r in read_rows(d / "evals.csv", EVAL_COLUMNS)
        )

    assert outcomes(out) == outcomes(smoke_dir)  # the re-run repeats the uninterrupted run exactly
    with pytest.raises(ConfigMismatchError, match=r"eval_tasks 6 → 5"):
        resume_from_tables(replace(SMOKE, eval_tasks=5), tables, tmp_path / "other")
    with pytest.raises(FileNotFoundError, match=r"config\.json: missing; --resume-from wants"):
        resume_from_tables(SMOKE, tmp_path / "out" / "runs", tmp_path / "other")


def test_report_only_plays_nothing_and_marks_an_unfinished_run_interim(smoke_dir: Path, tmp_path: Path) -> None:
    import shutil

    assert "Interim report" not in (smoke_dir / "summary.md").read_text()  # the complete run is not marked
    copy = tmp_path / "copy"
    shutil.copytree(smoke_dir, copy)
    lines = (copy / "evals.csv").read_text().splitlines(keepends=True)
    (copy / "evals.csv").write_text("".join(lines[:-2]))  # the last evaluation (naive, stage 4) cut short
    said: list[str] = []
    result = run_llm_experiment(SMOKE, copy, say=said.append, play=False)
    assert not [s for s in said if "held-out success" in s]  # nothing was played
    assert len(read_rows(copy / "evals.csv", EVAL_COLUMNS)) == (
        len(lines) - 1 - SMOKE.eval_tasks
    )  # only complete ones kept
    summary = result.summary.read_text()
    assert "Interim report: 1 evaluation is not in yet** (naive: seed 0 stage 4)" in summary
    assert "`--report-only`: nothing played here" in summary and "Wall time of this invocation" not in summary
    assert "Wall time of this invocation" in (smoke_dir / "summary.md").read_text()
    # naive at equal episodes (stage 4) is left out of every table; at equal stages it is there
    final = {(r["accounting"], r["scheme"]) for r in result.tables["final"]}
    assert ("equal_stages", "naive") in final and ("equal_episodes", "naive") not in final
    assert ("equal_updates", "teamtr") in final and ("equal_updates", "naive") not in final
    assert not [r for r in result.tables["vs_frozen"] if r["accounting"] == "equal_episodes" and r["scheme"] == "naive"]


def test_complete_seeds_counts_the_seed_prefix_whose_every_evaluation_is_in() -> None:
    expected = [("frozen", s, 0) for s in range(3)] + [(x, s, 4) for x in ("teamtr", "naive") for s in range(3)]
    done = set(expected) - {("naive", 1, 4)}
    assert complete_seeds(expected, done) == 1  # seed 2 is complete too, but seed 1 is not: the prefix stops
    assert complete_seeds(expected, set(expected)) == 3
    assert complete_seeds(expected, done - {("frozen", 0, 0)}) == 0


def test_an_interim_report_reads_the_seeds_every_scheme_completed(smoke_dir: Path, tmp_path: Path) -> None:
    """Seed-major runs stopped after seed 0 of a 2-seed config: the report reads seed 0 of every scheme (the same
    tables as the finished 1-seed run) and says so, instead of leaving out every scheme comparison."""
    import shutil

    from trajectories.rundir import write_config

    copy = tmp_path / "copy"
    shutil.copytree(smoke_dir, copy)
    two = replace(SMOKE, seeds=2)
    write_config(copy, two)  # as if the run had been started with 2 seeds and stopped after seed 0
    result = run_llm_experiment(two, copy, say=lambda _line: None, play=False)
    summary = result.summary.read_text()
    assert "Every table below reads seed 0 only, the seed every scheme has completed" in summary
    assert "nothing about a training procedure can be inferred" in summary
    assert "not the planned test" not in summary  # one seed: no verdict at all, so none to flag
    # a later look, 2 of 3 seeds read: the banner and the findings say a verdict there is not the planned test
    sec = summary_sections(replace(SMOKE, seeds=3), result.tables, None, missing=[("naive", 2, 4)], seeds_read=2)
    assert "The verdicts are planned at 3 seeds: a verdict read at an interim look is not that test" in "\n".join(
        sec["setting"]
    )
    assert "**An interim look at 2 of the 3 seeds: the verdicts below are not the planned test.**" in "\n".join(
        sec["findings"]
    )
    assert "with 2 seeds, the seed-level p values" in "\n".join(sec["reading"])
    final = "\n".join(line for lines in summary_sections(SMOKE, result.tables, None).values() for line in lines)
    assert "planned test" not in final and "interim look" not in final
    for name in ("final", "vs_frozen", "mechanism", "curves", "headroom"):
        assert len(result.tables[name]) == len(_csv(smoke_dir / f"{name}.csv")) > 0, name
    assert [(r["accounting"], r["scheme"], r["success"]) for r in result.tables["final"]] == [
        (r["accounting"], r["scheme"], float(r["success"])) for r in _csv(smoke_dir / "final.csv")
    ]
    assert {r["scheme"] for r in result.tables["pairwise"]} == {"teamtr"}


def test_greedy_frozen_team_is_played_once_and_serves_every_seed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import orchestra.experiments.llm.run as run_module

    played: list[int] = []
    real = run_module.evaluate

    def counted(*args: Any) -> Any:
        played.append(1)
        return real(*args)

    monkeypatch.setattr(run_module, "evaluate", counted)
    cfg = replace(SMOKE, seeds=3, eval_tasks=3, trainer=replace(SMOKE.trainer, num_stages=1))
    said: list[str] = []
    run_llm_experiment(cfg, tmp_path, say=said.append)
    assert len(played) == 1 + 3 * 2 + 3 * 2  # the frozen team once, teamtr and naive at stages 1 and 2 per seed
    # seed-major: the frozen team, then seed 0 of teamtr and naive, then seed 1, ... (an experiment stopped part-way
    # holds seed-paired comparisons of every scheme over the seeds it reached)
    order = [line.split(":")[0].removeprefix("llm ") for line in said if "held-out success" in line]
    assert order == [f"frozen seed {s} stage 0" for s in range(3)] + [
        f"{scheme} seed {s} stage {k}" for s in range(3) for scheme in ("teamtr", "naive") for k in (1, 2)
    ]
    rows = read_rows(tmp_path / "evals.csv", EVAL_COLUMNS)
    frozen = {
        s: [(r["task"], r["success"], r["return"]) for r in rows if r["scheme"] == "frozen" and r["seed"] == s]
        for s in range(3)
    }
    assert len(frozen[0]) == 3 and frozen[0] == frozen[1] == frozen[2]  # one copy per seed, no more
    assert len(rows) == 3 * 3 + 2 * 3 * 3 * 2  # frozen, teamtr and naive at 1 and 2, per seed and task


def test_damaged_evals_and_another_config_are_named(smoke_dir: Path, tmp_path: Path) -> None:
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(smoke_dir, copy)
    lines = (copy / "evals.csv").read_text().splitlines(keepends=True)
    lines[3] = "frozen,0,zero" + lines[3][lines[3].index(",", 9) :]
    (copy / "evals.csv").write_text("".join(lines))
    with pytest.raises(ValueError, match=r"evals\.csv:4: a damaged row"):
        run_llm_experiment(SMOKE, copy, say=lambda _line: None)
    with pytest.raises(ConfigMismatchError, match=r"config\.json: .* in 1 field \(saved → current\): eval_tasks 6 → 5"):
        run_llm_experiment(replace(SMOKE, eval_tasks=5), smoke_dir, say=lambda _line: None)
    with pytest.raises(ConfigMismatchError, match=r": trainer\.lr 0\.01 → 0\.5; use another output directory"):
        run_llm_experiment(replace(SMOKE, trainer=replace(SMOKE.trainer, lr=0.5)), smoke_dir, say=lambda _line: None)
    with pytest.raises(ConfigMismatchError, match=r": schemes \['teamtr', 'naive'\] → .*appended to teamtr naive"):
        run_llm_experiment(replace(SMOKE, schemes=("naive", "teamtr")), smoke_dir, say=lambda _line: None)
    assert list(EVAL_FIELDS) == list(_csv(smoke_dir / "evals.csv")[0])


def test_cli_experiment_llm(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from orchestra.cli import main

    with pytest.raises(SystemExit) as e:
        main(["experiment", "llm", "--help"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    assert "usage: orchestra experiment llm" in text and "--eval-split" in text and "--smoke" in text
    out = tmp_path / "cli"
    report = tmp_path / "docs" / "finetune.md"
    rc = main(
        [
            "experiment",
            "llm",
            "--smoke",
            "--schemes",
            "teamtr",
            "--eval-tasks",
            "3",
            "--out",
            str(out),
            "--report",
            str(report),
            "--tables",
            str(tmp_path / "tables"),
            "--threads",
            "1",
            "--quiet",
        ]
    )
    assert rc == 0
    assert f"summary: {out / 'summary.md'}" in capsys.readouterr().out
    assert {r["scheme"] for r in _csv(out / "evals.csv")} == {"frozen", "teamtr"}
    assert "](finetune_curves.png)" in report.read_text() and (report.parent / "finetune_curves.png").exists()
    # the published tables (no checkpoints) give the same report with --report-only, as on a fresh clone
    tables = tmp_path / "tables"
    assert not list(tables.rglob("*.pt")) and not list(tables.rglob("checkpoints"))
    flags = ["--schemes", "teamtr", "--eval-tasks", "3", "--quiet", "--report-only"]
    assert main(["experiment", "llm", "--smoke", *flags, "--out", str(tables)]) == 0
    for name in ("final.csv", "mechanism.csv", "training.csv", "seed_iqm.csv"):
        assert (tables / name).read_text() == (out / name).read_text(), name
    assert main(["experiment", "llm", "--smoke", "--schemes", "nope", "--out", str(tmp_path / "x"), "--quiet"]) == 2
    assert "schemes" in capsys.readouterr().err


def test_a_scheme_appended_to_a_finished_run_keeps_every_evaluation(smoke_dir: Path, tmp_path: Path) -> None:
    """A control added after the fact (``--schemes`` with one more at the end) continues the same run directory:
    nothing already played is dropped or played again; the new scheme's evaluations are listed as missing."""
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(smoke_dir, copy)
    before = read_rows(copy / "evals.csv", EVAL_COLUMNS)
    more = replace(SMOKE, schemes=(*SMOKE.schemes, "stale_indep"))
    said: list[str] = []
    result = run_llm_experiment(more, copy, say=said.append, play=False)
    assert read_rows(copy / "evals.csv", EVAL_COLUMNS) == before and not [s for s in said if "held-out success" in s]
    missing = ", ".join(f"seed 0 stage {k}" for k in more.eval_stages("stale_indep")[1:])
    assert f"Interim report: 4 evaluations are not in yet** (stale_indep: {missing})" in result.summary.read_text()
    assert json.loads((copy / "config.json").read_text())["schemes"] == [*SMOKE.schemes, "stale_indep"]


def test_update_mechanism_counts_an_update_that_did_not_move() -> None:
    def agent(name: str, kl: float, acted: float) -> dict[str, str]:
        return {f"agent/{name}/kl_trust": str(kl), f"agent/{name}/delta": "0.002", f"agent/{name}/optimizer_steps": "4",
                f"agent/{name}/trust_region_acted": str(acted), f"agent/{name}/step_clip_fraction": "0.0"}  # fmt: skip

    both = update_mechanism({**agent("solver", 2e-3, 1.0), **agent("critic", 1.2e-11, 0.0)}, ("solver", "critic"))
    assert both["agents"] == 2 and both["still"] == 1 and both["acted"] == 1 and both["steps"] == 8
    reverted = {**agent("solver", 0.0, 1.0), "agent/solver/optimizer_steps": "0"}  # every step taken back
    assert update_mechanism(reverted, ("solver",))["still"] == 0
    one = update_mechanism(agent("solver", 1e-3, 0.0), ("solver", "critic"))  # the critic not updated here
    assert one["agents"] == 1 and one["still"] == 0 and one["kl_over_delta"] == 0.5
    rows = [dict(scheme="teamtr", **both), dict(scheme="teamtr", **one)]
    (m,) = mechanism(rows, ["teamtr", "naive"])
    assert (
        m["agent_updates"] == 3
        and m["still_share"] == pytest.approx(1 / 3)
        and m["acted_share"] == pytest.approx(1 / 3)
    )
