"""The docs hold together: every relative link in README.md and docs/**/*.md names a file that exists (relative to the
file holding the link), every ``#anchor`` names a heading of its target, every bare ``docs/….md`` path named in the
text exists (from the repository root), and the README stays a front door (at most 250 lines)."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README_MAX_LINES = 250

FENCE = re.compile(r"^ {0,3}(```|~~~).*?^ {0,3}\1[^\n]*$", re.M | re.S)
INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1", re.S)
# [text](target) and ![alt](target); the target may carry a "title" and be wrapped in <>
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFDEF = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$", re.M)
BARE = re.compile(r"(?<![\w./-])docs/[\w./-]*\w\.(?:md|png)\b")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$", re.M)
HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"", re.I)


def markdown_files(root: Path = ROOT) -> list[Path]:
    """The README and every page under docs/ but those git ignores (a report a command derives into a committed run
    directory, e.g. docs/results/finetune_run/summary.md, is output, not a page)."""
    ignored = _ignored(root)  # one git call, not one per page
    return [root / "README.md", *sorted(p for p in (root / "docs").rglob("*.md") if p.resolve() not in ignored)]


def _ignored(root: Path) -> set[Path]:
    import subprocess

    out = subprocess.run(
        ["git", "ls-files", "--others", "--ignored", "--exclude-standard", "--", "docs"],
        cwd=root,
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    return {(root / line).resolve() for line in out.splitlines()}


def _blank_code(text: str) -> str:
    """Fenced blocks and inline code spans blanked, line breaks kept: a link there is an example, not a link."""
    text = FENCE.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)
    return INLINE_CODE.sub(lambda m: re.sub(r"[^\n]", "x", m.group(0)), text)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: markup dropped, lowercase, every character but letters, digits, marks, '_',
    '-' and spaces removed, spaces turned into hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").lower()
    kept = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LNM")
    return kept.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    seen: dict[str, int] = {}
    out = set(HTML_ANCHOR.findall(text))
    for m in HEADING.finditer(text):
        base = slug(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(path: Path) -> list[tuple[int, str]]:
    """(line, target) of every markdown link, image and reference definition in a file, code excluded."""
    text = _blank_code(path.read_text(encoding="utf-8"))
    found = [m for pattern in (LINK, REFDEF) for m in pattern.finditer(text)]
    return [(text.count("\n", 0, m.start()) + 1, m.group(1)) for m in found]


def bare_paths(path: Path) -> list[tuple[int, str]]:
    """(line, path) of every ``docs/….md`` or ``.png`` named in the text outside a link's target, code spans and
    blocks included: such a path is written from the repository root wherever it appears."""
    text = path.read_text(encoding="utf-8")
    code = _blank_code(text)
    for m in LINK.finditer(code):  # a link's target is checked as a link, relative to its file
        text = text[: m.start(1)] + " " * (m.end(1) - m.start(1)) + text[m.end(1) :]
    return [(text.count("\n", 0, m.start()) + 1, m.group(0)) for m in BARE.finditer(text)]


def broken(root: Path, files: list[Path]) -> tuple[list[str], int]:
    """The broken links of these files (one line each) and how many links were checked."""
    bad: list[str] = []
    checked = 0
    cache: dict[Path, set[str]] = {}
    for f in files:
        where = f.relative_to(root)
        for line, target in links(f):
            if re.match(r"[a-z][a-z0-9+.-]*:", target, re.I):  # http(s), mailto, …: not checked here
                continue
            checked += 1
            file_part, _, anchor = target.partition("#")
            dest = (f.parent / file_part).resolve() if file_part else f
            rel = dest.relative_to(root.resolve()).as_posix() if dest.is_relative_to(root.resolve()) else str(dest)
            if not dest.exists():
                bad.append(f"{where}:{line}: {target} (no such file)")
                continue
            if anchor and dest.suffix == ".md":
                if dest not in cache:
                    cache[dest] = anchors(dest)
                if anchor not in cache[dest]:
                    bad.append(f"{where}:{line}: {target} (no heading #{anchor} in {rel})")
        for line, name in bare_paths(f):
            checked += 1
            if not (root / name).exists():
                bad.append(f"{where}:{line}: {name} (no such file, from the repository root)")
    return bad, checked


def test_every_relative_link_in_the_readme_and_docs_resolves() -> None:
    bad, checked = broken(ROOT, markdown_files())
    assert bad == []
    assert checked >= 150, checked  # a regex that stopped matching would pass an empty list


def test_the_readme_and_the_docs_index_link_the_pages() -> None:
    readme = [t for _, t in links(ROOT / "README.md")]
    assert len(readme) >= 20, readme
    assert "docs/index.md" in readme and "docs/cli.md" in readme
    # every docs page is reachable from the index by following links
    seen, todo = set(), [ROOT / "docs" / "index.md"]
    while todo:
        page = todo.pop()
        if page in seen or not page.is_file() or page.suffix != ".md":
            continue
        seen.add(page)
        todo += [(page.parent / t.partition("#")[0]).resolve() for _, t in links(page) if not re.match(r"[a-z]+:|#", t)]
    assert {p.resolve() for p in markdown_files()[1:]} - seen == set()


def test_the_readme_is_a_front_door() -> None:
    n = len((ROOT / "README.md").read_text(encoding="utf-8").splitlines())
    assert n <= README_MAX_LINES, n


def test_a_broken_link_is_reported(tmp_path: Path) -> None:
    (tmp_path / "docs" / "sub").mkdir(parents=True)
    (tmp_path / "docs" / "sub" / "page.md").write_text("# A page\n\n## Some `code`: here, now!\n", encoding="utf-8")
    (tmp_path / "README.md").write_text(
        "[ok](docs/sub/page.md) [ok](docs/sub/page.md#some-code-here-now) ![img](docs/missing.png)\n"
        "[gone](docs/page.md) [bad anchor](docs/sub/page.md#nothing) [web](https://example.org/x.md)\n"
        "`[in code](nowhere.md)` and docs/sub/page.md and docs/other.md\n"
        "```\n[in a block](nowhere.md)\n```\n",
        encoding="utf-8",
    )
    (tmp_path / "docs" / "index.md").write_text(
        "[up](../README.md) [wrong](docs/sub/page.md) [self](#nope)\n", encoding="utf-8"
    )
    bad, checked = broken(tmp_path, markdown_files(tmp_path))
    assert sorted(bad) == sorted(
        [
            "README.md:1: docs/missing.png (no such file)",
            "README.md:2: docs/page.md (no such file)",
            "README.md:2: docs/sub/page.md#nothing (no heading #nothing in docs/sub/page.md)",
            "README.md:3: docs/other.md (no such file, from the repository root)",
            "docs/index.md:1: docs/sub/page.md (no such file)",
            "docs/index.md:1: #nope (no heading #nope in docs/index.md)",
        ]
    )
    assert checked == 10


def test_slugs_follow_github() -> None:
    assert (
        slug("6. Measurable claims for a small synthetic benchmark")
        == "6-measurable-claims-for-a-small-synthetic-benchmark"
    )
    assert slug("Phase 2: TeamTR on the `telephone` chain (n = 8)") == "phase-2-teamtr-on-the-telephone-chain-n--8"
    assert slug("[Link](x.md) and δ_0 — Stage 0") == "link-and-δ_0--stage-0"
