"""Property-based fuzzing of every reader of user-supplied or on-disk data (hypothesis, fixed seed, bounded examples):
whatever the input, a reader either accepts it or raises OUR error class, naming the file and the line or field;
never a bare KeyError, TypeError, IndexError or a crash. Plus a scan: no pickle anywhere in the packages.

Readers: the team YAML loader, the trajectory reader (records and raw bytes), dataset ``.npz`` files, distilled
trees, phase-2 checkpoints and the user-data loaders."""

from __future__ import annotations

import ast
import copy
import io
import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from envs.tasks.user_data import UserDataError, UserDataFamily
from orchestra.runtime.team_file import TeamFileError, load_team
from policies.base import PolicyError
from policies.learning.dataset import ConductorDataset, DatasetError, build_dataset
from trajectories import Episode, SchemaError, read_trajectories

from .scripted import arithmetic_team, record_scripted

ROOT = Path(__file__).resolve().parents[1]
FUZZ = settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    database=None,  # no example database: the same examples on every machine and every run
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
# JSON-ish values a mutation may put anywhere: wrong types, non-finite numbers, huge and empty values
LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.just([]),
    st.just({}),
)
VALUES = st.recursive(
    LEAVES,
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=5), kids, max_size=3),
    max_leaves=6,
)


def paths_of(obj: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every key path inside a nested dict/list."""
    out = [prefix] if prefix else []
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += paths_of(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += paths_of(v, (*prefix, i))
    return out


def mutate(obj: Any, rnd: random.Random, value: Any, mode: int) -> Any:
    """A copy of ``obj`` with one key path replaced by ``value`` (mode 0), deleted (1) or a new key added (2)."""
    obj = copy.deepcopy(obj)
    paths = paths_of(obj)
    path = paths[rnd.randrange(len(paths))]
    parent = obj
    for k in path[:-1]:
        parent = parent[k]
    last = path[-1]
    if mode == 1 and isinstance(parent, dict):
        del parent[last]
    elif mode == 2 and isinstance(parent, dict):
        parent[f"zz_{rnd.randrange(99)}"] = value
    else:
        parent[last] = value
    return obj


# ------------------------------------------------------------------------------------------ team files
TEAM_YAML = yaml.safe_load((ROOT / "orchestra" / "teams" / "arithmetic.yaml").read_text())


@seed(1)
@FUZZ
@given(value=VALUES, pick=st.integers(0, 10**6), mode=st.integers(0, 2))
def test_team_loader_accepts_or_names_the_field(tmp_path: Path, value: Any, pick: int, mode: int) -> None:
    path = tmp_path / "team.yaml"
    path.write_text(yaml.safe_dump(mutate(TEAM_YAML, random.Random(pick), value, mode)))
    try:
        load_team(path)
    except TeamFileError as e:
        assert str(path) in str(e)


@seed(2)
@FUZZ
@given(text=st.text(max_size=300))
def test_team_loader_on_arbitrary_text(tmp_path: Path, text: str) -> None:
    path = tmp_path / "team.yaml"
    path.write_text(text)
    with pytest.raises(TeamFileError) as err:
        load_team(path)
    assert str(path) in str(err.value)


# ------------------------------------------------------------------------------------------ trajectories
@pytest.fixture(scope="module")
def episode_dicts() -> list[dict[str, Any]]:
    return [e.to_dict() for e in record_scripted(arithmetic_team(), "heuristic", 3)]


@seed(3)
@FUZZ
@given(value=VALUES, pick=st.integers(0, 10**6), mode=st.integers(0, 2))
def test_episode_records_validate_or_name_the_field(episode_dicts: Any, value: Any, pick: int, mode: int) -> None:
    rnd = random.Random(pick)
    data = mutate(episode_dicts[rnd.randrange(len(episode_dicts))], rnd, value, mode)
    try:
        ep = Episode.from_dict(json.loads(json.dumps(data)))
    except SchemaError as e:
        assert e.path or "schema_version" in str(e)  # the field path of what is wrong
    except ValueError as e:  # json.dumps of NaN keys etc. never reaches the reader
        pytest.fail(f"bare ValueError: {e}")
    else:
        assert Episode.from_dict(ep.to_dict()) == ep


@seed(4)
@FUZZ
@given(chunks=st.lists(st.binary(max_size=80), max_size=6), keep=st.integers(0, 3))
def test_trajectory_reader_reports_every_bad_line(
    tmp_path: Path, episode_dicts: Any, chunks: list[bytes], keep: int
) -> None:
    good = [json.dumps(d).encode() for d in episode_dicts[:keep]]
    lines = good + chunks
    path = tmp_path / "t.jsonl"
    path.write_bytes(b"\n".join(lines))
    report = read_trajectories(path)  # never raises
    assert len(report.episodes) >= len(good)
    physical = b"\n".join(lines).split(b"\n")  # a chunk may hold newlines itself
    assert {p.kind for p in report.problems} <= {"damaged", "truncated", "schema", "duplicate"}
    assert all(1 <= p.line <= len(physical) for p in report.problems)
    # every non-blank line after the good episodes is random bytes, never an episode: each one is reported
    bad = {i + 1 for i, raw in enumerate(physical) if i >= len(good) and raw.strip()}
    assert bad <= {p.line for p in report.problems}, (bad, report.problems)


# ------------------------------------------------------------------------------------------ datasets
@pytest.fixture(scope="module")
def dataset_bytes(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    from envs.observation import ObservationEncoder

    team = arithmetic_team()
    eps = record_scripted(team, "heuristic", 4)
    ds = build_dataset(None, team.env, ObservationEncoder(team.env), episodes=eps)
    return ds.save(tmp_path_factory.mktemp("ds") / "d.npz").read_bytes()


@seed(5)
@FUZZ
@given(pos=st.integers(0, 10**9), junk=st.binary(min_size=1, max_size=64), cut=st.booleans())
def test_dataset_loader_on_damaged_files(
    tmp_path: Path, dataset_bytes: bytes, pos: int, junk: bytes, cut: bool
) -> None:
    i = pos % len(dataset_bytes)
    data = dataset_bytes[:i] if cut else dataset_bytes[:i] + junk + dataset_bytes[i + len(junk) :]
    path = tmp_path / "d.npz"
    path.write_bytes(data)
    try:
        ConductorDataset.load(path)
    except DatasetError as e:
        assert str(path) in str(e)


@seed(6)
@FUZZ
@given(value=VALUES, pick=st.integers(0, 10**6), mode=st.integers(0, 2))
def test_dataset_header_mutations(tmp_path: Path, dataset_bytes: bytes, value: Any, pick: int, mode: int) -> None:
    with np.load(io.BytesIO(dataset_bytes), allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    header = json.loads(bytes(arrays["header"]).decode())
    header = mutate(header, random.Random(pick), value, mode)
    arrays["header"] = np.frombuffer(json.dumps(header).encode(), dtype=np.uint8)
    path = tmp_path / "d.npz"
    np.savez(path, **arrays)
    try:
        ConductorDataset.load(path)
    except DatasetError as e:
        assert str(path) in str(e)


# ------------------------------------------------------------------------------------------ distilled trees
@seed(7)
@FUZZ
@given(which=st.sampled_from(["left", "right", "feature", "threshold", "value"]), v=st.integers(-5, 10**6))
def test_distilled_tree_loader_refuses_bad_arrays(tmp_path: Path, which: str, v: int) -> None:
    from sklearn.tree import DecisionTreeClassifier

    from policies.learning.distill import DistillConfig, DistillResult, TreeArrays

    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(60, 3)), rng.integers(0, 3, 60)
    tree = DecisionTreeClassifier(max_depth=3, random_state=0).fit(x, y)
    res = DistillResult(
        tree, "rules", ["a", "b", "c"], np.arange(3), ["x", "y", "z"], 1.0, 1.0, 1.0, 60, 0, DistillConfig()
    )
    folder = res.save(tmp_path / "t")
    arrays = {k: np.array(v_) for k, v_ in vars(TreeArrays.of(tree)).items()}
    arrays[which].flat[v % arrays[which].size] = v
    np.savez(folder / "tree.npz", **arrays)
    try:
        back = DistillResult.load(folder)
    except PolicyError as e:
        assert str(folder) in str(e)
    else:  # accepted: then it is safe to walk (every walk ends, every index in range)
        back.predict(rng.normal(size=(20, 3)))


# ------------------------------------------------------------------------------------------ phase-2 checkpoints
@seed(8)
@FUZZ
@given(
    name=st.sampled_from(["manifest.json", "trainer_state.json", "config.json", "rng.pt"]), junk=st.binary(max_size=40)
)
def test_phase2_checkpoint_loader_on_damaged_files(tmp_path: Path, name: str, junk: bytes) -> None:
    import tempfile

    from orchestra.teamtr.checkpoint import CheckpointError, load_checkpoint

    stage = Path(tempfile.mkdtemp(dir=tmp_path)) / "stage-0001"
    stage.mkdir()
    for f in ("manifest.json", "trainer_state.json", "config.json"):
        (stage / f).write_text("{}")
    (stage / name).write_bytes(junk)
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(stage)
    assert str(stage) in str(err.value)


# ------------------------------------------------------------------------------------------ user data
USER_RECORDS = st.dictionaries(
    st.sampled_from(
        [
            "question",
            "answer",
            "id",
            "split",
            "difficulty",
            "solution",
            "problem",
            "text",
            "test_list",
            "prompt",
            "entry_point",
            "test",
            "code",
            "zz",
        ]
    ),
    VALUES,
    max_size=5,
)


@seed(9)
@FUZZ
@given(records=st.lists(USER_RECORDS, min_size=1, max_size=4), raw=st.booleans())
def test_user_data_loader_names_file_and_line(tmp_path: Path, records: list[dict[str, Any]], raw: bool) -> None:
    path = tmp_path / "data.jsonl"
    text = "\n".join(json.dumps(r) for r in records)
    path.write_text(text[: len(text) // 2] if raw else text)
    try:
        UserDataFamily(path)
    except UserDataError as e:
        assert str(path) in str(e)


# ------------------------------------------------------------------------------------------ no pickle
def test_no_pickle_anywhere_in_the_packages() -> None:
    """No module imports pickle-like serialisers; every np.load passes allow_pickle=False and every torch.load
    weights_only=True. (Third-party loaders that unpickle are named in docs/robustness.md.)"""
    bad = []
    for pkg in ("orchestra", "envs", "policies", "trajectories"):
        for f in sorted((ROOT / pkg).rglob("*.py")):
            tree = ast.parse(f.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                where = f"{f.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}"
                if isinstance(node, ast.Import | ast.ImportFrom):
                    names = [a.name for a in node.names] + ([node.module] if isinstance(node, ast.ImportFrom) else [])
                    if any(
                        (n or "").split(".")[0] in ("pickle", "cloudpickle", "dill", "joblib", "shelve") for n in names
                    ):
                        bad.append(f"{where}: imports a pickle serialiser")
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "load":
                    owner = ast.unparse(node.func.value)
                    kw = {k.arg: ast.unparse(k.value) for k in node.keywords}
                    if owner in ("np", "numpy") and kw.get("allow_pickle") != "False":
                        bad.append(f"{where}: np.load without allow_pickle=False")
                    if owner in ("torch", "th") and kw.get("weights_only") != "True":
                        bad.append(f"{where}: torch.load without weights_only=True")
    assert bad == []
