"""A results page's "Findings": a few generated sentences at the top, each number tied to the table it comes from.

A :class:`Finding` is a sentence plus its :class:`Cite` s: for each number the sentence quotes, the cells that
identify the table row (as printed) and the cell the number is printed in. The page generator builds the findings
from the same rows it prints as tables, so nothing in them is typed by hand; :func:`check_findings` reads a page back
and fails when a finding is missing from it or a quoted cell is not in a table row below the findings (a stale page,
a hand edit of either). The results pages' test runs it on every committed page that has findings.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

HEADING = "## Findings"


@dataclass(frozen=True)
class Cite:
    """A number of a finding: ``value`` is a cell of a table row, exactly as printed (or one of the cell's words: a
    cell may print two numbers, ``0.008 (0.016)``), and that row also holds every cell of ``keys``."""

    keys: tuple[str, ...]
    value: str


@dataclass(frozen=True)
class Finding:
    """One sentence of the findings (markdown) and the table cells it quotes; every cite's ``value`` occurs in
    ``text``."""

    text: str
    cites: tuple[Cite, ...] = ()

    def __post_init__(self) -> None:
        for c in self.cites:
            if c.value not in self.text:
                raise ValueError(f"finding quotes {c.value!r} but its sentence does not: {self.text}")


def findings_section(findings: Sequence[Finding], intro: str = "") -> list[str]:
    """The section's markdown lines: the heading, an optional sentence, one bullet per finding."""
    lines = [HEADING, ""]
    if intro:
        lines += [intro, ""]
    return lines + [f"- {f.text}" for f in findings] + [""]


def write_findings(path: Path, findings: Sequence[Finding]) -> None:
    """The findings with their cites as JSON (``findings.json`` beside a report), for :func:`check_findings` later."""
    path.write_text(json.dumps([asdict(f) for f in findings], ensure_ascii=False, indent=1) + "\n", encoding="utf-8")


def read_findings(path: Path) -> list[Finding]:
    """The findings :func:`write_findings` wrote."""
    return [
        Finding(f["text"], tuple(Cite(tuple(c["keys"]), c["value"]) for c in f["cites"]))
        for f in json.loads(path.read_text(encoding="utf-8"))
    ]


def table_rows(markdown: str) -> list[list[str]]:
    """The cells of every markdown table row of ``markdown`` (separator rows left out), stripped."""
    rows = []
    for line in markdown.splitlines():
        s = line.strip()
        if not (s.startswith("|") and s.endswith("|")) or len(s) < 2:
            continue
        cells = [c.strip() for c in s[1:-1].split("|")]
        if all(set(c) <= set("-: ") and c for c in cells):
            continue
        rows.append(cells)
    return rows


def _holds(row: Sequence[str], value: str) -> bool:
    return any(value == c or value in re.split(r"[\s(),;]+", c) for c in row)


def check_findings(page: str, findings: Sequence[Finding]) -> list[str]:
    """What is wrong with ``page``'s findings, one line each (empty: every finding is on the page, in its findings
    section, and every number it quotes is in a table row below that section holding the cite's keys)."""
    problems: list[str] = []
    head = page.find(HEADING + "\n")
    if head < 0:
        return [f"no '{HEADING}' section"]
    nxt = page.find("\n## ", head + len(HEADING))
    section = page[head : nxt if nxt >= 0 else len(page)]
    below = table_rows(page[nxt:] if nxt >= 0 else "")
    for f in findings:
        if f"- {f.text}" not in section:
            problems.append(f"finding not in the page's findings: {f.text}")
        for c in f.cites:
            if not any(_holds(row, c.value) and all(k in row for k in c.keys) for row in below):
                problems.append(f"no table row below the findings has {c.value!r} with {list(c.keys)} ({f.text})")
    return problems


__all__ = [
    "HEADING",
    "Cite",
    "Finding",
    "check_findings",
    "findings_section",
    "read_findings",
    "table_rows",
    "write_findings",
]
