"""The telephone-chain experiment: pure helpers, a smoke run's files, drift bookkeeping, resume, the CLI."""

from __future__ import annotations

import csv
import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from orchestra.experiments.chain.analysis import equal_episode_stage, fit_alpha, regression_fraction
from orchestra.experiments.chain.config import ChainExperimentConfig, chain_config, trainer_config
from orchestra.experiments.chain.run import RUN_FIELDS, run_chain_experiment, run_one, trust_counts
from orchestra.teamtr.chain import ChainTeam, drift_b, drift_d, warm_start
from orchestra.teamtr.config import CHAIN_TRAINER
from trajectories.rundir import ConfigMismatchError

pytestmark = pytest.mark.usefixtures("one_thread")

SMOKE = ChainExperimentConfig.smoke(seeds=2)


def _csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


# ----------------------------------------------------------------------------------------------------------------
# pure helpers


def test_fit_alpha_recovers_power_laws() -> None:
    ns = [2, 3, 4, 6, 8]
    assert fit_alpha(ns, [0.01 * n**2 for n in ns]) == pytest.approx(2.0, abs=1e-12)
    assert fit_alpha(ns, [3.0 * n for n in ns]) == pytest.approx(1.0, abs=1e-12)
    assert fit_alpha(ns, [0.5] * 5) == pytest.approx(0.0, abs=1e-12)
    # non-positive / NaN drifts are dropped; fewer than two points → NaN
    assert fit_alpha([2, 4, 8], [4.0, 0.0, 64.0]) == pytest.approx(2.0)
    assert math.isnan(fit_alpha([2, 4], [1.0, math.nan]))


def test_equal_episode_stage() -> None:
    # naive at n = 3, B = 10: 10 episodes per stage; teamtr's final count 30 → the first stage reaching it is 3
    eps = [0, 10, 20, 30, 40, 50, 60]
    assert equal_episode_stage(eps, 30) == 3
    assert equal_episode_stage(eps, 25) == 3  # first stage at or above the target
    assert equal_episode_stage(eps, 0) == 0
    assert equal_episode_stage(eps, 1000) == 6  # never reached: the nearest
    assert equal_episode_stage([0, 10, 20], 14) == 2
    with pytest.raises(ValueError):
        equal_episode_stage([], 3)


def test_regression_fraction() -> None:
    j = [0.5, 0.6, 0.595, 0.58, 0.7, 0.6995, 0.8]  # drops: −0.005, −0.015, −0.0005 over 6 stages
    assert regression_fraction(j, 0.01) == pytest.approx(1 / 6)
    assert regression_fraction(j, 0.001) == pytest.approx(2 / 6)
    assert regression_fraction([0.1, 0.2, 0.3], 0.001) == 0.0
    assert math.isnan(regression_fraction([0.4], 0.01))


def test_config_validation_and_stages() -> None:
    with pytest.raises(ValueError):
        ChainExperimentConfig(schemes=("nope",))  # type: ignore[arg-type]
    five = replace(CHAIN_TRAINER, num_stages=5)
    cfg = ChainExperimentConfig(trainer=five)
    assert cfg.stages_for("teamtr", 4) == 5 and cfg.stages_for("naive", 4) == 20
    assert ChainExperimentConfig(trainer=five, extend_for_episodes=False).stages_for("happo", 4) == 5
    with pytest.raises(ValueError, match="order"):
        ChainExperimentConfig(trainer=replace(CHAIN_TRAINER, order="sideways"))  # type: ignore[arg-type]


def test_experiment_trainer_is_the_chain_trainer_with_the_run_s_scheme_stages_and_seed() -> None:
    """One source of the trainer's settings: every run's TeamTRConfig is CHAIN_TRAINER but for three fields."""
    cfg = ChainExperimentConfig.demo()
    for scheme in cfg.schemes:
        got = trainer_config(cfg, 4, 1, scheme)
        assert replace(got, scheme=CHAIN_TRAINER.scheme, num_stages=6, seed=CHAIN_TRAINER.seed) == replace(
            CHAIN_TRAINER, num_stages=6
        )
        assert got.scheme == scheme and got.num_stages == cfg.stages_for(scheme, 4)
    assert len({trainer_config(cfg, 4, s, "teamtr").seed for s in range(4)}) == 4  # seeds differ per run


# ----------------------------------------------------------------------------------------------------------------
# a smoke run


@pytest.fixture(scope="module")
def chain_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import torch

    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("chain")
    run_chain_experiment(SMOKE, out, say=lambda _line: None)
    return out


def test_smoke_run_writes_every_file(chain_dir: Path) -> None:
    for name in ("config.json", "runs.csv", "final.csv", "regressions.csv", "drift.csv", "alpha.csv", "summary.md"):
        assert (chain_dir / name).stat().st_size > 0, name
    for name in ("learning_curves.png", "drift.png"):
        assert (chain_dir / name).read_bytes()[:4] == b"\x89PNG", name
    runs = _csv(chain_dir / "runs.csv")
    assert list(runs[0]) == list(RUN_FIELDS)
    # teamtr: stages 0..2; naive: n × 2 stages (equal-episodes accounting)
    expected = sum((1 + SMOKE.stages_for(s, n)) * SMOKE.seeds for n in SMOKE.ns for s in SMOKE.schemes)
    assert len(runs) == expected
    for r in runs:
        n, stage = int(r["n"]), int(r["stage"])
        per_stage = n * SMOKE.batch_size if r["scheme"] == "teamtr" else SMOKE.batch_size
        assert int(r["episodes"]) == stage * per_stage and int(r["tokens"]) == n * int(r["episodes"])
        assert 0.0 <= float(r["J"]) <= 1.0
        assert (r["drift_b"] == "") == (stage == 0) and (r["drift_d"] == "") == (stage == 0)
    # paired: every scheme starts from the same warm team at a given (n, seed)
    start = {(r["n"], r["seed"], r["scheme"]): r["J"] for r in runs if r["stage"] == "0"}
    for n in SMOKE.ns:
        for s in range(SMOKE.seeds):
            assert start[(str(n), str(s), "teamtr")] == start[(str(n), str(s), "naive")]

    final = _csv(chain_dir / "final.csv")
    assert len(final) == 2 * len(SMOKE.ns) * len(SMOKE.schemes)
    assert {"accounting", "n", "scheme", "stage_mean", "episodes_mean", "J_mean", "J_sd"} <= set(final[0])
    for r in final:
        if r["accounting"] == "equal_episodes":
            assert float(r["episodes_mean"]) == SMOKE.num_stages * int(r["n"]) * SMOKE.batch_size
        else:
            assert float(r["stage_mean"]) == SMOKE.num_stages
    alpha = {r["scheme"]: r for r in _csv(chain_dir / "alpha.csv")}
    assert set(alpha) == set(SMOKE.schemes) and math.isfinite(float(alpha["naive"]["alpha_b"]))
    assert float(alpha["teamtr"]["ratio_b_vs_teamtr_at_n3"]) == pytest.approx(1.0)
    assert len(_csv(chain_dir / "regressions.csv")) == len(SMOKE.ns) * len(SMOKE.schemes)
    text = (chain_dir / "summary.md").read_text()
    for heading in ("equal stages", "equal sampled episodes", "Regressions", "Drift (b)", "Drift (d)", "α (b)"):
        assert heading in text
    assert "Trust region" in text and "Acceptance criteria" in text
    # 2 seeds: the verdicts over seeds are there, but no null check can be run (it needs 4 seeds of one scheme)
    assert "## Verdicts over seeds" in text and "**Null check: not run." in text and "**Primary family**" in text


def test_trust_region_accounting(chain_dir: Path) -> None:
    """Every stage row counts its agent-updates (n per stage; the joint schemes too), none accepted above δ, and the
    per-scheme totals in trust.csv add the rows up."""
    runs = _csv(chain_dir / "runs.csv")
    for r in runs:
        n, stage = int(r["n"]), int(r["stage"])
        assert int(r["agent_updates"]) == (n if stage > 0 else 0)
        assert int(r["kl_over"]) == 0 and int(r["accepted"]) <= int(r["agent_updates"])
        if stage > 0 and int(r["accepted"]):
            assert 0.0 <= float(r["kl_max_ratio"]) <= 1.0
    trust = {r["scheme"]: r for r in _csv(chain_dir / "trust.csv")}
    for scheme in SMOKE.schemes:
        mine = [r for r in runs if r["scheme"] == scheme]
        for key in ("agent_updates", "accepted", "bound"):
            assert int(trust[scheme][key]) == sum(int(r[key]) for r in mine), (scheme, key)
    assert sum(int(t["bound"]) for t in trust.values()) > 0  # lr 3e-2 with δ 0.03: the full step often breaks δ
    # optimizer steps kept: at most epochs × minibatches per agent-update, and what the report's table shows
    per_update = SMOKE.trainer.num_epochs * SMOKE.trainer.num_minibatches
    summary = (chain_dir / "summary.md").read_text()
    for scheme, t in trust.items():
        mine = [r for r in runs if r["scheme"] == scheme]
        assert float(t["steps"]) == pytest.approx(sum(float(r["steps"]) for r in mine))
        assert 0 < float(t["steps"]) <= per_update * int(t["agent_updates"])
        steps = float(t["steps"]) / int(t["agent_updates"])
        assert f"| {scheme} | {t['agent_updates']} | {steps:.2f} | {t['accepted']} |" in summary
    checks = {r["criterion"]: r for r in _csv(chain_dir / "checks.csv")}
    assert checks["teamtr: accepted updates with KL ≤ δ"]["ok"] == "True"
    assert checks["drift (b) naive / teamtr at n = 3"]["ok"] == "n/a"  # only decided at n = 8


def test_trust_counts_by_hand() -> None:
    u = {
        "agent/a/kl_trust": 0.02,
        "agent/a/delta": 0.01,
        "agent/a/accepted": 0.0,
        "agent/a/early_stopped": 1.0,
        "agent/a/optimizer_steps": 0.0,
        "agent/b/kl_trust": 0.005,
        "agent/b/delta": 0.01,
        "agent/b/accepted": 1.0,
        "agent/b/early_stopped": 1.0,
        "agent/b/optimizer_steps": 1.0,
    }
    got = trust_counts(
        [
            u,
            {
                "agent/a/kl_trust": 0.012,
                "agent/a/delta": 0.01,
                "agent/a/accepted": 1.0,
                "agent/a/early_stopped": 0.0,
                "agent/a/optimizer_steps": 2.0,
            },
        ],
        ("a", "b"),
    )
    assert got == dict(agent_updates=3, steps=3.0, accepted=2, bound=2, kl_over=1, kl_max_ratio=pytest.approx(1.2))


def test_drift_matches_chain_functions_on_the_same_snapshots(chain_dir: Path) -> None:
    team = ChainTeam(chain_config(SMOKE, 2, 0))
    warm_start(team)
    warm = [team.adapter_state(i) for i in range(2)]
    rows, rec = run_one(SMOKE, team, warm, 2, "teamtr", 0)
    assert rec.orders[0] == [0, 1] and len(rec.snaps[0]) == 3
    assert rows[1]["drift_b"] == drift_b(rec.snaps[0], [0, 1], "fresh")
    assert rows[1]["drift_d"] == drift_d(rec.snaps[0], [0, 1], "fresh")
    # the experiment's runs.csv holds the same numbers (deterministic runs, exact float round trip)
    written = [r for r in _csv(chain_dir / "runs.csv") if (r["n"], r["scheme"], r["seed"]) == ("2", "teamtr", "0")]
    assert [float(r["drift_b"] or "nan") for r in written][1:] == [r["drift_b"] for r in rows][1:]
    assert [float(r["J"]) for r in written] == [r["J"] for r in rows]

    # joint: one update = n virtual sequential updates on the stage-start batch
    rows_j, rec_j = run_one(SMOKE, team, warm, 2, "joint", 0)
    assert rec_j.orders[0] == [0, 1] and len(rec_j.snaps[0]) == 3
    start, mid, end = rec_j.snaps[0]
    np.testing.assert_array_equal(mid[0], end[0])
    np.testing.assert_array_equal(mid[1], start[1])
    assert rows_j[1]["drift_b"] == drift_b(rec_j.snaps[0], [0, 1], "stale")


def test_resume_skips_complete_runs_and_refuses_another_config(
    chain_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = (chain_dir / "runs.csv").read_text()
    run_chain_experiment(SMOKE, chain_dir)
    assert "chain n=" not in capsys.readouterr().err  # nothing retrained
    assert (chain_dir / "runs.csv").read_text() == before
    with pytest.raises(ConfigMismatchError, match=r"seeds 2 → 3; use another output directory"):
        run_chain_experiment(ChainExperimentConfig.smoke(seeds=3), chain_dir, say=lambda _line: None)


def test_cli_experiment_chain_smoke(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from orchestra.cli import main

    out = tmp_path / "cli"
    rc = main(
        ["experiment", "chain", "--smoke", "--ns", "2", "--schemes", "teamtr", "naive", "--out", str(out), "--quiet"]
    )
    assert rc == 0
    assert f"summary: {out / 'summary.md'}" in capsys.readouterr().out
    assert (out / "summary.md").exists() and (out / "drift.png").exists()
    for cmd in (["experiment"], ["experiment", "chain"]):
        with pytest.raises(SystemExit) as e:
            main([*cmd, "--help"])
        assert e.value.code == 0
        assert f"usage: orchestra {' '.join(cmd)}" in capsys.readouterr().out


def test_demo_phase2_runs_the_chain_experiment_and_align_and_resumes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``orchestra demo --phases 2``: the demo-scale chain experiment (every scheme) and a Stage-0 swap; a rerun reuses both."""
    from orchestra.cli import main

    assert main(["demo", "--phases", "2", "--out", str(tmp_path), "--quiet"]) == 0
    text = capsys.readouterr().out
    assert "Phase 2 (demo scale)" in text and "Acceptance criteria" in text and "recovered fraction" in text
    chain = tmp_path / "phase2" / "chain"
    assert {r["scheme"] for r in _csv(chain / "runs.csv")} == {"teamtr", "naive", "joint", "happo"}
    report = json.loads((tmp_path / "phase2" / "align" / "report.json").read_text())
    runs_before = (chain / "runs.csv").read_bytes()
    assert main(["demo", "--phases", "2", "--out", str(tmp_path), "--quiet"]) == 0
    assert (chain / "runs.csv").read_bytes() == runs_before  # resumed: nothing re-run
    assert json.loads((tmp_path / "phase2" / "align" / "report.json").read_text()) == report
    assert "swap shock" in capsys.readouterr().out


# ----------------------------------------------------------------------------------------------------------------
# the controls and the new readings


def test_controls_have_teamtr_s_data_volume() -> None:
    """stale_indep (a trainer scheme) and naive_bigB (a chain variant: naive with n × the batch) sample teamtr's
    episodes per stage, so the equal-episodes accounting reads them at equal stages."""
    cfg = ChainExperimentConfig.demo(schemes=("teamtr", "naive", "stale_indep", "naive_bigB"))
    big = trainer_config(cfg, 4, 0, "naive_bigB")
    assert big.scheme == "naive" and big.batch_size == 4 * cfg.batch_size and big.num_stages == cfg.num_stages
    indep = trainer_config(cfg, 4, 0, "stale_indep")
    assert indep.scheme == "stale_indep" and indep.batch_size == cfg.batch_size and indep.num_stages == cfg.num_stages
    assert cfg.stages_for("naive", 4) == 4 * cfg.num_stages


def test_stale_gap_certificate_and_alpha_readings(tmp_path: Path) -> None:
    from orchestra.experiments.chain.analysis import drift_terms
    from orchestra.teamtr.chain import exact_success_with, exact_surrogate, policy_matrices, stale_gap_terms

    cfg = ChainExperimentConfig.smoke(schemes=("teamtr", "naive", "stale_indep", "naive_bigB"), ns=(2, 3, 4))
    result = run_chain_experiment(cfg, tmp_path, say=lambda _line: None)
    rows = _csv(tmp_path / "runs.csv")
    gaps = {s: [float(r["stale_gap"]) for r in rows if r["scheme"] == s and r["stage"] != "0"] for s in cfg.schemes}
    assert all(g == 0.0 for g in gaps["teamtr"])  # a fresh batch has no stale gap
    assert all(max(gaps[s]) > 0 for s in ("naive", "stale_indep", "naive_bigB"))
    cert = _csv(tmp_path / "certificate.csv")
    assert [r["scheme"] for r in cert] == list(cfg.schemes)
    assert all(int(r["stages"]) > 0 for r in cert)
    alpha = {r["scheme"]: r for r in _csv(tmp_path / "alpha.csv")}
    assert alpha["teamtr"]["alpha_b_without_n2"] and alpha["naive"]["alpha_b_vs_terms"]
    assert drift_terms("teamtr", 8) == 7 and drift_terms("naive", 8) == 28
    assert "Certificate proxy" in result.section("certificate")
    paired = _csv(tmp_path / "paired.csv")  # teamtr − each scheme at the largest n, per accounting
    assert {r["vs"] for r in paired} == {"naive", "stale_indep", "naive_bigB"} and {r["n"] for r in paired} == {"4"}
    # the exact surrogate of a change is the first-order change of J
    team = ChainTeam(chain_config(cfg, 3, 0))
    warm_start(team)
    mats = policy_matrices(team)
    v = mats[1].shape[0]
    tilt = 1e-4 * (np.eye(v) - 1.0 / v)  # rows sum to 0: stays a policy to first order
    lin = exact_surrogate(mats, 1, mats[1], mats[1] + tilt)
    assert lin == pytest.approx(exact_success_with(mats, 1, mats[1] + tilt) - exact_success_with(mats, 1, mats[1]))
    assert stale_gap_terms([mats, mats], [1], "fresh")[0] == 0.0


def test_chain_page_opens_with_findings_cited_from_its_tables(chain_dir: Path, tmp_path: Path) -> None:
    from orchestra.experiments.chain.page import chain_page
    from orchestra.report.findings import check_findings

    notes = tmp_path / "notes.md"
    notes.write_text("## Reading the runs\n\nBy hand.\n")
    text, found = chain_page([("smoke", str(chain_dir))], str(notes), tmp_path / "page.md", "cmd")
    assert text.index("## Findings") < text.index("## Reading the runs") < text.index("## The smoke run")
    assert (tmp_path / "page_curves_smoke.png").exists() and (tmp_path / "page_verdicts.png").exists()
    assert found[0].text.startswith("smoke run: the trust region acted")
    trust = {r["scheme"]: r for r in _csv(chain_dir / "trust.csv")}
    share = 100 * int(trust["teamtr"]["bound"]) / int(trust["teamtr"]["agent_updates"])
    assert f"{share:.1f}% of teamtr's" in found[0].text
    assert any("teamtr − naive" in f.text for f in found)  # the primary family's rows, cited
    assert check_findings(text, found) == []
    # a number changed in the trust table below, or a finding dropped from the page, is caught
    row = next(line for line in text.splitlines() if line.startswith("| teamtr | ") and "%)" in line)
    assert check_findings(text.replace(row, row.replace(f"({share:.1f}%)", "(0.5%)")), found)
    assert check_findings(text.replace(f"- {found[1].text}\n", ""), found)
