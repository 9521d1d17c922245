"""The chain in a regime that does not saturate: the budget rule, the per-seed readings, the paired differences, the
command lines and the page, on synthetic ``runs.csv`` rows (nothing trains)."""

from __future__ import annotations

import csv
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from scipy import stats as sps

from orchestra.experiments.chain.config import ChainExperimentConfig
from orchestra.experiments.chain.regime import (
    BudgetRule,
    budget_table,
    chain_command,
    choose_budget,
    log_seconds,
    paired_differences,
    seed_readings,
)
from orchestra.experiments.chain.run import RUN_FIELDS
from orchestra.experiments.harness import write_rows
from orchestra.teamtr.config import CHAIN_TRAINER
from trajectories.rundir import write_config

SCHEMES = ("teamtr", "naive", "stale_indep", "naive_bigB")


def _cfg(stages: int = 4, seeds: int = 3, seed: int = 0, ns: tuple[int, ...] = (2, 4)) -> ChainExperimentConfig:
    trainer = replace(CHAIN_TRAINER, num_stages=stages, batch_size=10)
    return ChainExperimentConfig(ns=ns, schemes=SCHEMES, seeds=seeds, trainer=trainer, warm_pass=0.55, seed=seed)


def _runs(cfg: ChainExperimentConfig, slope: dict[str, float]) -> list[dict[str, Any]]:
    """Synthetic runs.csv rows: J = J0 + slope[scheme] · (episodes / B) / n, the trust region bound on agent 0's
    update of every stage, seed s adds 0.01·s to J."""
    rows: list[dict[str, Any]] = []
    b = cfg.batch_size
    for n in cfg.ns:
        for seed in range(cfg.seeds):
            for scheme in cfg.schemes:
                per_stage = b if scheme == "naive" else n * b  # naive: one batch per stage, the others n
                j0 = 0.1 + 0.01 * seed
                for stage in range(cfg.stages_for(scheme, n) + 1):
                    eps = stage * per_stage
                    rows.append(
                        {k: math.nan for k in RUN_FIELDS}
                        | dict(
                            n=n,
                            scheme=scheme,
                            seed=seed,
                            stage=stage,
                            J=j0 + slope[scheme] * eps / b / n,
                            episodes=eps,
                            tokens=eps * n,
                            agent_updates=n if stage else 0,
                            accepted=n if stage else 0,
                            bound=1 if stage else 0,
                            kl_over=0,
                        )
                    )
    return rows


SLOPES = {"teamtr": 0.05, "naive": 0.04, "stale_indep": 0.05, "naive_bigB": 0.06}


def test_config_reads_back_from_its_json() -> None:
    cfg = _cfg()
    assert ChainExperimentConfig.from_json(cfg.to_json()) == cfg
    with pytest.raises(ValueError, match="not a chain experiment config"):
        ChainExperimentConfig.from_json({**cfg.to_json(), "no_such_knob": 1})


def test_seed_readings_take_equal_updates_and_equal_episodes() -> None:
    cfg = _cfg()
    got = {(r["accounting"], r["n"], r["scheme"], r["seed"]): r for r in seed_readings(_runs(cfg, SLOPES), 4)}
    assert len(got) == 2 * len(cfg.ns) * len(SCHEMES) * cfg.seeds  # one row per (accounting, n, scheme, seed)
    # equal updates: stage 4 for everyone; naive has then sampled 1/n of teamtr's episodes
    assert got[("equal_updates", 4, "naive", 1)]["stage"] == 4
    assert got[("equal_updates", 4, "naive", 1)]["episodes"] * 4 == got[("equal_updates", 4, "teamtr", 1)]["episodes"]
    # equal episodes: naive at stage n·S, the full-volume schemes at S
    assert got[("equal_episodes", 4, "naive", 1)]["stage"] == 16
    assert got[("equal_episodes", 4, "naive_bigB", 1)]["stage"] == 4
    r = got[("equal_episodes", 4, "naive", 2)]
    assert r["agent_updates"] == 16 * 4 and r["bound"] == 16 and r["kl_over"] == 0
    assert r["J0"] == pytest.approx(0.12) and r["J"] == pytest.approx(0.12 + 0.04 * 16 / 4)
    with pytest.raises(ValueError, match="stage"):
        seed_readings(_runs(cfg, SLOPES), 5)  # the runs end at stage 4


def test_paired_differences_are_t_intervals_over_seeds() -> None:
    cfg = _cfg(seeds=4)
    rows = _runs(cfg, SLOPES)
    for r in rows:  # naive_bigB's lead over teamtr differs per seed
        if r["scheme"] == "naive_bigB":
            r["J"] += 0.01 * r["seed"] ** 2 * r["stage"]
    readings = seed_readings(rows, 4)
    diffs = {(r["accounting"], r["n"], r["vs"]): r for r in paired_differences(readings)}
    assert set(diffs) == {(a, n, vs) for a in ("equal_updates", "equal_episodes") for n in (2, 4) for vs in SCHEMES[1:]}
    j = {(x["scheme"], x["seed"]): x["J"] for x in readings if (x["accounting"], x["n"]) == ("equal_updates", 2)}
    d = [j[("teamtr", k)] - j[("naive_bigB", k)] for k in range(4)]
    lo, hi = sps.t.interval(0.95, 3, loc=sum(d) / 4, scale=sps.sem(d))
    row = diffs[("equal_updates", 2, "naive_bigB")]
    assert row["seeds"] == 4 and row["diff_mean"] == pytest.approx(sum(d) / 4)
    assert (row["ci_low"], row["ci_high"]) == pytest.approx((lo, hi))
    assert (row["ahead"], row["behind"]) == (0, 4) and row["ci_excludes_0"] == (lo > 0 or hi < 0)
    # teamtr and stale_indep are equal on every seed here: a zero difference, a point interval, not excluding 0
    same = diffs[("equal_updates", 4, "stale_indep")]
    assert same["diff_mean"] == 0.0 and same["ci_low"] == same["ci_high"] == 0.0 and not same["ci_excludes_0"]


def test_budget_rule_picks_the_largest_budget_below_the_ceiling_where_teamtr_learns() -> None:
    cfg = _cfg(stages=10, ns=(2, 8))
    rule = BudgetRule(ceiling=0.5, min_rise=0.05, min_rise_largest_n=0.02, min_stages=2)
    table = budget_table(_runs(cfg, SLOPES), rule, 10)
    assert [r["stages"] for r in table] == list(range(1, 11))
    # the largest reading is naive_bigB at n = 2 on the last seed: 0.12 + 0.06·S; it stays below 0.5 up to S = 6
    assert [r["ceiling_ok"] for r in table] == [True] * 6 + [False] * 4
    assert table[5]["max_at"] == "n=2 naive_bigB seed 2 equal_updates"
    # teamtr's rise: 0.05·S at every n; ≥ 0.05 from S = 1, ≥ 0.02 at n = 8 from S = 1; S ≥ 2 by min_stages
    assert table[0]["teamtr_rise_n8"] == pytest.approx(0.05) and not table[0]["ok"]
    assert choose_budget(table) == 6
    assert choose_budget(budget_table(_runs(cfg, SLOPES), replace(rule, min_rise=0.5), 10)) is None


def test_chain_command_is_the_command_that_builds_the_config() -> None:
    from orchestra.cli import build_parser
    from orchestra.cli.options import build
    from orchestra.jobs.experiment import ChainExperimentJob

    cfg = replace(_cfg(seed=1000), trainer=replace(_cfg().trainer, lr=1e-2, delta=0.02))
    parser, _ = build_parser("experiment")
    for c in (cfg, replace(cfg, warm_success=0.3)):
        line = chain_command(c, "runs/x")
        job = build(ChainExperimentJob(), parser.parse_args(line.split()[1:]))
        assert job.experiment == c and job.out == "runs/x"
    with pytest.raises(ValueError, match="flags"):
        chain_command(replace(cfg, vocab_size=16), "runs/x")


def test_log_seconds(tmp_path: Path) -> None:
    (tmp_path / "log.txt").write_text(
        "chain n=2 teamtr seed=0: J 0.330 → 0.610 (5120 episodes, 1.5 s)\n"
        "chain n=8 naive_bigB seed=11: J 0.128 → 0.140 (81920 episodes, 12.0 s)\n"
        "wall 30 s\nsummary: x\nwall 4.5 s\n"
    )
    assert log_seconds(tmp_path) == (34.5, 13.5, 2)
    assert log_seconds(tmp_path / "none") == (0.0, 0.0, 0)


def _write_run(path: Path, cfg: ChainExperimentConfig, rows: list[dict[str, Any]]) -> None:
    path.mkdir(parents=True)
    write_config(path, cfg)
    write_rows(path / "runs.csv", rows, RUN_FIELDS, nan="")


def test_cli_writes_the_page_and_the_per_seed_tables(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from orchestra.cli import main

    val = _cfg(stages=10, seed=1000)
    _write_run(tmp_path / "val", val, _runs(val, SLOPES))
    main_cfg = replace(_cfg(stages=6, seeds=5), trainer=replace(val.trainer, num_stages=6))
    _write_run(tmp_path / "main", main_cfg, _runs(main_cfg, SLOPES))
    page = tmp_path / "page.md"
    argv = ["experiment", "chain-regime", "--validation", str(tmp_path / "val"), "--main", str(tmp_path / "main")]
    assert main([*argv, "--page", str(page), "--ceiling", "0.5", "--min-stages", "2"]) == 0
    assert f"page: {page}" in capsys.readouterr().out
    text = page.read_text()
    assert "**The regime: candidate 1 at S = 6 stages, by the rule.** The main run uses exactly that setting" in text
    assert "--ceiling 0.5 --min-stages 2" in text  # the page names the command that wrote it
    assert (
        "- At equal updates: the largest mean J is 0.480 (naive_bigB, n = 2)" in text and "saturates there" not in text
    )
    assert "## What it does not show" in text
    with (tmp_path / "main" / "seeds.csv").open(newline="") as f:
        seeds = list(csv.DictReader(f))
    assert len(seeds) == 2 * 2 * len(SCHEMES) * 5  # (accounting, n, scheme, seed)
    assert (tmp_path / "main" / "differences.csv").exists() and (tmp_path / "budgets.csv").exists()
    # a main run longer than the runs it holds is refused with a message, not a traceback
    assert main([*argv[:4], str(tmp_path / "nope"), "--page", str(page)]) == 2


def test_warm_success_gives_every_chain_length_the_same_warm_start_success() -> None:
    from orchestra.experiments.chain.config import chain_config
    from orchestra.teamtr.chain import exact_success, noisy_pass_through, pass_for_success

    for n in (1, 2, 4, 8):
        p = pass_for_success(0.3, n, 8)
        assert exact_success([noisy_pass_through(8, p)] * n) == pytest.approx(0.3, abs=1e-12)
    assert pass_for_success(0.3, 2, 8) < pass_for_success(0.3, 8, 8)  # longer chains need more reliable hops
    with pytest.raises(ValueError, match="1/V < success"):
        pass_for_success(0.1, 2, 8)  # below chance (1/V = 0.125)
    cfg = replace(_cfg(ns=(2, 8)), warm_success=0.3)
    assert cfg.warm_pass_for(8) == pass_for_success(0.3, 8, 8) and _cfg().warm_pass_for(8) == 0.55
    assert chain_config(cfg, 8, 0).warm_pass == pass_for_success(0.3, 8, 8)
    with pytest.raises(ValueError, match="1/V < success"):
        replace(cfg, warm_success=1.0)


def test_a_config_written_before_a_knob_existed_reads_back_with_its_default() -> None:
    old = _cfg().to_json()
    del old["warm_success"]
    assert ChainExperimentConfig.from_json(old) == _cfg()


def test_the_fallback_checks_the_ceiling_at_equal_updates_only() -> None:
    """naive at equal episodes (n × teamtr's updates) races past the ceiling: the rule picks no budget, its fallback
    (ceiling at equal updates) does, and the page says which one picked."""
    from orchestra.experiments.chain.regime import regime_page

    cfg = _cfg(stages=10, ns=(2, 8))
    rows = _runs(cfg, {**SLOPES, "naive": 0.2})
    rule = BudgetRule(ceiling=0.5, min_stages=2)
    assert choose_budget(budget_table(rows, rule, 10)) is None  # naive at equal episodes: 0.12 + 0.2·S
    assert rule.fallback.ceiling_on == ("equal_updates",)
    assert choose_budget(budget_table(rows, rule.fallback, 10)) == 3  # naive at n = 2, equal updates: 0.12 + 0.1·S
    main_cfg = replace(cfg, seed=0, seeds=4, trainer=replace(cfg.trainer, num_stages=3))
    text, tables = regime_page(
        [("val", replace(cfg, seed=1000), rows)], ("main", main_cfg, _runs(main_cfg, SLOPES)), rule, "cmd"
    )
    assert "**The regime: candidate 1 at S = 3 stages, by the fallback (the rule itself picked none).**" in text
    assert {r["rule"] for r in tables["budgets"]} == {"rule", "fallback"}
    with pytest.raises(ValueError, match="ceiling_on"):
        BudgetRule(ceiling_on=("sometimes",))
