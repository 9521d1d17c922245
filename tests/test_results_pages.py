"""The generated results pages: findings whose numbers are cited from the tables below them, and the committed pages
regenerated from their committed tables."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from orchestra.report.findings import Cite, Finding, check_findings, findings_section, table_rows

ROOT = Path(__file__).resolve().parents[1]


def test_a_finding_quotes_only_what_its_sentence_says() -> None:
    with pytest.raises(ValueError, match="does not"):
        Finding("teamtr is ahead by +0.011.", (Cite(("equal stages",), "+0.012"),))


def test_check_findings_reads_the_tables_below_the_section() -> None:
    found = [Finding("a − b: +1.0 [+0.2, +1.8] (p 0.03 (0.06)).", (Cite(("a − b",), "+1.0"), Cite(("a − b",), "0.06")))]
    table = "| comparison | Δ | p (Holm) |\n|---|---:|---|\n| a − b | +1.0 | 0.03 (0.06) |\n"
    page = "# Page\n\n" + "\n".join(findings_section(found)) + "\n## Tables\n\n" + table
    assert table_rows(table) == [["comparison", "Δ", "p (Holm)"], ["a − b", "+1.0", "0.03 (0.06)"]]
    assert check_findings(page, found) == []
    assert check_findings(page.replace("| +1.0 |", "| +1.1 |"), found)  # the table changed
    assert check_findings(page.replace("(0.06)", "(0.07)"), found)  # a word of a two-number cell
    assert check_findings(page.replace("| a − b |", "| a − c |"), found)  # the row's key
    assert check_findings(page.replace("## Findings", "## Summary"), found) == ["no '## Findings' section"]
    # a number above the findings (in the page's introduction) does not count as a table below them
    above = "# Page\n\n" + table + "\n" + "\n".join(findings_section(found)) + "\n## Tables\n\nnone\n"
    assert check_findings(above, found)


def test_the_committed_chain_page_regenerates_from_its_run_directories(tmp_path: Path) -> None:
    from orchestra.experiments.chain.page import chain_page
    from orchestra.jobs.experiment import ChainPageJob, chain_page_command

    job = ChainPageJob()
    runs = [tuple(spec.split("=", 1)) for spec in job.runs]
    page = ROOT / job.page
    text, found = chain_page(
        [(name, str(ROOT / d)) for name, d in runs],
        str(ROOT / job.notes),
        tmp_path / page.name,
        chain_page_command(job),
    )
    assert text.replace(str(ROOT) + "/", "") == page.read_text(), f"stale: run `{chain_page_command(job)}`"
    assert check_findings(page.read_text(), found) == []
    assert len(found) >= 4 and all((page.parent / f"teamtr_curves_{name}.png").exists() for name, _ in runs)


@pytest.mark.parametrize("stem", ["conductor", "conductor-priced"])
def test_a_committed_phase1_page_regenerates_from_its_committed_inputs(stem: str, tmp_path: Path) -> None:
    """docs/results/STEM.md is what ``orchestra reproduce conductor --report-only --out docs/results/STEM_run --report
    docs/results/STEM.md`` writes from the committed report inputs (the slim test episodes and what the run's
    earlier stages decided): rebuilt here from a copy, it is the committed page, its figure is the committed one, and
    every number its findings quote is in the table row they cite."""
    import shutil

    from orchestra.jobs.phase1 import ReproduceConfig, reproduce
    from orchestra.report.findings import read_findings

    results = ROOT / "docs" / "results"
    run = tmp_path / f"{stem}_run"
    shutil.copytree(results / f"{stem}_run" / "report" / "inputs", run / "report" / "inputs")
    page = tmp_path / f"{stem}.md"
    res = reproduce(ReproduceConfig(out=str(run), report=str(page), report_only=True))
    cmd = f"orchestra reproduce conductor --report-only --out docs/results/{stem}_run --report docs/results/{stem}.md"
    committed = (results / f"{stem}.md").read_text()
    assert page.read_text() == committed, f"stale: run `{cmd}`"
    assert (tmp_path / f"{stem}_cost_quality.png").read_bytes() == (results / f"{stem}_cost_quality.png").read_bytes()
    found = read_findings(res.paths["findings"])
    assert len(found) >= 2 and committed.index("## Findings") < committed.index("## Headroom")
    assert check_findings(committed, found) == []
    assert f"({stem}_cost_quality.png)" in committed


def test_the_committed_llm_page_regenerates_from_its_committed_tables(tmp_path: Path) -> None:
    """docs/results/finetune.md is what ``orchestra experiment llm --report-only --out docs/results/finetune_run
    --report docs/results/finetune.md`` writes from the committed tables (evaluations and each run's update and stage
    tables, no checkpoints): regenerated here from a copy, it is the committed page, and its findings quote it."""
    import shutil

    from orchestra.experiments.llm.config import LLMExperimentConfig
    from orchestra.experiments.llm.report import findings
    from orchestra.experiments.llm.run import run_llm_experiment
    from orchestra.jobs.experiment import publish

    tables = tmp_path / "finetune_run"
    shutil.copytree(ROOT / "docs" / "results" / "finetune_run", tables)
    result = run_llm_experiment(LLMExperimentConfig(), tables, say=lambda _line: None, play=False)
    publish(result.summary, tmp_path / "finetune.md")
    page = (ROOT / "docs" / "results" / "finetune.md").read_text()
    cmd = "orchestra experiment llm --report-only --out docs/results/finetune_run --report docs/results/finetune.md"
    assert (tmp_path / "finetune.md").read_text() == page, f"stale: run `{cmd}`"
    found = findings(LLMExperimentConfig(), result.tables)
    assert found and check_findings(page, found) == []
    assert page.index("## Findings") < page.index("## Held-out success") and "(finetune_curves.png)" in page


def test_the_committed_llm_freshness_page_regenerates_from_its_pairs(tmp_path: Path) -> None:
    """docs/results/freshness-llm.md is what ``orchestra experiment freshness-llm --report-only --out
    docs/results/freshness_llm_run --report docs/results/freshness-llm.md`` writes from the committed pairs (interim
    while fewer than the run's pairs are in)."""
    import shutil

    from orchestra.experiments.freshness.llm_config import LLMFreshnessConfig
    from orchestra.experiments.freshness.llm_run import run_llm_freshness_experiment

    run = ROOT / "docs" / "results" / "freshness_llm_run"
    for name in ("config.json", "pairs.csv"):
        (tmp_path / "run").mkdir(exist_ok=True)
        shutil.copyfile(run / name, tmp_path / "run" / name)
    result = run_llm_freshness_experiment(LLMFreshnessConfig(), tmp_path / "run", play=False)
    page = (ROOT / "docs" / "results" / "freshness-llm.md").read_text()
    cmd = (
        "orchestra experiment freshness-llm --report-only --out docs/results/freshness_llm_run "
        "--report docs/results/freshness-llm.md"
    )
    assert result.summary.read_text() == page, f"stale: run `{cmd}`"
    pairs = result.tables["result"][0]["pairs"]
    assert f"| {pairs} |" in page and ("**Interim:" in page) == (pairs < LLMFreshnessConfig().pairs)


_DECIMAL = re.compile(r"[+-]?\d+\.\d+")


def _quoted(text: str) -> list[str]:
    """The decimal figures a text quotes, signed as written (a typographic minus read as '-')."""
    return _DECIMAL.findall(text.replace("−", "-"))


def _figures(pages: list[str]) -> set[str]:
    """Every decimal a generated page prints, as printed and without its sign, and every share (four decimals) also
    in points to one decimal, the way the hand-written texts quote them."""
    out: set[str] = set()
    for page in pages:
        for tok in _quoted(page):
            signed, digits = tok[0] in "+-", tok.lstrip("+-")
            out |= {tok, digits}
            if len(digits.split(".")[1]) == 4:
                points = float(tok) * 100
                out |= {f"{points:+.1f}" if signed else f"{points:.1f}", f"{abs(points):.1f}"}
    return out


def _between(text: str, start: str, end: str) -> str:
    assert start in text, f"the anchor {start!r} is gone: update this test with the text it checks"
    tail = text[text.index(start) :]
    stop = tail.find(end, len(start))
    return tail if stop < 0 else tail[:stop]


_LLM_PAGES = ["docs/results/finetune.md", "docs/results/freshness-llm.md"]


@pytest.mark.parametrize(
    ("path", "start", "end"),
    [
        ("README.md", "- **TeamTR on a real LLM team**", "\n\n"),
        ("docs/results/README.md", "State: seeds", "\n- **"),
        ("docs/results/README.md", "- **Freshness on the LLM team**", "\n\n"),
        ("docs/results/teamtr_notes.md", "## On the real-LLM team", "\n## "),
    ],
)
def test_the_hand_written_llm_state_quotes_the_generated_pages(path: str, start: str, end: str) -> None:
    """The state of the LLM runs is restated by hand in the README, the results index and the TeamTR notes; every
    decimal figure there must be one the generated pages print (shares read in points), so a hand-copied figure that
    lags a regenerated page fails here rather than in a reader's hands."""
    section = _between((ROOT / path).read_text(), start, end)
    printed = _figures([(ROOT / p).read_text() for p in _LLM_PAGES])
    missing = [tok for tok in _quoted(section) if tok not in printed]
    assert not missing, f"{path}: {missing} are not figures of {' or '.join(_LLM_PAGES)}: copy them from the pages"
