"""The run directory (trajectories/rundir.py): the resolved config round-trips, a resume under another config is
refused naming every differing field, the allowed fields pass, the RNGs come back to the same draws, an atomic write
leaves no partial file, and no other module of the packages writes a config or compares configs on resume."""

from __future__ import annotations

import ast
import csv
import json
import random
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import torch

from trajectories.rundir import (
    ABSENT,
    CONFIG_FILE,
    ConfigDifference,
    ConfigMismatchError,
    RunDirError,
    atomic_path,
    capture_rng,
    check_config,
    config_differences,
    config_json,
    read_config,
    restore_rng,
    same_config,
    write_config,
    write_table,
)

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("orchestra", "envs", "policies", "trajectories")
THE_MODULE = ROOT / "trajectories" / "rundir.py"  # the one module allowed to write and compare configs


@dataclass(frozen=True)
class Inner:
    hidden_size: int = 8
    layers: tuple[int, ...] = (1, 2)


@dataclass(frozen=True)
class Config:
    lr: float = 1e-3
    schemes: tuple[str, ...] = ("teamtr", "naive")
    num_stages: int = 4
    out: Path = Path("runs/x")
    inner: Inner = field(default_factory=Inner)


# ----------------------------------------------------------------------------------------------------------------
# the resolved config


def test_config_round_trips_in_one_format(tmp_path: Path) -> None:
    path = write_config(tmp_path / "run", Config())
    assert path == tmp_path / "run" / CONFIG_FILE
    text = path.read_text(encoding="utf-8")
    expected = {
        "lr": 0.001,
        "schemes": ["teamtr", "naive"],
        "num_stages": 4,
        "out": "runs/x",
        "inner": {"hidden_size": 8, "layers": [1, 2]},
    }
    assert text == json.dumps(expected, indent=2) + "\n"  # field order kept, tuples as lists, a Path as its str
    assert read_config(path) == expected == config_json(Config())
    assert list(read_config(path)) == ["lr", "schemes", "num_stages", "out", "inner"]
    # a dict holding dataclasses (a job's sections) and None
    write_config(tmp_path, {"format": "f/1", "team": Inner(), "trainer": None}, "other.json")
    assert read_config(tmp_path / "other.json") == {"format": "f/1", "team": config_json(Inner()), "trainer": None}
    assert same_config(path, Config()) and not same_config(path, Config(lr=0.5))
    assert not same_config(tmp_path / "missing.json", Config())


def test_an_unreadable_config_is_named(tmp_path: Path) -> None:
    with pytest.raises(RunDirError, match=r"missing\.json: no saved config"):
        read_config(tmp_path / "missing.json")
    (tmp_path / CONFIG_FILE).write_text('{"lr": 0.1', encoding="utf-8")
    with pytest.raises(RunDirError, match=r"config\.json: cannot read the run's saved config"):
        check_config(tmp_path / CONFIG_FILE, Config())
    assert not same_config(tmp_path / CONFIG_FILE, Config())


# ----------------------------------------------------------------------------------------------------------------
# the resume check


def test_one_error_names_every_differing_field_and_the_file(tmp_path: Path) -> None:
    path = write_config(tmp_path, Config())
    check_config(path, Config())  # the same config passes
    current = Config(lr=0.5, inner=Inner(hidden_size=16, layers=(1, 2, 3)))
    with pytest.raises(ConfigMismatchError) as err:
        check_config(path, current, hint="use another output directory")
    message = str(err.value)
    assert message == (
        f"cannot resume from {path}: its config differs from the current one in 3 fields (saved → current): "
        "inner.hidden_size 8 → 16; inner.layers [1, 2] → [1, 2, 3]; lr 0.001 → 0.5; use another output directory"
    )
    assert isinstance(err.value, ValueError)  # the CLI's "error: …" line, exit code 2


def test_fields_one_side_lacks_are_named() -> None:
    saved = {"a": 1, "b": {"c": 2, "d": {}}}
    assert config_differences(saved, {"a": 1, "b": {"c": 2, "d": {}}}) == []
    assert config_differences(saved, {"a": 1, "b": {"d": {}}, "e": 3}) == [
        ConfigDifference("b.c", 2, ABSENT),
        ConfigDifference("e", ABSENT, 3),
    ]
    assert config_differences(saved, {"a": 1, "b": {"c": 2}}) == [ConfigDifference("b.d", {}, ABSENT)]
    assert config_differences({"x": float("nan")}, {"x": float("nan")}) == []


def test_the_allowed_fields_may_differ(tmp_path: Path) -> None:
    path = write_config(tmp_path, Config())
    # may_differ: any value, the field itself or anything under it
    check_config(path, Config(num_stages=9, inner=Inner(hidden_size=3)), may_differ=["num_stages", "inner"])
    with pytest.raises(ConfigMismatchError, match=r"in 1 field \(saved → current\): lr 0\.001 → 0\.5$"):
        check_config(path, Config(lr=0.5, num_stages=9), may_differ=["num_stages"])
    # may_extend: a list that only grows at its end
    check_config(path, Config(schemes=("teamtr", "naive", "joint")), may_extend=["schemes"])
    for schemes in (("naive", "teamtr"), ("teamtr",), ("teamtr", "joint")):
        with pytest.raises(ConfigMismatchError, match=r": schemes \['teamtr', 'naive'\] → "):
            check_config(path, Config(schemes=schemes), may_extend=["schemes"])
    # a config already read (a checkpoint's copy) is compared as is, the path only names it
    check_config(tmp_path / "nowhere.json", Config(), saved=config_json(Config()))


# ----------------------------------------------------------------------------------------------------------------
# the RNGs


def _draws() -> tuple[list[float], list[float], list[float], list[float]]:
    return (
        [random.random() for _ in range(3)],
        np.random.rand(3).tolist(),
        [float(np.random.randn())],  # the cached Gaussian of numpy's legacy generator
        torch.rand(3).tolist(),
    )


@pytest.mark.parametrize("python", [True, False])
def test_rng_round_trip_reproduces_the_same_draws(tmp_path: Path, python: bool) -> None:
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    _draws()
    np.random.randn()  # leaves a Gaussian cached
    state = capture_rng(python=python)
    # what a checkpoint keeps: the tensors through torch.save (weights_only), the scalars through JSON
    torch.save(state.tensors, tmp_path / "rng.pt")
    (tmp_path / "rng.json").write_text(json.dumps({"numpy": state.numpy, "python": state.python}))
    first = _draws()
    random.seed(99)
    np.random.seed(99)
    torch.manual_seed(99)
    python_after = [random.random() for _ in range(3)]
    scalars = json.loads((tmp_path / "rng.json").read_text())
    tensors = torch.load(tmp_path / "rng.pt", weights_only=True)
    restore_rng(type(state)(tensors, scalars["numpy"], scalars["python"]))
    again = _draws()
    assert again[1:] == first[1:]
    if python:
        assert again[0] == first[0]
    else:  # Python's random is left as it was
        assert state.python is None and again[0] != first[0] and len(python_after) == 3


# ----------------------------------------------------------------------------------------------------------------
# atomic writes and tables


def test_an_atomic_write_leaves_no_partial_file(tmp_path: Path) -> None:
    path = write_config(tmp_path, {"lr": 1})
    with pytest.raises(RuntimeError), atomic_path(path, "resolved config") as tmp:
        tmp.write_text('{"lr": ', encoding="utf-8")  # a kill mid-write
        raise RuntimeError("killed")
    assert read_config(path) == {"lr": 1}  # the previous file whole
    assert sorted(p.name for p in tmp_path.iterdir()) == [CONFIG_FILE]  # no partial left beside it
    with pytest.raises(TypeError), atomic_path(tmp_path / "new.json") as tmp:
        tmp.write_text(json.dumps({"x": object()}))  # fails before anything is written
    assert sorted(p.name for p in tmp_path.iterdir()) == [CONFIG_FILE]
    with pytest.raises(TypeError):
        write_config(tmp_path, {"key": {(1, 2): 3}})  # a key JSON cannot hold: nothing replaces the file
    assert read_config(path) == {"lr": 1} and sorted(p.name for p in tmp_path.iterdir()) == [CONFIG_FILE]


def test_tables_are_written_whole_or_appended_under_one_header(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    write_table(path, [Inner(), Inner(hidden_size=3)])
    write_table(path, [{"hidden_size": 4, "layers": "x"}], ["hidden_size", "layers"], append=True)
    write_table(tmp_path / "new.csv", [{"a": 1}], ["a"], append=True)  # a new file gets its header
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert rows == [
        {"hidden_size": "8", "layers": "(1, 2)"},
        {"hidden_size": "3", "layers": "(1, 2)"},
        {"hidden_size": "4", "layers": "x"},
    ]
    assert (tmp_path / "new.csv").read_bytes() == b"a\r\n1\r\n"


# ----------------------------------------------------------------------------------------------------------------
# nobody else writes a config or compares configs on resume

CONFIG_PATH_NAME = re.compile(r"(?i)config_?(file|path)$|^CONFIG_FILE$")
COMPARERS = re.compile(r"(?i)^_?(differing_fields|config_diff\w*|check\w*config\w*|same_config|\w*config_mismatch)$")
READS = {"load", "loads", "read_text", "read_json", "read_config", "to_json"}  # a config read back, its JSON form
DELEGATES = {"check_config", "config_differences", "same_config"}  # a wrapper of the run directory's comparison


def _names_a_config_file(node: ast.AST, paths: set[str] = frozenset()) -> bool:  # type: ignore[assignment]
    """Whether an expression names a config file: a ``…config.json`` literal, a ``config_file`` / ``config_path`` /
    ``CONFIG_FILE`` name, or a name in ``paths`` (assigned from one)."""
    for n in ast.walk(node):
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value.endswith("config.json"):
            return True
        name = n.id if isinstance(n, ast.Name) else n.attr if isinstance(n, ast.Attribute) else None
        if name is not None and (CONFIG_PATH_NAME.search(name) or name in paths):
            return True
    return False


def _call_name(call: ast.Call) -> str:
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


def _written(call: ast.Call) -> ast.AST | None:
    """The path a call writes to, if it writes a file."""
    func, name = call.func, _call_name(call)
    if name in ("write_text", "write_bytes") and isinstance(func, ast.Attribute):
        return func.value
    if name in ("atomic_path", "write_text_atomic") and call.args:
        return call.args[0]
    if name == "save" and len(call.args) >= 2:  # torch.save(obj, path)
        return call.args[1]
    if name == "open":
        is_method = isinstance(func, ast.Attribute)
        pos = 0 if is_method else 1
        modes = [call.args[pos]] if len(call.args) > pos else []
        modes += [k.value for k in call.keywords if k.arg == "mode"]
        if any(isinstance(m, ast.Constant) and any(c in str(m.value) for c in "wax") for m in modes):
            return func.value if is_method else call.args[0] if call.args else None
    return None


def _reads_a_config(node: ast.AST, paths: set[str], saved: set[str]) -> bool:
    """Whether an expression reads a config file back (``json.loads(config_path.read_text())``), holds a config read
    back earlier (a name in ``saved``) or a config's JSON form (``cfg.to_json()``)."""
    for n in ast.walk(node):
        if (
            isinstance(n, ast.Call)
            and (name := _call_name(n)) in READS
            and (name == "to_json" or _names_a_config_file(n, paths))
        ):
            return True
        if isinstance(n, ast.Name) and n.id in saved:
            return True
    return False


def _own_nodes(scope: ast.AST) -> list[ast.AST]:
    """The nodes of a module or function, less those of the functions and classes defined inside it."""
    out, todo = [], [scope]
    while todo:
        node = todo.pop()
        out.append(node)
        todo += [
            c
            for c in ast.iter_child_nodes(node)
            if not isinstance(c, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
        ]
    return out


def _tainted(tree: ast.AST) -> tuple[set[str], set[str]]:
    """Names assigned a config file's path, and names assigned a config read back from one (to a fixed point)."""
    paths: set[str] = set()
    saved: set[str] = set()
    assigns = [
        (t.id, a.value)
        for a in _own_nodes(tree)
        if isinstance(a, ast.Assign)
        for t in a.targets
        if isinstance(t, ast.Name)
    ]
    while True:
        before = (len(paths), len(saved))
        for name, value in assigns:
            if _reads_a_config(value, paths, saved):
                saved.add(name)
            elif _names_a_config_file(value, paths):
                paths.add(name)
        if (len(paths), len(saved)) == before:
            return paths, saved


def _delegates(func: ast.FunctionDef) -> bool:
    return any(isinstance(n, ast.Call) and _call_name(n) in DELEGATES for n in ast.walk(func))


def _compares_a_saved_config(node: ast.AST, paths: set[str], saved: set[str]) -> bool:
    """``==`` / ``!=`` between a config read back and anything but a literal (``raw["peft_type"] != "LORA"`` checks
    a file's kind; it compares no configs)."""
    if not isinstance(node, ast.Compare) or not any(isinstance(op, ast.Eq | ast.NotEq) for op in node.ops):
        return False
    sides = [node.left, *node.comparators]
    return not any(isinstance(x, ast.Constant) for x in sides) and any(_reads_a_config(x, paths, saved) for x in sides)


def scan(source: str) -> list[tuple[int, str]]:
    """``(line, what)`` of every config written and every config comparison in one module's source (names are
    followed within a function: ``path = out / "config.json"; saved = json.loads(path.read_text())``)."""
    tree = ast.parse(source)
    found = set()
    scopes = [
        tree,
        *(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)),
    ]
    for scope in scopes:
        paths, saved = _tainted(scope)
        for node in [*_own_nodes(scope), *(c for c in ast.iter_child_nodes(scope) if isinstance(c, ast.FunctionDef))]:
            if (
                isinstance(node, ast.Call)
                and (target := _written(node)) is not None
                and _names_a_config_file(target, paths)
            ):
                found.add((node.lineno, "writes a config file"))
            if isinstance(node, ast.FunctionDef) and COMPARERS.match(node.name) and not _delegates(node):
                found.add((node.lineno, f"defines a config comparison ({node.name})"))
            if _compares_a_saved_config(node, paths, saved):
                found.add((node.lineno, "compares a saved config"))
    return sorted(found)


@pytest.mark.parametrize(
    "snippet",
    [  # the shapes of the writers and checkers this module replaced
        '(out / "config.json").write_text(json.dumps(cfg, indent=2), encoding="utf-8")',
        'config_path.write_text(json.dumps(cfg.to_json(), indent=2) + "\\n")',
        'write_text_atomic(config_file, json.dumps(config, indent=2) + "\\n")',
        "(out / CONFIG_FILE).write_text(json.dumps(resolved, indent=2))",
        'with open(run / "config.json", "w") as f:\n    json.dump(cfg, f)',
        'with (tmp / "ppo_config.json").open(mode="w") as f:\n    f.write(text)',
        "if json.loads(config_path.read_text()) != cfg.to_json():\n    raise FileExistsError(config_path)",
        'target = out / "config.json"\nwith target.open("w") as f:\n    json.dump(cfg, f)',
        'path = out / "config.json"\nsaved = json.loads(path.read_text())\nd = [k for k, v in now if saved[k] != v]',
        'p = run / "config.json"\nif json.loads(p.read_text()) != current:\n    raise ValueError(p)',
        "def differing_fields(saved, current):\n    return []",
        "def _config_diffs(out, current):\n    return []",
        "def check_stored_config(path, cfg):\n    return None",
    ],
)
def test_the_scan_catches_a_config_writer_or_checker(snippet: str) -> None:
    assert scan(snippet) != []


def test_only_the_run_directory_writes_configs_and_compares_them() -> None:
    ours = scan(THE_MODULE.read_text(encoding="utf-8"))
    kinds = {what.split(" (")[0] for _, what in ours}
    assert kinds >= {"writes a config file", "defines a config comparison"}, ours  # the scan sees the real thing
    others = {}
    files = [f for pkg in (*PACKAGES, "benchmarks") for f in (ROOT / pkg).rglob("*.py") if f != THE_MODULE]
    assert len(files) > 100
    for f in files:
        if hits := scan(f.read_text(encoding="utf-8")):
            others[str(f.relative_to(ROOT))] = hits
    assert others == {}
