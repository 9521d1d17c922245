"""Trajectory schema and store: round trips, field-path errors, damaged files, resume after a kill."""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path
from typing import Any

import pytest

from trajectories import (
    SCHEMA_VERSION,
    Action,
    ConductorRef,
    Episode,
    Message,
    Reward,
    SchemaError,
    Step,
    TaskRef,
    TeamRef,
    TrajectoryFileError,
    TrajectoryWarning,
    TrajectoryWriter,
    iter_episodes,
    read_many,
    read_trajectories,
    summarize,
)

REPO = Path(__file__).resolve().parents[1]
WORKERS = ["solver", "critic"]
INSTRUCTIONS = ["solve", "check"]
SUBMIT = len(WORKERS) * len(INSTRUCTIONS)  # the last action id, as in TeamEnv


def make_episode(
    episode_id: str = "ep-0",
    *,
    n_steps: int = 3,
    family: str = "arith",
    conductor: str = "round_robin",
    success: bool = True,
    text: str = "x = 42\nso the answer is 42 ✓",
) -> Episode:
    """A small valid episode: n_steps-1 worker turns (solver:solve, critic:check, ...) then submit."""
    steps = []
    for t in range(n_steps):
        last = t == n_steps - 1
        if last:
            action = Action(id=SUBMIT, kind="submit", worker=None, instruction=None)
            message = None
        else:
            w = t % 2
            action = Action(id=w * 2 + w, kind="worker", worker=WORKERS[w], instruction=INSTRUCTIONS[w])
            message = Message(
                worker=WORKERS[w],
                instruction=INSTRUCTIONS[w],
                text=text,
                token_ids=[101, 7, t],
                logprobs=[-0.5, -1.25, -0.0],
                model_id="smollm2-135m-q8",
                prompt_version=f"{WORKERS[w]}-v1",
                finish_reason="stop",
                prompt_tokens=50 + t,
                completion_tokens=3,
                cached=False,
                verdict=None,
            )
        named = {"success": 1.0 if (last and success) else 0.0, "turn_cost": -0.1}
        steps.append(
            Step(
                t=t,
                state={"transcript": [{"worker": "solver", "text": "hi"}] * t, "flags": {"submitted": last}},
                observation=[0.1 * t, -1.0, 0.333333],
                action_mask=[1, 1, 1, 1, 1],
                action=action,
                message=message,
                reward=Reward(named=named, scalar=sum(named.values())),
                terminated=last,
                truncated=False,
            )
        )
    return Episode(
        schema_version=SCHEMA_VERSION,
        episode_id=episode_id,
        run_id="run-1",
        task=TaskRef(id="arith-00007", family=family, split="train", seed=7, difficulty=2),
        team=TeamRef(
            name="duo",
            workers=list(WORKERS),
            model_ids={w: "smollm2-135m-q8" for w in WORKERS},
            prompt_versions={w: f"{w}-v1" for w in WORKERS},
        ),
        conductor=ConductorRef(name=conductor),
        seed=123,
        steps=steps,
        return_=sum(s.reward.scalar for s in steps),
        success=success,
        score=1.0 if success else 0.0,
        terminated=True,
        truncated=False,
        usage={"tokens": {"solver": 60, "critic": 40}, "wall_time_s": 1.5},
        final_observation=[0.5, 0.25, 0.0],
        metadata={"note": "test"},
    )


def line_of(episode: Episode) -> bytes:
    return (json.dumps(episode.to_dict(), ensure_ascii=False, separators=(",", ":")) + "\n").encode()


def write_episodes(path: Path, ids: list[str]) -> None:
    with TrajectoryWriter(path) as writer:
        for episode_id in ids:
            writer.write(make_episode(episode_id))


# ----------------------------------------------------------------------------- schema


def test_round_trip_through_json_is_exact() -> None:
    ep = make_episode(text="line\r\nsep\u2028para é 中文 🎻")
    ep.steps[0].message.logprobs[1] = float("-inf")  # type: ignore[union-attr]  # allowed: impossible token
    d = ep.to_dict()
    assert "return" in d and "return_" not in d
    back = Episode.from_dict(json.loads(json.dumps(d, ensure_ascii=False)))
    assert back == ep
    assert back.steps[0].message is not None and back.steps[0].message.text.endswith("🎻")
    assert back.to_dict() == d


def test_observation_is_rounded_to_6_decimals_and_numpy_is_normalised() -> None:
    np = pytest.importorskip("numpy")
    ep = make_episode()
    d = ep.steps[0].to_dict()
    d.update(observation=np.array([0.1, 1 / 3, -2.0], dtype=np.float32), action_mask=np.ones(5, dtype=bool))
    d["t"] = np.int64(0)
    step = Step(**{**d, "action": ep.steps[0].action, "message": ep.steps[0].message, "reward": ep.steps[0].reward})
    assert step.observation == [0.1, 0.333333, -2.0]
    assert all(type(x) is float for x in step.observation)
    assert step.action_mask == [1, 1, 1, 1, 1] and all(type(x) is int for x in step.action_mask)
    assert type(step.t) is int
    assert Step.from_dict(json.loads(json.dumps(step.to_dict()))) == step


def test_state_is_copied_so_later_env_mutation_does_not_change_the_record() -> None:
    ep = make_episode()
    transcript: list[dict[str, Any]] = [{"worker": "solver", "text": "a"}]
    d = ep.steps[0]
    step = Step(
        d.t, {"transcript": transcript}, d.observation, d.action_mask, d.action, d.message, d.reward, False, False
    )
    transcript.append({"worker": "critic", "text": "b"})
    assert step.state == {"transcript": [{"worker": "solver", "text": "a"}]}


def _corrupt(d: dict[str, Any], where: str) -> None:
    """Apply one named corruption to an episode dict."""
    if where == "action_id_str":
        d["steps"][2]["action"]["id"] = "3"
    elif where == "missing_family":
        del d["task"]["family"]
    elif where == "unknown_field":
        d["steps"][1]["reward"]["bonus"] = 1.0
    elif where == "logprob_length":
        d["steps"][1]["message"]["logprobs"].pop()
    elif where == "masked_action":
        d["steps"][0]["action_mask"][d["steps"][0]["action"]["id"]] = 0
    elif where == "mask_too_short":
        d["steps"][2]["action_mask"] = [1, 1]
    elif where == "t_order":
        d["steps"][1]["t"] = 2
    elif where == "early_termination":
        d["steps"][0]["terminated"] = True
    elif where == "named_reward_str":
        d["steps"][0]["reward"]["named"]["success"] = "1"
    elif where == "bad_verdict":
        d["steps"][0]["message"]["verdict"] = "ok"
    elif where == "token_float":
        d["steps"][1]["message"]["token_ids"][2] = 1.5
    elif where == "nan_observation":
        d["steps"][0]["observation"][1] = float("nan")
    elif where == "steps_not_list":
        d["steps"] = {"0": 1}


@pytest.mark.parametrize(
    ("where", "expected"),
    [
        ("action_id_str", "steps[2].action.id: expected int, got str"),
        ("missing_family", "task.family: missing field"),
        ("unknown_field", "steps[1].reward.bonus: unknown field"),
        ("logprob_length", "steps[1].message.logprobs: length 2 differs from len(token_ids) = 3"),
        ("masked_action", "steps[0].action.id: action 0 (solver:solve) is masked out"),
        ("mask_too_short", "steps[2].action.id: 4 is outside action_mask (length 2)"),
        ("t_order", "steps[1].t: expected 1"),
        ("early_termination", "steps[0].terminated: only the last step may be terminated"),
        ("named_reward_str", "steps[0].reward.named.success: expected float, got str"),
        ("bad_verdict", "steps[0].message.verdict: expected one of"),
        ("token_float", "steps[1].message.token_ids[2]: expected int, got float"),
        ("nan_observation", "steps[0].observation[1]: expected a finite float, got nan"),
        ("steps_not_list", "steps: expected list, got dict"),
    ],
)
def test_schema_error_names_the_field_path(where: str, expected: str) -> None:
    d = make_episode().to_dict()
    _corrupt(d, where)
    with pytest.raises(SchemaError) as info:
        Episode.from_dict(d)
    assert str(info.value).startswith(expected), str(info.value)
    assert info.value.path == expected.split(":")[0]


def test_unknown_schema_version_is_a_clear_error_even_with_new_fields() -> None:
    d = make_episode().to_dict()
    d["schema_version"] = SCHEMA_VERSION + 1
    d["field_from_the_future"] = 1
    with pytest.raises(SchemaError, match=r"^schema_version: unknown schema_version 2 .*upgrade"):
        Episode.from_dict(d)


def test_construction_validates_too_and_errors_pickle() -> None:
    with pytest.raises(SchemaError, match="submit action has worker=None"):
        Action(id=4, kind="submit", worker="solver", instruction=None)
    with pytest.raises(SchemaError, match=r"^kind: expected one of"):
        Action(id=0, kind="talk", worker="solver", instruction=None)  # type: ignore[arg-type]
    err = SchemaError("steps[3].action.id", "expected int, got str")
    back = pickle.loads(pickle.dumps(err))
    assert str(back) == "steps[3].action.id: expected int, got str" and back.path == err.path


# ----------------------------------------------------------------------------- reading


def test_damaged_middle_line_and_truncated_tail_are_reported_with_line_numbers(tmp_path: Path) -> None:
    path = tmp_path / "traj.jsonl"
    lines = [line_of(make_episode(f"ep-{i}")) for i in range(5)]
    bad_schema = make_episode("ep-bad").to_dict()
    bad_schema["steps"][1]["action"]["id"] = "1"
    lines[1] = b'{"schema_version":1,"episode_id":"ep-1","ste\n'  # damaged in the middle
    lines[3] = (json.dumps(bad_schema) + "\n").encode()  # valid JSON, invalid episode
    tail = line_of(make_episode("ep-5"))[:100]  # cut off, no newline
    path.write_bytes(b"".join(lines) + line_of(make_episode("ep-0")) + tail)

    report = read_trajectories(path)
    assert [e.episode_id for e in report.episodes] == ["ep-0", "ep-2", "ep-4"]
    assert [(p.line, p.kind) for p in report.problems] == [
        (2, "damaged"),
        (4, "schema"),
        (6, "duplicate"),
        (7, "truncated"),
    ]
    assert "steps[1].action.id: expected int, got str" in report.problems[1].message
    assert "already read at" in report.problems[2].message and ":1" in report.problems[2].message
    assert not report.ok

    with pytest.raises(TrajectoryFileError, match=rf"{path}:2: damaged"):
        read_trajectories(path, strict=True)
    with pytest.raises(TrajectoryFileError):
        list(iter_episodes(path))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert len(list(iter_episodes(path, strict=False))) == 3
    assert all(w.category is TrajectoryWarning for w in caught)
    assert [str(w.message).split(": ")[0].rsplit(":", 1)[1] for w in caught] == ["2", "4", "6", "7"]


def test_unparseable_last_line_with_newline_counts_as_truncated(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_bytes(line_of(make_episode("a")) + b"\x00\x00garbage\n")
    report = read_trajectories(path)
    assert len(report.episodes) == 1
    assert [(p.line, p.kind) for p in report.problems] == [(2, "truncated")]


def test_missing_file_names_path_and_empty_file_is_valid(tmp_path: Path) -> None:
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        read_trajectories(missing)
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    report = read_trajectories(empty)
    assert report.episodes == [] and report.problems == []


def test_read_many_reads_a_directory_and_flags_cross_file_duplicates(tmp_path: Path) -> None:
    write_episodes(tmp_path / "a.jsonl", ["a0", "a1"])
    write_episodes(tmp_path / "b.jsonl", ["b0", "a1"])
    (tmp_path / "notes.txt").write_text("not a trajectory")
    report = read_many(tmp_path)
    assert [e.episode_id for e in report.episodes] == ["a0", "a1", "b0"]
    assert [(Path(p.path or "").name, p.line, p.kind) for p in report.problems] == [("b.jsonl", 2, "duplicate")]
    assert len(read_many([tmp_path / "a.jsonl", tmp_path / "b.jsonl"]).episodes) == 3


def test_summarize_counts_and_breakdowns() -> None:
    eps = [
        make_episode("e0", family="arith", conductor="rr", success=True, n_steps=3),
        make_episode("e1", family="arith", conductor="cql", success=False, n_steps=2),
        make_episode("e2", family="plan", conductor="cql", success=True, n_steps=4),
    ]
    s = summarize(eps)
    assert s["count"] == 3
    assert s["success_rate"] == pytest.approx(2 / 3)
    assert s["mean_decisions"] == pytest.approx(3.0)
    assert s["mean_turns"] == pytest.approx(2.0)  # worker turns: the final submit is no turn
    assert s["mean_tokens"] == pytest.approx(100.0)
    assert s["mean_return"] == pytest.approx(sum(e.return_ for e in eps) / 3)
    assert s["by_family"]["arith"]["count"] == 2 and s["by_family"]["plan"]["success_rate"] == 1.0
    assert s["by_conductor"]["cql"]["count"] == 2 and s["by_conductor"]["rr"]["success_rate"] == 1.0
    assert list(s["action_histogram"].items()) == [("solver:solve", 4), ("submit", 3), ("critic:check", 2)]
    assert summarize([])["mean_return"] is None


# ----------------------------------------------------------------------------- writing and resume


def test_writer_refuses_existing_file_and_duplicate_ids(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "dir" / "t.jsonl"  # parent dirs are created
    with TrajectoryWriter(path) as writer:
        writer.write(make_episode("x"))
        with pytest.raises(ValueError, match="'x' is already recorded"):
            writer.write(make_episode("x"))
    assert len(read_trajectories(path, strict=True).episodes) == 1
    with pytest.raises(FileExistsError, match="pass --resume to continue it or choose another --out"):
        TrajectoryWriter(path)
    with TrajectoryWriter(path, resume=True) as writer, pytest.raises(ValueError, match="already recorded"):
        writer.write(make_episode("x"))


def test_writer_revalidates_a_record_mutated_after_construction(tmp_path: Path) -> None:
    ep = make_episode()
    ep.steps[0].action_mask[0] = 0  # lists inside frozen records can still be mutated
    with TrajectoryWriter(tmp_path / "t.jsonl") as writer, pytest.raises(SchemaError, match="masked out"):
        writer.write(ep)
    assert (tmp_path / "t.jsonl").read_bytes() == b""


def test_a_failed_write_is_rolled_back_so_the_file_stays_valid(tmp_path: Path) -> None:
    class DiskFullAfterHalf:
        """Writes half of the first chunk it gets, then fails like a full disk."""

        def __init__(self, raw: Any) -> None:
            self.raw = raw

        def write(self, data: memoryview) -> int:
            self.raw.write(data[: len(data) // 2])
            raise OSError(28, "No space left on device")

        def __getattr__(self, name: str) -> Any:
            return getattr(self.raw, name)

    path = tmp_path / "t.jsonl"
    with TrajectoryWriter(path) as writer:
        writer.write(make_episode("a"))
        good = path.read_bytes()
        raw = writer._file
        writer._file = DiskFullAfterHalf(raw)  # type: ignore[assignment]
        with pytest.raises(OSError, match="No space left"):
            writer.write(make_episode("b"))
        assert path.read_bytes() == good and "b" not in writer.done_ids
        writer._file = raw
        writer.write(make_episode("b"))
    assert [e.episode_id for e in read_trajectories(path, strict=True).episodes] == ["a", "b"]


def test_trajectories_imports_nothing_of_ours_nor_heavy_libraries() -> None:
    code = "import sys, trajectories; print(sorted({m.split('.')[0] for m in sys.modules}))"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True).stdout
    loaded = set(json.loads(out.replace("'", '"')))
    assert "trajectories" in loaded
    assert not loaded & {"envs", "policies", "orchestra", "pyarrow", "pandas", "datasets", "numpy"}


@pytest.mark.skipif(sys.platform == "win32", reason="flock is POSIX-only")
def test_second_writer_on_the_same_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    with TrajectoryWriter(path) as writer:
        writer.write(make_episode("a"))
        with pytest.raises(BlockingIOError, match="another process"):
            TrajectoryWriter(path, resume=True)


def test_resume_moves_partial_tail_to_sidecar_and_continues(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    write_episodes(path, ["e0", "e1", "e2"])
    good = path.read_bytes()
    partial = line_of(make_episode("e3"))
    partial = partial[: len(partial) // 2]  # a kill in the middle of a write
    with open(path, "ab") as f:
        f.write(partial)

    with TrajectoryWriter(path, resume=True) as writer:
        assert writer.done_ids == {"e0", "e1", "e2"}
        assert [e.episode_id for e in writer.earlier] == ["e0", "e1", "e2"]  # read once, in file order
        assert writer.sidecar == tmp_path / "t.jsonl.damaged-1"
        assert writer.sidecar.read_bytes() == partial  # never lose bytes
        assert [(p.line, p.kind) for p in writer.problems] == [(4, "truncated")]
        assert path.read_bytes() == good
        for episode_id in ["e3", "e4"]:
            writer.write(make_episode(episode_id))

    report = read_trajectories(path, strict=True)
    ids = [e.episode_id for e in report.episodes]
    assert ids == ["e0", "e1", "e2", "e3", "e4"] and len(set(ids)) == 5

    with open(path, "ab") as f:  # a second crash gets a second sidecar, the first is kept
        f.write(b'{"sche')
    with TrajectoryWriter(path, resume=True) as writer:
        assert writer.sidecar == tmp_path / "t.jsonl.damaged-2" and len(writer.done_ids) == 5
    assert (tmp_path / "t.jsonl.damaged-1").read_bytes() == partial


def test_resume_keeps_damaged_middle_lines_and_a_complete_line_missing_its_newline(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    damaged = b"#### disk hiccup ####\n"
    last = line_of(make_episode("e2"))[:-1]  # complete JSON, newline lost
    path.write_bytes(line_of(make_episode("e0")) + damaged + line_of(make_episode("e1")) + last)
    with TrajectoryWriter(path, resume=True) as writer:
        assert writer.done_ids == {"e0", "e1", "e2"}
        assert [e.episode_id for e in writer.earlier] == ["e0", "e1", "e2"]  # what reading the file gives
        assert writer.sidecar is None
        assert [(p.line, p.kind) for p in writer.problems] == [(2, "damaged")]
        writer.write(make_episode("e3"))
    assert damaged in path.read_bytes()
    report = read_trajectories(path)
    assert [e.episode_id for e in report.episodes] == ["e0", "e1", "e2", "e3"]
    assert [(p.line, p.kind) for p in report.problems] == [(2, "damaged")]


CHILD = textwrap.dedent(
    """
    import json, sys, time
    from trajectories import Episode, TrajectoryWriter

    class SlowDisk:
        # Writes at most 4 KiB per call, slowly, so that a kill can land in the middle of a line.
        def __init__(self, raw):
            self.raw = raw

        def write(self, data):
            time.sleep(0.001)
            return self.raw.write(data[:4096])

        def __getattr__(self, name):
            return getattr(self.raw, name)

    out, template, n = sys.argv[1], json.load(open(sys.argv[2])), int(sys.argv[3])
    with TrajectoryWriter(out, resume=True) as writer:
        writer._file = SlowDisk(writer._file)
        for i in range(n):
            episode_id = f"ep-{i:03d}"
            if episode_id in writer.done_ids:
                continue
            template["episode_id"] = episode_id
            writer.write(Episode.from_dict(template))
            time.sleep(0.01)
    """
)


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL/SIGSTOP are POSIX-only")
@pytest.mark.parametrize("cut", ["mid_line", "between_lines"])
def test_sigkill_mid_run_then_resume_gives_a_valid_file_without_duplicates(tmp_path: Path, cut: str) -> None:
    """A real writer process is SIGKILLed (a) in the middle of writing a line, (b) between lines.

    The child is SIGSTOPped first and killed only once the file is in the wanted state, so the
    test is deterministic; otherwise it is resumed (SIGCONT) and tried again.
    """
    out = tmp_path / "run" / "traj.jsonl"
    template = make_episode(text="z" * 100_000).to_dict()  # ~25 slow chunks per line
    (tmp_path / "template.json").write_text(json.dumps(template))
    n = 20
    cmd = [sys.executable, "-c", CHILD, str(out), str(tmp_path / "template.json"), str(n)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}

    child = subprocess.Popen(cmd, cwd=REPO, env=env)
    while True:  # bounded: the child writes n episodes and exits, which fails the next line
        assert child.poll() is None, f"child exited with {child.returncode} before the file was seen in state {cut!r}"
        os.kill(child.pid, signal.SIGSTOP)
        os.waitpid(child.pid, os.WUNTRACED)  # really stopped: no write in flight while we look
        data = out.read_bytes() if out.exists() else b""
        if data.count(b"\n") >= 3 and data.endswith(b"\n") == (cut == "between_lines"):
            break
        os.kill(child.pid, signal.SIGCONT)
        time.sleep(0.002)
    os.kill(child.pid, signal.SIGKILL)
    assert child.wait() == -signal.SIGKILL
    assert out.read_bytes() == data
    complete = data.count(b"\n")

    with TrajectoryWriter(out, resume=True) as writer:
        assert writer.done_ids == {f"ep-{i:03d}" for i in range(complete)}
        if cut == "mid_line":
            assert [(p.line, p.kind) for p in writer.problems] == [(complete + 1, "truncated")]
            assert writer.sidecar is not None
            assert writer.sidecar.read_bytes() == data[data.rindex(b"\n") + 1 :]  # the cut-off bytes, kept
        else:
            assert writer.problems == [] and writer.sidecar is None
    assert out.read_bytes() == data[: data.rindex(b"\n") + 1]
    assert len(read_trajectories(out, strict=True).episodes) == complete  # valid after recovery

    subprocess.run(cmd, cwd=REPO, env=env, check=True, timeout=120)  # resume to the end
    ids = [e.episode_id for e in read_trajectories(out, strict=True).episodes]
    assert ids == [f"ep-{i:03d}" for i in range(n)]  # all there, each once, in order


# ----------------------------------------------------------------------------- export


def test_parquet_pandas_and_datasets_round_trip(tmp_path: Path) -> None:
    pytest.importorskip("pyarrow")
    from trajectories import load_dataset, load_pandas, to_parquet

    path = tmp_path / "t.jsonl"
    eps = [make_episode(f"e{i}", n_steps=2 + i, success=i % 2 == 0) for i in range(3)]
    with TrajectoryWriter(path) as writer:
        for ep in eps:
            writer.write(ep)
    n_steps = sum(len(e.steps) for e in eps)

    steps_pq = to_parquet(path, tmp_path / "out" / "steps.parquet", table="steps")
    episodes_pq = to_parquet(eps, tmp_path / "out" / "episodes.parquet", table="episodes")

    df = load_pandas(steps_pq, table="steps")
    assert len(df) == n_steps
    for col in [
        "episode_id",
        "run_id",
        "task_id",
        "family",
        "split",
        "conductor",
        "success",
        "return",
        "t",
        "action_id",
        "action_kind",
        "worker",
        "instruction",
        "message_text",
        "completion_tokens",
        "reward_scalar",
        "reward_success",
        "reward_turn_cost",
        "terminated",
        "truncated",
        "observation",
        "state",
    ]:
        assert col in df.columns, col
    assert df.equals(load_pandas(path, table="steps"))  # JSONL and Parquet give the same frame
    first = df[df.episode_id == "e2"].sort_values("t")
    assert list(first.t) == [0, 1, 2, 3]
    assert list(first.action_kind) == ["worker", "worker", "worker", "submit"]
    assert first.message_text.isna().tolist() == [False, False, False, True]  # submit has no message
    assert first.terminated.tolist() == [False, False, False, True]
    assert json.loads(first.state.iloc[1]) == eps[2].steps[1].state
    assert list(first.observation.iloc[1]) == pytest.approx(eps[2].steps[1].observation, abs=1e-6)

    edf = load_pandas(episodes_pq, table="episodes")
    assert len(edf) == 3 and list(edf.num_steps) == [2, 3, 4]
    assert list(edf.success) == [True, False, True] and list(edf.total_tokens) == [100] * 3

    ds = load_dataset(steps_pq, table="steps")
    assert ds.num_rows == n_steps and set(df.columns) == set(ds.column_names)
    assert load_dataset(path, table="episodes").num_rows == 3

    with pytest.raises(ValueError, match="holds the 'steps' table"):
        load_pandas(steps_pq, table="episodes")


def test_export_refuses_a_damaged_file_unless_told(tmp_path: Path) -> None:
    pytest.importorskip("pyarrow")
    from trajectories import load_pandas

    path = tmp_path / "t.jsonl"
    path.write_bytes(line_of(make_episode("a")) + b"{broken\n" + line_of(make_episode("b")))
    with pytest.raises(TrajectoryFileError, match=":2: damaged"):
        load_pandas(path, table="episodes")
    with pytest.warns(TrajectoryWarning, match=":2: damaged"):
        assert len(load_pandas(path, table="episodes", strict=False)) == 2
