"""The generated results pages: findings whose numbers are cited from the tables below them, and the committed pages
regenerated from their committed tables."""

from __future__ import annotations

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


def test_the_priced_conductor_page_quotes_its_own_tables() -> None:
    """docs/results/conductor-priced.md (``orchestra reproduce conductor --teams arithmetic_priced ... --report``)
    opens with findings, and every number they quote is in the table row they cite, in the committed copy."""
    from orchestra.report.findings import read_findings

    page = (ROOT / "docs" / "results" / "conductor-priced.md").read_text()
    found = read_findings(ROOT / "docs" / "results" / "conductor-priced_findings.json")
    assert len(found) >= 2 and page.index("## Findings") < page.index("## Headroom sized on validation")
    assert check_findings(page, found) == []
    assert (
        "(conductor-priced_cost_quality.png)" in page
        and (ROOT / "docs/results/conductor-priced_cost_quality.png").exists()
    )
