"""Every known error path of the CLI prints exactly one line ``error: …`` on stderr and exits 2: no traceback, also
for argparse's own errors, a lock held by another recorder, a full disk and a read-only folder."""

from __future__ import annotations

import errno
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from orchestra.cli import main
from trajectories import TrajectoryWriter, read_trajectories

from .scripted import record_scripted


def errors_of(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[Any, list[str], str]:
    try:
        rc: Any = main(argv)
    except SystemExit as e:  # argparse exits
        rc = e.code
    err = capsys.readouterr().err
    return rc, [ln for ln in err.splitlines() if ln.startswith("error:")], err


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    (tmp_path / "small.jsonl").write_text('{"question": "1+1?", "answer": "2"}\n')
    (tmp_path / "bad_team.yaml").write_text("name: x\nfamily: arithmetic\nworkers: 5\n")
    (tmp_path / "nan_team.yaml").write_text(
        Path("orchestra/teams/arithmetic.yaml").read_text().replace("success: 1.0", "success: .nan")
    )
    (tmp_path / "junk.npz").write_bytes(b"not an npz")
    (tmp_path / "junk.jsonl").write_text('{"schema_version": 1}\n')
    (tmp_path / "bad.yaml").write_text("trainer: {lr: -1}\n")
    return {p.name.replace(".", "_"): p for p in tmp_path.iterdir()} | {"dir": tmp_path}


CASES: dict[str, tuple[list[str], str]] = {
    # name: (argv with {dir}/{stem} placeholders, a fragment the one line must contain)
    "unknown team": (["record", "--team", "nope", "--conductor", "pipeline", "--out", "{dir}/a.jsonl"], "nope"),
    "broken team file": (
        ["record", "--team", "{bad_team_yaml}", "--conductor", "pipeline", "--out", "{dir}/a"],
        "bad_team",
    ),
    "nan reward weight": (
        ["record", "--team", "{nan_team_yaml}", "--conductor", "pipeline", "--out", "{dir}/a"],
        "success",
    ),
    "unknown conductor": (
        ["record", "--team", "arithmetic", "--conductor", "zzz", "--episodes", "1", "--out", "{dir}/b.jsonl"],
        "zzz",
    ),
    "bad choice": (
        ["record", "--team", "arithmetic", "--conductor", "x", "--split", "dev", "--out", "{dir}/c"],
        "--split",
    ),
    "bad int": (
        ["record", "--team", "arithmetic", "--conductor", "x", "--episodes", "x", "--out", "{dir}/c"],
        "--episodes",
    ),
    "missing flag": (["ope", "--dataset", "{dir}/none.npz"], "required"),
    "unknown command": (["recrod"], "recrod"),
    "user data too small": (
        [
            "record",
            "--team",
            "arithmetic",
            "--family",
            "{small_jsonl}",
            "--conductor",
            "pipeline",
            "--episodes",
            "5",
            "--split",
            "test",
            "--out",
            "{dir}/d.jsonl",
        ],
        "small.jsonl",
    ),
    "no dataset": (["train", "--dataset", "{dir}/none.npz", "--algo", "bc", "--out", "{dir}/m"], "none.npz"),
    "junk dataset": (["train", "--dataset", "{junk_npz}", "--algo", "bc", "--out", "{dir}/m"], "junk.npz"),
    "no trajectories": (
        ["dataset", "build", "--team", "arithmetic", "--input", "{dir}/none.jsonl", "--out", "{dir}/x.npz"],
        "none.jsonl",
    ),
    "damaged trajectories": (
        ["dataset", "build", "--team", "arithmetic", "--input", "{junk_jsonl}", "--out", "{dir}/x.npz"],
        "junk.jsonl:1",
    ),
    "show a missing file": (["trajectories", "show", "{dir}/none.jsonl"], "none.jsonl"),
    "missing config file": (["finetune", "--config", "{dir}/none.yaml", "--out", "{dir}/f"], "none.yaml"),
    "bad config value": (["finetune", "--config", "{bad_yaml}", "--out", "{dir}/f"], "lr"),
    "unwritable out": (
        ["record", "--team", "arithmetic", "--conductor", "pipeline", "--episodes", "1", "--out", "/proc/x/a.jsonl"],
        "/proc/x",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_each_known_error_is_one_line_and_exit_2(case: str, files: dict[str, Path], capsys: Any) -> None:
    argv, fragment = CASES[case]
    argv = [a.format(**files) for a in argv]
    rc, lines, err = errors_of(capsys, argv)
    assert rc == 2, err
    assert len(lines) == 1 and "Traceback" not in err, err
    assert fragment.format(**files) in lines[0], lines[0]


def test_a_second_recorder_on_a_locked_file(tmp_path: Path, capsys: Any) -> None:
    path = tmp_path / "t.jsonl"
    with TrajectoryWriter(path):  # another recorder holds the file
        rc, lines, err = errors_of(
            capsys, ["record", "--team", "arithmetic", "--conductor", "pipeline", "--out", str(path), "--resume"]
        )
    assert rc == 2 and len(lines) == 1 and "Traceback" not in err
    assert str(path) in lines[0] and "another process" in lines[0]


def test_a_full_disk_while_recording_keeps_what_was_written(
    tmp_path: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ENOSPC (then EROFS) injected into the trajectory writer after two episodes: one clear error naming the file;
    the two episodes stay readable and a resumed run adds the rest."""
    from .scripted import arithmetic_team

    team = arithmetic_team()
    real = TrajectoryWriter._append
    for code in (errno.ENOSPC, errno.EROFS):
        path = tmp_path / f"{errno.errorcode[code]}.jsonl"
        monkeypatch.setattr(TrajectoryWriter, "_append", failing_third_write(real, code))
        with pytest.raises(OSError) as exc:
            record_scripted(team, "pipeline", 6, path=path)
        assert exc.value.errno == code and exc.value.filename == str(path)
        assert "2 episodes before it are intact" in str(exc.value)
        monkeypatch.setattr(TrajectoryWriter, "_append", real)
        report = read_trajectories(path)
        assert report.ok and len(report.episodes) == 2  # the half line was rolled back
        eps = record_scripted(team, "pipeline", 6, path=path)
        assert len(eps) == 4 and len(read_trajectories(path).episodes) == 6


def failing_third_write(real: Any, code: int) -> Any:
    """``TrajectoryWriter._append`` whose third call writes half its line, then fails with ``code``."""
    calls = {"n": 0}

    def append(self: TrajectoryWriter, data: bytes) -> None:
        calls["n"] += 1
        if calls["n"] == 3:
            assert self._file is not None
            self._file.write(data[: len(data) // 2])
            raise OSError(code, "injected")
        real(self, data)

    return append


def test_the_real_entry_point_exits_2_without_a_traceback(tmp_path: Path) -> None:
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "orchestra",
            "train",
            "--dataset",
            str(tmp_path / "none.npz"),
            "--algo",
            "bc",
            "--out",
            str(tmp_path / "m"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert [ln for ln in p.stderr.splitlines() if ln.startswith("error:")] == [
        f"error: {tmp_path / 'none.npz'}: no such dataset file (build one with `orchestra dataset build`)"
    ]
