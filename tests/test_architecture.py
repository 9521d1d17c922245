"""The house's shape: the import contracts hold (and catch a breach), no modules import each other in a circle,
orchestra/ holds only packages, and nothing cites a file outside the repository."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
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


def import_graph(root: Path, packages: Sequence[str]) -> dict[str, set[str]]:
    """Module name -> the modules of ``packages`` (under ``root``) that it imports: every ``import`` and ``from ...
    import`` anywhere in the file (function-local ones and those under ``if TYPE_CHECKING:`` too: they are arrows of
    the design even where they do not run at import time), relative ones resolved, ``from pkg import name`` read as an
    import of the module ``pkg.name`` when there is one and of ``pkg`` otherwise. Imports of other packages are left
    out; dynamic ones (``importlib.import_module``, a ``python -m`` command line) are not imports here.

    Only the module named is an arrow, not the packages above it that Python initialises on the way: a package whose
    ``__init__`` imports its submodules is not thereby in a circle with a submodule that imports a sibling
    (``from pkg import sibling``, ``import pkg.sibling``). It is when that submodule takes a name defined in or
    re-exported by the ``__init__`` itself (``from pkg import Name``, ``import pkg``): that name exists only once the
    ``__init__`` got that far, which is the order dependence a circle is."""
    files: dict[str, Path] = {}
    for pkg in packages:
        for f in sorted((root / pkg).rglob("*.py")):
            parts = f.relative_to(root).with_suffix("").parts
            files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    graph: dict[str, set[str]] = {name: set() for name in files}
    for name, f in files.items():
        here = name.split(".") if f.name == "__init__.py" else name.split(".")[:-1]  # what ``from .`` names
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"), str(f))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # ``from .`` names this package, each further dot the one above
                    base = ".".join([*here[: len(here) - node.level + 1], *([base] if base else [])])
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names]
            else:
                continue
            for target in targets:
                while target and target not in files:  # ``import pkg.mod`` of a name that is no module of ours
                    target = target.rpartition(".")[0]
                if target:
                    graph[name].add(target)
    return graph


def circles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of ``graph`` with more than one module, and modules that import themselves:
    each a sorted list (Tarjan's algorithm, 1972)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = stack[stack.index(v) :]
            del stack[stack.index(v) :]
            if len(component) > 1 or v in graph[v]:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def _describe(graph: Mapping[str, set[str]], circle: Sequence[str]) -> str:
    return "\n".join(f"  {a} -> {b}" for a in circle for b in sorted(graph[a] & set(circle)))


def test_no_modules_import_each_other_in_a_circle() -> None:
    """A circle of imports is a seam in the wrong place: move the definition the lower module needs below both
    (a function-local or ``TYPE_CHECKING`` import is still an arrow: hiding it does not cut the circle)."""
    graph = import_graph(ROOT, PACKAGES)
    # the graph is the house, not an empty read: every package, and its modules' imports
    assert {name.partition(".")[0] for name in graph} == set(PACKAGES)
    assert len(graph) >= 100 and sum(map(len, graph.values())) >= 300, (len(graph), sum(map(len, graph.values())))
    found = circles(graph)
    assert not found, "modules that import each other in a circle:\n" + "\n".join(
        f"{' <-> '.join(c)}:\n{_describe(graph, c)}" for c in found
    )


def test_the_circle_finder_finds_every_kind_of_circle(tmp_path: Path) -> None:
    """A small package with one circle of each kind the finder must see, and a package face it must not count."""
    sources = {
        # a face that imports its submodule, which imports the package only for a sibling: no circle
        "pkg/__init__.py": "from pkg.a import A\n",
        "pkg/a.py": "from pkg import b\n\nclass A: ...\n",
        # a function-local relative import one way, a TYPE_CHECKING import the other
        "pkg/b.py": "def f():\n    from .c import C\n    return C\n",
        "pkg/c.py": "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from pkg.b import f\n\nclass C: ...\n",
        # a submodule that takes a name from its package's __init__, which imports it
        "pkg/sub/__init__.py": "from .x import X\n\nHELPER = 1\n",
        "pkg/sub/x.py": "import json\n\nfrom pkg.sub import HELPER\n\nX = HELPER\n",
        # a module that imports itself, and a circle of three through ``import a.b`` and ``from .. import``
        "pkg/selfish.py": "from . import selfish\n",
        "pkg/sub/y.py": "from .. import z\n",
        "pkg/z.py": "import pkg.w\n",
        "pkg/w.py": "from pkg.sub.y import *\n",
    }
    for path, text in sources.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text, encoding="utf-8")
    graph = import_graph(tmp_path, ["pkg"])
    assert graph["pkg.a"] == {"pkg.b"} and graph["pkg.sub.x"] == {"pkg.sub"}
    assert circles(graph) == [
        ["pkg.b", "pkg.c"],
        ["pkg.selfish"],
        ["pkg.sub", "pkg.sub.x"],
        ["pkg.sub.y", "pkg.w", "pkg.z"],
    ]


def test_orchestra_top_level_holds_only_packages() -> None:
    loose = sorted(p.name for p in (ROOT / "orchestra").glob("*.py") if p.name not in ("__init__.py", "__main__.py"))
    assert loose == []
    for pkg in ("cli", "jobs", "runtime", "report", "backends", "teamtr"):
        assert (ROOT / "orchestra" / pkg / "__init__.py").is_file(), pkg


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
