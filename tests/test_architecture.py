"""The house's shape: the import contracts hold (and catch a breach), orchestra/ holds only packages, files stay under
the size guide, and nothing cites a file outside the repository."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("orchestra", "envs", "policies", "trajectories")
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def _lint_imports(cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LINT_IMPORTS), "--config", str(cwd / "pyproject.toml"), "--no-cache"],
        cwd=cwd,
        env={"PYTHONPATH": str(cwd), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_import_contracts_hold() -> None:
    res = _lint_imports(ROOT)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "0 broken" in res.stdout
    for contract in (
        "orchestra → policies → envs → trajectories",
        "cli → jobs → experiments → (teamtr | report) → runtime",
    ):
        assert contract in res.stdout


@pytest.mark.parametrize(
    ("module", "line", "contract"),
    [
        ("orchestra/teamtr/losses.py", "import orchestra.jobs.record", "never reaches the experiments"),
        ("orchestra/teamtr/trainer.py", "import orchestra.experiments.harness", "never reaches the experiments"),
        ("orchestra/runtime/rollout.py", "import orchestra.report.evaluation", "Inside orchestra"),
        ("envs/team_env.py", "import policies.base", "The four packages are layered"),
        ("orchestra/teamtr/credit.py", "import transformers", "imports no model stack"),
    ],
)
def test_a_breach_of_a_contract_fails_the_check(tmp_path: Path, module: str, line: str, contract: str) -> None:
    """A copy of the tree with one forbidden import added: lint-imports names the broken contract and fails."""
    for pkg in PACKAGES:
        shutil.copytree(ROOT / pkg, tmp_path / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    target = tmp_path / module
    target.write_text(target.read_text(encoding="utf-8") + f"\n{line}  # noqa\n", encoding="utf-8")
    res = _lint_imports(tmp_path)
    assert res.returncode != 0
    unwrapped = res.stdout.replace(" \n", " ")  # a long contract name is wrapped after a space
    broken = [ln for ln in unwrapped.splitlines() if ln.rstrip().endswith("BROKEN")]
    assert len(broken) >= 1 and any(contract in ln for ln in broken), res.stdout


def test_orchestra_top_level_holds_only_packages() -> None:
    loose = sorted(p.name for p in (ROOT / "orchestra").glob("*.py") if p.name not in ("__init__.py", "__main__.py"))
    assert loose == []
    for pkg in ("cli", "jobs", "runtime", "report", "backends", "teamtr"):
        assert (ROOT / "orchestra" / pkg / "__init__.py").is_file(), pkg


def test_no_module_is_past_the_size_guide() -> None:
    long = {}
    for pkg in PACKAGES:
        for f in (ROOT / pkg).rglob("*.py"):
            n = len(f.read_text(encoding="utf-8").splitlines())
            if n > 650:
                long[str(f.relative_to(ROOT))] = n
    assert long == {}


# a citation of a file that lives outside the repository: the design notes beside a checkout, a research note
# (telephone-chain.md was one: it is cited as docs/telephone-chain.md, or by a link inside docs/, `](telephone-chain.md)`)
OUTSIDE = re.compile(
    r"\.\./shared|shared/research|research/[\w-]+\.md|DESIGN(\.md)? ?§|\bspec §|(?<!docs/)(?<!\]\()telephone-chain\.md"
)


def test_nothing_cites_a_file_outside_the_repository() -> None:
    files = [f for pkg in (*PACKAGES, "tests", "benchmarks") for f in (ROOT / pkg).rglob("*.py")]
    files += [ROOT / "README.md", *(ROOT / "docs").rglob("*.md")]
    hits = [
        f"{f.relative_to(ROOT)}:{i}: {line.strip()}"
        for f in files
        for i, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1)
        if OUTSIDE.search(line) and f.name != "test_architecture.py"
    ]
    assert hits == []


def test_every_docs_citation_points_at_a_section_that_exists() -> None:
    """``docs/NAME.md §N`` in code and docs names a heading of that document; so does a bare ``§N`` in a file that
    declares ``§x.y: sections of docs/NAME.md``."""
    cite = re.compile(r"docs/([\w-]+\.md) §(\d+(?:\.\d+)?)")
    declared = re.compile(r"§x\.y: sections of docs/([\w-]+\.md)")
    bare = re.compile(r"(?<!\.md )§(\d+(?:\.\d+)?)")
    headings: dict[str, set[str]] = {}
    for doc in (ROOT / "docs").glob("*.md"):
        text = doc.read_text(encoding="utf-8")
        headings[doc.name] = set(re.findall(r"^#+ (\d+(?:\.\d+)?)\.? ", text, flags=re.M))
    files = [f for pkg in (*PACKAGES, "tests", "benchmarks") for f in (ROOT / pkg).rglob("*.py")]
    files += [ROOT / "README.md", *(ROOT / "docs").rglob("*.md")]
    bad = []
    for f in files:
        text = f.read_text(encoding="utf-8")
        for m in cite.finditer(text):
            if m.group(2) not in headings.get(m.group(1), set()):
                bad.append(f"{f.relative_to(ROOT)}: {m.group(0)}")
        default = declared.search(text)
        if default is not None:
            for m in bare.finditer(text):
                if m.group(1) not in headings[default.group(1)]:
                    bad.append(f"{f.relative_to(ROOT)}: {m.group(0)} (a section of {default.group(1)})")
    assert bad == []
