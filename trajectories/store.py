"""Append-only JSONL trajectory store: one `Episode` per line, fsynced per episode (docs/architecture.md §4).

Why this shape: rollouts are long and get killed (OOM, pre-emption, Ctrl-C). One line per episode,
written with a single append and fsynced, means a kill loses at most the episode being written, and
that loss is visible: the file then ends in a line without a newline. The reader validates every
line and *reports* problems (it never silently drops one); the writer, asked to ``resume``, moves a
cut-off tail into a ``<file>.damaged-<n>`` sidecar (bytes are never deleted), truncates the file to
its last good line and tells the caller which episode ids are already done, so a resumed run
neither duplicates nor loses episodes.

Problem kinds, by 1-based physical line number:

- ``truncated``: the last line is not valid JSON (the writer was cut off mid-line);
- ``damaged``: a line before the last is not valid JSON (or is empty) — left in place, reported;
- ``schema``: valid JSON that is not a valid episode (`SchemaError`, with the field path);
- ``duplicate``: a valid episode whose ``episode_id`` was already read (the first one is kept).

A reader running while a writer appends may see the line being written as a ``truncated`` tail;
read again after the writer closes. Lines are split on ``b"\\n"`` only: ``json.dumps`` escapes ``\\n`` and ``\\r`` inside strings, and with
``ensure_ascii=False`` characters such as U+2028 stay raw, so text-mode line splitting would be wrong.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import warnings
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any, Literal

from trajectories.schema import Episode, SchemaError

ProblemKind = Literal["damaged", "truncated", "schema", "duplicate"]
PathLike = str | os.PathLike[str]


@dataclass(frozen=True)
class Problem:
    """One bad line: where (1-based line, file), what kind, and why."""

    line: int
    kind: ProblemKind
    message: str
    path: str | None = None

    def __str__(self) -> str:
        where = f"{self.path}:{self.line}" if self.path else f"line {self.line}"
        return f"{where}: {self.kind}: {self.message}"


@dataclass
class ReadReport:
    """Everything read from one or more files: the valid episodes and every problem met."""

    episodes: list[Episode] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    paths: list[Path] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


class TrajectoryFileError(ValueError):
    """A trajectory file has a problem and the caller asked for strict reading."""

    def __init__(self, problem: Problem) -> None:
        super().__init__(str(problem))
        self.problem = problem


class TrajectoryWarning(UserWarning):
    """A problem met by a non-strict `iter_episodes`; the line was skipped but not silently."""


# ----------------------------------------------------------------------------- scanning


@dataclass(frozen=True)
class _Line:
    number: int  # 1-based
    start: int  # byte offset of the line's first byte
    body: bytes  # without the newline
    has_newline: bool
    is_last: bool = False


def _lines(handle: IO[bytes]) -> Iterator[_Line]:
    """Physical lines with their byte offsets; one line of lookahead to flag the last one."""
    offset = 0
    pending: _Line | None = None
    for number, raw in enumerate(handle, start=1):  # binary iteration splits on b"\n" only
        has_newline = raw.endswith(b"\n")
        line = _Line(number, offset, raw[:-1] if has_newline else raw, has_newline)
        offset += len(raw)
        if pending is not None:
            yield pending
        pending = line
    if pending is not None:
        yield replace(pending, is_last=True)


def _classify(line: _Line, path: str, seen: dict[str, str]) -> Episode | Problem:
    """Parse and validate one line; `seen` maps episode_id -> where it was first read."""
    try:
        data = json.loads(line.body.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        if not line.body.strip():
            return Problem(line.number, "truncated" if line.is_last else "damaged", "empty line", path)
        if line.is_last:
            cut = "no trailing newline" if not line.has_newline else "ends the file"
            why = f"last line is not valid JSON ({err}); {cut}: the write was cut off (killed run?)"
            return Problem(line.number, "truncated", why, path)
        return Problem(line.number, "damaged", f"not valid JSON ({err}); left in place", path)
    try:
        episode = Episode.from_dict(data)
    except SchemaError as err:
        return Problem(line.number, "schema", str(err), path)
    where = f"{path}:{line.number}"
    first = seen.setdefault(episode.episode_id, where)
    if first != where:
        return Problem(line.number, "duplicate", f"episode_id {episode.episode_id!r} already read at {first}", path)
    return episode


def _scan(path: Path, seen: dict[str, str]) -> Iterator[tuple[_Line, Episode | Problem]]:
    try:
        handle = open(path, "rb")  # noqa: SIM115 - closed by the with below; open() first for the error
    except FileNotFoundError:
        raise FileNotFoundError(2, "trajectory file not found", str(path)) from None
    with handle:
        for line in _lines(handle):
            yield line, _classify(line, str(path), seen)


# ----------------------------------------------------------------------------- reading


def read_trajectories(path: PathLike, *, strict: bool = False) -> ReadReport:
    """Read and validate every line of one JSONL file.

    Non-strict (default) returns all valid episodes plus a `Problem` per bad line, so a damaged
    line costs one episode, not the file. ``strict=True`` raises `TrajectoryFileError` (naming file
    and line) at the first problem. A missing file raises `FileNotFoundError`; an empty file is valid.
    """
    return read_many([path], strict=strict)


def read_many(paths: PathLike | Iterable[PathLike], *, strict: bool = False) -> ReadReport:
    """Read several files and/or directories (their ``*.jsonl``, sorted) into one report.

    Duplicate episode ids are detected across files too (the first occurrence is kept).
    """
    files = _expand(paths)
    report = ReadReport(paths=files)
    seen: dict[str, str] = {}
    for file in files:
        for _, result in _scan(file, seen):
            if isinstance(result, Episode):
                report.episodes.append(result)
            elif strict:
                raise TrajectoryFileError(result)
            else:
                report.problems.append(result)
    return report


def iter_episodes(path: PathLike | Iterable[PathLike], *, strict: bool = True) -> Iterator[Episode]:
    """Stream valid episodes without holding the file in memory.

    A generator cannot return problems alongside episodes, so by default it is strict (raises
    `TrajectoryFileError`); with ``strict=False`` each problem is emitted as a `TrajectoryWarning`.
    """
    seen: dict[str, str] = {}
    for file in _expand(path):
        for _, result in _scan(file, seen):
            if isinstance(result, Episode):
                yield result
            elif strict:
                raise TrajectoryFileError(result)
            else:
                warnings.warn(str(result), TrajectoryWarning, stacklevel=2)


def _expand(paths: PathLike | Iterable[PathLike]) -> list[Path]:
    items: Iterable[PathLike] = [paths] if isinstance(paths, str | os.PathLike) else paths
    files: list[Path] = []
    for item in items:
        p = Path(item)
        if p.is_dir():
            found = sorted(p.glob("*.jsonl"))
            if not found:
                raise FileNotFoundError(2, "no *.jsonl trajectory files in directory", str(p))
            files.extend(found)
        else:
            files.append(p)  # a missing file raises FileNotFoundError when scanned
    return files


# ----------------------------------------------------------------------------- writing


class TrajectoryWriter:
    """Append episodes to a JSONL file, one fsynced line each; resumable after a kill.

    ``resume=False`` refuses an existing file (never clobber a run). ``resume=True`` scans it:
    ``done_ids`` gets the ids of valid episodes, ``earlier`` those episodes (what reading the file back would give), ``problems`` every bad line; a cut-off tail is
    moved to ``sidecar`` (``<path>.damaged-<n>``) and the file truncated to its last good line;
    damaged middle lines stay where they are. The file is locked (``flock``) while open, so two
    processes cannot interleave lines.
    """

    def __init__(self, path: PathLike, *, resume: bool = False) -> None:
        self.path = Path(path)
        self.done_ids: set[str] = set()
        self.earlier: list[Episode] = []  # resume: the valid episodes already in the file, in file order
        self.problems: list[Problem] = []
        self.sidecar: Path | None = None
        self._file: IO[bytes] | None = None
        self._write_lock = threading.Lock()  # rollout threads may share one writer: check-and-append is atomic
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            # O_APPEND in both modes: every write lands at the current end, also after a rollback or a
            # recovery truncated the file. Unbuffered: a failed write can be rolled back with ftruncate
            # (nothing is left in a buffer to be flushed later).
            flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | (0 if resume else os.O_EXCL)
            self._file = os.fdopen(os.open(self.path, flags, 0o666), "ab", buffering=0)
        except FileExistsError:
            raise FileExistsError(
                17, "trajectory file exists; pass --resume to continue it or choose another --out", str(self.path)
            ) from None
        try:
            _lock(self._file, self.path)
            self._size = os.fstat(self._file.fileno()).st_size  # bytes known good; a failed write rolls back to it
            if resume:
                self._recover()
            else:
                _fsync_dir(self.path.parent)
        except BaseException:
            self._file.close()
            self._file = None
            raise

    def _recover(self) -> None:
        """Scan the existing file; move a cut-off tail to a sidecar; add a missing final newline."""
        assert self._file is not None
        tail: _Line | None = None
        missing_newline = False
        seen: dict[str, str] = {}
        for line, result in _scan(self.path, seen):
            if isinstance(result, Episode):
                self.done_ids.add(result.episode_id)
                self.earlier.append(result)
            else:
                self.problems.append(result)
            if line.is_last:
                if isinstance(result, Problem) and result.kind == "truncated":
                    tail = line
                elif not line.has_newline:  # complete JSON whose newline was cut: keep it
                    missing_newline = True
        if tail is not None:
            with open(self.path, "rb") as src:
                src.seek(tail.start)
                damaged = src.read()
            self.sidecar = _write_sidecar(self.path, damaged)  # durable before the truncation below
            self._file.truncate(tail.start)
            os.fsync(self._file.fileno())
            self._size = tail.start
            self.problems[-1] = replace(
                self.problems[-1], message=f"{self.problems[-1].message}; moved to {self.sidecar}"
            )
        elif missing_newline:
            self._commit(b"\n")

    def write(self, episode: Episode) -> None:
        """Append one episode as one line, then flush and fsync; refuse an id already recorded."""
        if not isinstance(episode, Episode):
            raise TypeError(f"expected Episode, got {type(episode).__name__}")
        data = episode.to_dict()
        Episode.from_dict(data)  # re-validate: lists inside the record may have been mutated since construction
        line = (json.dumps(data, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8")
        with self._write_lock:
            if self._file is None:
                raise ValueError(f"TrajectoryWriter for {self.path} is closed")
            if episode.episode_id in self.done_ids:
                raise ValueError(f"episode_id {episode.episode_id!r} is already recorded in {self.path}")
            try:
                self._commit(line)
            except OSError as e:  # disk full (ENOSPC), read-only (EROFS), quota, I/O error: one clear error
                raise OSError(
                    e.errno,
                    f"{e.strerror or e}: could not append episode {episode.episode_id}; the "
                    f"{len(self.done_ids)} episodes before it are intact (rerun with --resume once it can be written)",
                    str(self.path),
                ) from e
            self.done_ids.add(episode.episode_id)

    def _commit(self, data: bytes) -> None:
        """Append ``data`` durably, or roll a partial line back (disk full, Ctrl-C) so the file still ends at its
        last good line and the next write does not land after garbage."""
        assert self._file is not None
        try:
            self._append(data)
        except BaseException:
            with contextlib.suppress(OSError):
                self._file.truncate(self._size)
            raise
        self._size += len(data)

    def _append(self, data: bytes) -> None:
        assert self._file is not None
        view = memoryview(data)
        while view:  # raw writes may be partial
            written = self._file.write(view)
            view = view[written or 0 :]
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        """Close the file (releasing the lock); idempotent."""
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> TrajectoryWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_file", None) is not None:
            self.close()


def _lock(handle: IO[bytes], path: Path) -> None:
    if sys.platform == "win32":  # no flock; single-writer discipline is then the caller's
        return
    import fcntl

    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise BlockingIOError(11, "trajectory file is being written by another process", str(path)) from None


def _write_sidecar(path: Path, data: bytes) -> Path:
    n = 1
    while True:
        sidecar = path.with_name(f"{path.name}.damaged-{n}")
        try:
            with open(sidecar, "xb") as out:
                out.write(data)
                out.flush()
                os.fsync(out.fileno())
        except FileExistsError:
            n += 1
            continue
        _fsync_dir(path.parent)
        return sidecar


def _fsync_dir(directory: Path) -> None:
    """Make a created file's directory entry durable (POSIX); a no-op where unsupported."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# ----------------------------------------------------------------------------- summary


def summarize(episodes: Iterable[Episode]) -> dict[str, Any]:
    """Headline numbers of a set of episodes, overall and per family / per conductor.

    Means are None when there are no episodes (not NaN, so the dict stays valid JSON). Tokens are
    `Episode.total_tokens`; turns are steps. The action histogram counts decoded actions
    (``"worker:instruction"``, ``"worker"`` or ``"submit"``), most frequent first.

    Episodes ended by a fault (`Episode.error`) are not task outcomes: they are counted under ``errors``
    (total and by cause) and left out of every other figure, so a flaky server never reads as a weak team.
    """
    episodes = list(episodes)
    errored = [ep for ep in episodes if ep.error is not None]
    episodes = [ep for ep in episodes if ep.error is None]
    by_family: dict[str, list[Episode]] = defaultdict(list)
    by_conductor: dict[str, list[Episode]] = defaultdict(list)
    actions: Counter[str] = Counter()
    for ep in episodes:
        by_family[ep.task.family].append(ep)
        by_conductor[ep.conductor.name].append(ep)
        actions.update(step.action.label for step in ep.steps)
    return {
        **_stats(episodes),
        "by_family": {k: _stats(v) for k, v in sorted(by_family.items())},
        "by_conductor": {k: _stats(v) for k, v in sorted(by_conductor.items())},
        "action_histogram": dict(sorted(actions.items(), key=lambda kv: (-kv[1], kv[0]))),
        "errors": error_counts(errored),
    }


def error_counts(episodes: Iterable[Episode]) -> dict[str, Any]:
    """``{"count": n, "by_cause": {cause: n}}`` over the episodes a fault ended (others are ignored)."""
    causes = Counter(ep.error.cause for ep in episodes if ep.error is not None)
    return {"count": sum(causes.values()), "by_cause": dict(sorted(causes.items()))}


def _stats(episodes: list[Episode]) -> dict[str, Any]:
    def mean(values: Iterable[float]) -> float | None:
        values = list(values)
        return sum(values) / len(values) if values else None

    return {
        "count": len(episodes),
        "success_rate": mean(float(ep.success) for ep in episodes),
        "mean_return": mean(ep.return_ for ep in episodes),
        "mean_score": mean(ep.score for ep in episodes),
        "mean_turns": mean(float(ep.worker_turns) for ep in episodes),
        "mean_decisions": mean(float(len(ep.steps)) for ep in episodes),
        "mean_tokens": mean(float(ep.total_tokens) for ep in episodes),
        "truncation_rate": mean(float(ep.truncated) for ep in episodes),
    }
