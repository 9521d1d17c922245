"""Writes that either land whole or not at all: a file is written beside its destination and renamed over it, so a
full disk (ENOSPC), a read-only folder (EROFS) or a kill mid-write leaves the previous file (or none) in place,
never a half-written one. Used for datasets and conductor checkpoints; trajectory files are append-only instead
(`trajectories.store`)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str], what: str = "file") -> Iterator[Path]:
    """``with atomic_path(p) as tmp: write(tmp)``: ``tmp`` is renamed to ``p`` (after an fsync) when the block ends
    without an error; otherwise it is removed and an ``OSError`` names ``p`` and says the old one is unchanged."""
    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f".{final.name}.partial-{os.getpid()}")
    try:
        yield tmp
        if tmp.is_file():
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        os.replace(tmp, final)
    except OSError as e:
        _remove(tmp)
        old = "the previous one is unchanged" if final.exists() else "nothing was left behind"
        raise OSError(e.errno, f"{e.strerror or e}: could not write the {what} ({old})", str(final)) from e
    except BaseException:
        _remove(tmp)
        raise


def _remove(p: Path) -> None:
    with contextlib.suppress(OSError):
        if p.is_dir():
            import shutil

            shutil.rmtree(p)
        else:
            p.unlink()


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` to a temporary sibling, then rename it over ``path`` (readers see the old or the new file).
    No fsync: for files rewritten often (metrics, a checkpoint's pointer), where :func:`atomic_path` is too slow."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


__all__ = ["atomic_path", "write_text_atomic"]
