"""The phase-1 protocol's bookkeeping: the test ledger and the plain-words caveats."""

from __future__ import annotations

import csv
import dataclasses
import json
import lzma
import math
import shutil
from pathlib import Path

import pytest

from orchestra.jobs.phase1 import LedgerError, Phase1Config, ledger_entry, ledger_key, read_ledger
from orchestra.jobs.phase1_report import forced_md
from orchestra.report.evaluation import PairedRow
from orchestra.report.protocol import HeadroomRow, not_shown
from orchestra.runtime.session import RunOptions


def test_the_test_ledger_refuses_a_second_evaluation_unless_forced(tmp_path: Path) -> None:
    ledger = tmp_path / "test_ledger.jsonl"
    cfg = Phase1Config()
    key = ledger_key(cfg, "arithmetic", "cql-s0")
    first = {"config": "cql-a0.1", "tasks": 150, "model_sha256": "ab"}
    retrained = {**first, "model_sha256": "cd"}
    assert ledger_entry(ledger, key, first) is True
    assert ledger_entry(ledger, key, dict(first)) is False  # a resumed run replays it: nothing added, nothing refused
    assert ledger_entry(ledger, ledger_key(cfg, "arithmetic", "bc-s0"), first) is True  # another configuration
    with pytest.raises(LedgerError) as refused:  # the same released configuration, retrained: a second evaluation
        ledger_entry(ledger, key, retrained)
    message = str(refused.value)
    assert "\n" not in message and message.startswith(f"{ledger}: ")
    assert '"conductor": "cql-s0"' in message and '"model_sha256": "cd"' in message and "--force-test REASON" in message
    with pytest.raises(LedgerError):
        ledger_entry(ledger, key, retrained, force="  ")  # a reason must be written
    assert len(read_ledger(ledger)) == 2
    assert ledger_entry(ledger, key, retrained, force="the encoder dropped a feature") is True
    assert ledger_entry(ledger, key, retrained) is False  # the forced evaluation resumes without being forced again
    with pytest.raises(LedgerError):  # back to the first model is a third evaluation, not a resume
        ledger_entry(ledger, key, first)
    # a replicate run (other sampling seeds) is its own declared entry
    replicate = ledger_key(dataclasses.replace(cfg, run=RunOptions(seed=1)), "arithmetic", "cql-s0")
    assert replicate != key and ledger_entry(ledger, replicate, first) is True
    entries = read_ledger(ledger)
    assert [e.get("forced") for e in entries] == [None, None, "the encoder dropped a feature", None]
    assert all("time" in e for e in entries)
    (listed,) = [ln for ln in forced_md(entries) if ln.startswith("| arithmetic")]
    assert "cql-s0" in listed and "the encoder dropped a feature" in listed and "model_sha256 cd" in listed
    assert forced_md(entries[:2]) == []


def test_learner_configurations_cover_every_alpha_and_keep_checkpoints() -> None:
    cfg = Phase1Config.reproduce()
    labels = cfg.learner_configs()
    assert {"bc", "fbc", "dqn", "ddqn", "bcq", "cql-a0.02", "cql-a0.1", "cql-a0.5"} == set(labels)
    assert all(c.keep_epochs and c.seed == cfg.seeds[0] for c in labels.values())
    assert len(cfg.seeds) >= 3 and cfg.eval_episodes >= 150
    assert 2 * len(labels) >= 10  # mid-training and final checkpoints: at least 10 policies for the FQE check
    assert all(c.features == "structural" for c in labels.values())
    # the feature set is tuned like α: every configuration with each set, the sentence embeddings' labelled +emb
    both = dataclasses.replace(cfg, algos=["bc", "cql"], cql_alphas=[0.1], features=["structural", "all"])
    feats = {label: c.features for label, c in both.learner_configs().items()}
    assert feats == {"bc": "structural", "bc+emb": "all", "cql-a0.1": "structural", "cql-a0.1+emb": "all"}


def test_caveats_name_small_headroom_and_a_validation_choice_that_differs_on_test() -> None:
    row = HeadroomRow(
        "arithmetic", 150, "pipeline", 0.30, "heuristic", 0.34, 0.36, 0.06, "cql", 0.31, 0.01, 0.2, 0.1, 3
    )
    text = "\n".join(not_shown([row], [], seeds=[0, 1, 2], run_seed=0))
    assert "under 10" in text and "validation chose `pipeline`" in text and "No learned conductor" in text


def test_without_capturable_headroom_no_captured_fraction_is_claimed() -> None:
    """The replicate oracle at or below the best fixed schedule (all of the in-sample headroom was luck): the table
    shows no captured fraction, the finding says so, and every number it cites is in the table."""
    from orchestra.jobs.phase1_report import Tables, phase1_findings
    from orchestra.report.findings import check_findings, findings_section
    from orchestra.report.protocol import headroom_table_md

    row = HeadroomRow(
        "arithmetic", 10, "single_shot", 0.30, "pipeline", 0.40, 0.60, 0.30, "bc (bc)", 0.30, 0.0,
        math.nan, math.nan, 1, 0.5, 0.20, -0.10, 0.40,
    )  # fmt: skip
    table = headroom_table_md([row])
    assert "| — | 1 |" in table and "nan" not in table
    (found,) = phase1_findings(Tables([], [], [row], [], [], {}, []))
    assert "no headroom to capture" in found.text and "+40.0 points" in found.text and "nan" not in found.text
    page = "\n".join([*findings_section([found], "Generated."), "## Headroom", "", table])
    assert check_findings(page, [found]) == []


def test_caveats_name_a_luck_free_oracle_and_success_bought_with_price() -> None:
    """No luck (a greedy team's replicate repeats the main run) is said in words; learners more successful than the
    baseline at a price whose interval lies above it are named with their price ratios and return differences."""
    row = HeadroomRow(
        "arithmetic_priced", 150, "coder", 0.407, "coder", 0.407, 0.627, 0.22, "cql", 0.50, 0.01, 0.42, 0.06, 3,
        0.3, 0.627, 0.22, 0.0,
    )  # fmt: skip

    def paired(conductor: str, diff: float, price: tuple[float, float, float], ret: float) -> PairedRow:
        return PairedRow(
            "arithmetic", "arithmetic_priced", conductor, "coder", False, 150, 0.407 + diff, 0.407, diff, diff - 0.07,
            diff + 0.07, 22, 8, 0.1, 0.3, diff - 0.06, 0.01, 0.01, ret, ret - 0.08, ret + 0.08, 2.0, 1.9, 2.1, 5.0,
            4.5, 5.5, "non-inferior", *price,
        )  # fmt: skip

    rows = [
        paired("cql-s0", 0.080, (2.43, 2.22, 2.66), -0.016),
        paired("cql-s1", 0.107, (2.82, 2.53, 3.19), -0.015),
        paired("fbc-s0", 0.053, (0.90, 0.70, 1.10), 0.002),  # its price interval spans 1: not named
    ]
    text = "\n".join(not_shown([row], rows, seeds=[0, 1, 2], run_seed=0))
    assert "no best-of-N luck" in text and "best-of-N luck (it picks" not in text
    assert "`cql-s0`, `cql-s1` solve more tasks than `coder` (+8.0 to +10.7 points) at 2.43 to 2.82× its price" in text
    assert "-0.016 to -0.015" in text and "`fbc-s0`" not in text
    lucky = dataclasses.replace(row, replicate_oracle_success=0.6, capturable=0.193, luck=0.027)
    assert "no best-of-N luck" not in "\n".join(not_shown([lucky], [], seeds=[0], run_seed=0))


def test_caveats_say_when_a_rule_of_the_menu_earns_a_learners_verdict_too() -> None:
    row = HeadroomRow("arithmetic", 150, "critique", 0.14, "heuristic", 0.21, 0.28, 0.14, "bc", 0.19, 0.0, 0.38, 0.0, 3)

    def paired(conductor: str, rule_based: bool, verdict: str) -> PairedRow:
        return PairedRow(
            "arithmetic",
            "arithmetic",
            conductor,
            "critique",
            rule_based,
            150,
            0.19,
            0.14,
            0.05,
            0.01,
            0.1,
            10,
            2,
            1.0,
            1.0,
            0.01,
            0.001,
            0.001,
            0.1,
            0.05,
            0.15,
            0.5,
            0.5,
            0.51,
            0.56,
            0.54,
            0.59,
            verdict,
        )

    matched = [paired("bc-s0", False, "cheaper"), paired("pipeline", True, "cheaper")]
    text = "\n".join(not_shown([row], matched, seeds=[0, 1, 2], run_seed=0))
    assert "*cheaper* verdicts (`bc-s0`)" in text and "(`pipeline`)" in text and "`critique`" in text
    alone = [paired("bc-s0", False, "cheaper"), paired("pipeline", True, "non-inferior")]
    assert "verdicts (" not in "\n".join(not_shown([row], alone, seeds=[0, 1, 2], run_seed=0))


def _scripted(monkeypatch: pytest.MonkeyPatch, **kw: object) -> Phase1Config:
    """A small phase-1 config whose LLM workers are scripted (the real env, tools, d3rlpy and report)."""
    import orchestra.runtime.session as session_mod
    from tests.scripted import scripted_workers

    monkeypatch.setattr(session_mod, "build_workers", lambda team, tools, **_: scripted_workers(team))
    return Phase1Config(n_steps_per_epoch=30, run=RunOptions(use_cache=False, progress=False), **kw)  # type: ignore[arg-type]


@pytest.mark.slow
def test_the_protocol_end_to_end_with_scripted_workers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """run_phase1 on the arithmetic team with scripted LLM workers (the real env, tools, d3rlpy and report): the
    baseline is chosen on validation episodes, test and validation tasks are disjoint, every test evaluation is in
    the ledger once, and the oracle is at least the best fixed schedule and costs tokens."""
    from orchestra.jobs.phase1 import run_phase1
    from orchestra.report.evaluation import summarize
    from orchestra.report.findings import check_findings, read_findings
    from trajectories import read_many

    cfg = _scripted(
        monkeypatch, teams=["arithmetic"], train_episodes=6, validation_episodes=6, eval_episodes=8,
        algos=["bc", "cql"], cql_alphas=[0.1, 0.5], seeds=[0, 1], n_steps=60, fqe_steps=30,
        features=["structural", "all"],
    )  # fmt: skip
    out = tmp_path / "run"
    res = run_phase1(cfg, out)
    for key in ("summary", "ledger", "headroom", "fqe", "cost_quality"):
        assert res.paths[key].exists(), key
    val_files = sorted((out / "validation" / "arithmetic").glob("*.jsonl"))
    val = read_many([f for f in val_files if f.name != "menu-replicate.jsonl"]).episodes
    test = read_many(sorted((out / "test" / "arithmetic").glob("*.jsonl"))).episodes
    assert not {e.task.id for e in val} & {e.task.id for e in test}
    assert {e.task.split for e in val} == {"validation"} and {e.task.split for e in test} == {"test"}
    menu = {"tool_only", "single_shot", "pipeline", "round_robin", "heuristic", "resample", "critique"}
    val_rows = [r for r in summarize(val) if r.conductor in menu]
    best = max(val_rows, key=lambda r: (r.success_rate, r.mean_return, [-ord(c) for c in r.conductor])).conductor
    assert {h.best_fixed for h in res.headroom} == {best}
    for h in res.headroom:
        assert h.oracle_success >= h.best_fixed_success and h.headroom == pytest.approx(
            h.oracle_success - h.best_fixed_success
        )
        assert h.oracle_cost > 0 and h.seeds == 2
        # the replicate oracle (picked on other sampling seeds, scored here) is what a router could capture; the
        # in-sample oracle's surplus over it is luck, never negative
        assert h.capturable == pytest.approx(h.replicate_oracle_success - h.best_fixed_success)
        assert h.luck == pytest.approx(h.oracle_success - h.replicate_oracle_success) and h.luck >= 0
    # the headroom sized on validation before training: the menu again on the validation tasks with other draws
    val_rep = read_many([out / "validation" / "arithmetic" / "menu-replicate.jsonl"]).episodes
    val_menu = [e for e in val if e.conductor.name in menu]
    assert {e.task.id for e in val_rep} == {e.task.id for e in val_menu}
    assert not {e.seed for e in val_rep} & {e.seed for e in val_menu}
    with (out / "validation" / "headroom.csv").open() as f:
        (vh,) = list(csv.DictReader(f))
    assert vh["split"] == "validation" and vh["best_fixed"] == best and int(vh["tasks"]) == 6
    assert float(vh["capturable"]) == pytest.approx(
        float(vh["replicate_oracle_success"]) - float(vh["best_fixed_success"])
    )
    assert float(vh["luck"]) >= 0 and float(vh["oracle_success"]) >= float(vh["best_fixed_success"])
    # bc, cql-a0.1, cql-a0.5, each with and without the sentence embeddings × (mid-training, final)
    assert len(res.fqe) == 6 * 2 and {f.policy.split("@")[0] for f in res.fqe} >= {"bc+emb", "cql-a0.5+emb"}
    ledger = res.paths["ledger"].read_text().splitlines()
    assert len(ledger) == 2 + 2 * 2  # the menu, its replicate run, then each released learner × seed
    replicate = [json.loads(line) for line in ledger if json.loads(line)["conductor"] == "menu-replicate"]
    assert [e["sampling_seed"] for e in replicate] == [cfg.run.seed + cfg.replicate_offset]
    rep_eps = read_many([out / "test" / "arithmetic" / "menu-replicate.jsonl"]).episodes
    test_files = sorted((out / "test" / "arithmetic").glob("*.jsonl"))
    main_eps = read_many([f for f in test_files if f.name != "menu-replicate.jsonl"]).episodes
    assert {e.task.id for e in rep_eps} == {e.task.id for e in main_eps if e.conductor.name != "random"}
    assert not {e.seed for e in rep_eps} & {e.seed for e in main_eps}  # the same tasks, other draws
    summary = res.paths["summary"].read_text()
    assert "## What these numbers do not show" in summary and "oracle" in summary
    assert "## Headroom sized on validation, before any learner was trained" in summary
    # success per difficulty level: one row per rule (tool_only aside) and learner evaluation, counts per level
    levels = summary.split("## Success per difficulty level (test)")[1].split("## Headroom")[0]
    level_rows = [ln for ln in levels.splitlines() if ln.startswith("| arithmetic |")]
    assert len(level_rows) == len(menu) - 1 + 2 * 2 and "| arithmetic | tool_only |" not in levels
    for ln in level_rows:
        name = ln.split("|")[2].strip()
        eps = [e for e in main_eps if e.conductor.name == name]
        counts = [c.split("(")[1].rstrip(") ") for c in ln.split("|")[3:-1] if "(" in c]
        assert sum(int(c.split("/")[0]) for c in counts) == sum(e.success for e in eps)
        assert sum(int(c.split("/")[1]) for c in counts) == len(eps)
    # the cost–quality verdict: every learner evaluation paired with the hull's rules at its place, one line each
    assert "## The cost–quality verdict" in summary
    assert {p.conductor for p in res.hull} == {f"{a}-s{s}" for a in ("bc", "cql") for s in (0, 1)}
    assert all(p.baseline in menu for p in res.hull) and summary.count("the hull") >= 4
    # the page opens with findings whose every number is in a table below them
    found = read_findings(res.paths["findings"])
    assert len(found) == 3 and summary.index("## Findings") < summary.index("## Headroom")
    # the simple router: fitted on the validation menu, scored on the test menu, in a table, a finding and a caveat
    assert "## The simple router" in summary and "the simple router fitted on validation" in found[1].text
    section = summary.split("## The simple router")[1].split("\n## ")[0]
    router_rows = [ln for ln in section.splitlines() if ln.startswith("| arithmetic")]
    assert len(router_rows) == 1 and "the simple router fitted on validation (" in summary
    assert check_findings(summary, found) == []
    best = max(res.headroom, key=lambda h: (h.learner_success_mean, -h.learner_success_sd))
    assert f"the best learner, {best.learner}, {100 * best.learner_success_mean:.1f}%" in found[0].text
    succ = f"{100 * best.learner_success_mean:.1f}% ± {100 * best.learner_success_sd:.1f}"
    stale = summary.replace(f"| {succ} |", "| 12.3% ± 4.5 |")
    assert check_findings(stale, found)  # a table edited after the findings were written is caught
    # the report rebuilt from its inputs alone (report/inputs copied without the run): the same page, nothing played
    from orchestra.jobs.phase1 import ReproduceConfig, reproduce
    from orchestra.jobs.phase1_inputs import EPISODES_FILE

    bare = tmp_path / "bare"
    shutil.copytree(out / "report" / "inputs", bare / "report" / "inputs")
    rebuilt = reproduce(ReproduceConfig(out=str(bare), report_only=True))
    assert rebuilt.paths["summary"].read_text() == res.paths["summary"].read_text()
    assert (bare / "report" / "cost_quality.png").exists() and not (bare / "test").exists()
    size = sum(f.stat().st_size for f in (bare / "report" / "inputs").iterdir())
    assert size < sum(f.stat().st_size for f in (out / "test").rglob("*.jsonl")) / 20
    with pytest.raises(FileNotFoundError, match=r"report_inputs\.json: missing; --report-only rebuilds"):
        reproduce(ReproduceConfig(out=str(tmp_path / "nothing"), report_only=True))
    with lzma.open(bare / "report" / "inputs" / EPISODES_FILE, "ab") as f:
        f.write(b'{"schema_version": 1, "episode_id": ""}\n')
    with pytest.raises(ValueError, match=rf"{EPISODES_FILE}:{len(main_eps) + 1}: \w+: missing field"):
        reproduce(ReproduceConfig(out=str(bare), report_only=True))
    again = run_phase1(cfg, out)  # a rerun resumes: no new test evaluation, the same tables
    assert res.paths["ledger"].read_text().splitlines() == ledger
    assert [h.learner_success_mean for h in again.headroom] == [h.learner_success_mean for h in res.headroom]
    more = dataclasses.replace(cfg, eval_episodes=9)  # more test tasks: a second evaluation of the same menu
    with pytest.raises(LedgerError, match="--force-test REASON"):
        run_phase1(more, out)
    assert res.paths["ledger"].read_text().splitlines() == ledger  # refused before anything was played or dropped
    forced = run_phase1(dataclasses.replace(more, force_test="a ninth task"), out)
    entries = read_ledger(forced.paths["ledger"])
    assert len(entries) == 2 * len(ledger) and {e["forced"] for e in entries[len(ledger) :]} == {"a ninth task"}
    summary = forced.paths["summary"].read_text()
    assert "### Forced test evaluations" in summary and summary.count("| a ninth task |") == len(ledger)


@pytest.mark.slow
def test_a_priced_teams_cost_is_its_price(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a priced team the oracle's cost and the cost–quality plane are the team file's prices, not tokens: the
    oracle picks the cheapest successful schedule by price."""
    from orchestra.jobs.phase1 import run_phase1
    from orchestra.report import stats
    from trajectories import read_many

    cfg = _scripted(
        monkeypatch, teams=["arithmetic_priced"], train_episodes=4, validation_episodes=4, eval_episodes=6,
        algos=["bc"], seeds=[0], n_steps=30, fqe_steps=20,
    )  # fmt: skip
    res = run_phase1(cfg, tmp_path / "run")
    menu = [e for e in read_many([tmp_path / "run" / "test" / "arithmetic_priced" / "menu.jsonl"]).episodes]
    outcomes: dict[str, dict[object, tuple[bool, float]]] = {}
    for e in menu:
        if e.conductor.name != "random":
            outcomes.setdefault(e.conductor.name, {})[e.task.id] = (e.success, e.price)
    oracle = stats.oracle_router(outcomes)
    assert any(e.price > 0 for e in menu) and all(e.price < e.total_tokens for e in menu if e.price > 0)
    (h,) = res.headroom
    assert h.oracle_cost == pytest.approx(sum(c.cost for c in oracle.values()) / len(oracle))
    # the paired table gains the price ratio, and the legend says what it counts for
    summary = res.paths["summary"].read_text()
    assert "| price ratio [95% CI] |" in summary and "Price: the team file's worker prices" in summary


def test_the_reproduction_quotes_the_command_line_it_was_given(monkeypatch: pytest.MonkeyPatch) -> None:
    """The report's "Produced by" is the command as typed, every flag included, not a fixed string."""
    import orchestra.jobs.phase1 as phase1
    from orchestra.cli import main

    seen: dict[str, object] = {}
    monkeypatch.setattr(phase1, "reproduce", lambda cfg, command="": seen.update(cfg=cfg, command=command))
    argv = ["reproduce", "conductor", "--teams", "arithmetic_priced", "--features", "structural", "all", "--out", "r x"]
    assert main(argv) == 0
    assert (
        seen["command"]
        == "orchestra reproduce conductor --teams arithmetic_priced --features structural all --out 'r x'"
    )
    assert seen["cfg"].phase1.features == ["structural", "all"]  # type: ignore[attr-defined]
