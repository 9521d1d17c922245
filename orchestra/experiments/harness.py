"""The experiment harness: what the scheme comparisons of phase 2 share (``orchestra experiment chain | llm``).

An experiment compares trainer schemes over paired seeds. Its unit of work is a *cell* (a run of one scheme from one
seed; the chain also has a length n, the LLM team evaluates each run at several stages), and every finished cell adds
rows to one rows file (``runs.csv``, ``evals.csv``) at once. That file is the resume: run the same experiment again
and :class:`RowLog` keeps the cells complete in it, drops a cell cut short, and the loop plays only the missing ones.
From the rows, pure analysis functions make named tables; :func:`finish` writes each as ``{name}.csv`` and the report
as ``summary.md``, whose named sections (:data:`Sections`) a caller can show one by one.

Both read every scheme under the same accountings: equal stages, and equal sampled episodes
(:func:`episode_stage`: the schemes that sample one batch per stage run n × the stages).

What each harness supplies itself: its config (which cells), how one cell is run (the chain: from a warm start shared
by every scheme of an (n, seed), with exact drift snapshots; the LLM team: trained with checkpoints up to each
evaluation stage, then played on held-out tasks), the order of its cells, its rows' columns and when a cell is
complete, which stored config it may continue, the analysis, the sections and the plots.
"""

from __future__ import annotations

import csv
import math
import os
import sys
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

Row = dict[str, Any]
Tables = dict[str, list[Row]]  # table name → rows (each written as {name}.csv)
Sections = dict[str, list[str]]  # summary.md as named sections of markdown lines, in order
Say = Callable[[str], None]  # where progress lines go
K = TypeVar("K")  # a cell's key in the rows file

# an update whose realised per-token KL is below this left the worker where it was: a batch without learning signal
# (every group's rewards tied, so every advantage 0) moves the adapters by float round-off only (measured ~1e-11 on
# the LLM team), a step with signal by about δ (1e-3)
STILL_KL = 1e-8

# why a p read before an experiment's planned size is not its test: every report that shows an interim look says so
INTERIM_LOOKS = "looking again and again raises the chance of a p below 0.05 by luck"

# ----------------------------------------------------------------------------------------------------------------
# the accountings

# schemes that sample n batches' worth of episodes per stage, as teamtr (naive_bigB: the chain's naive with n × the
# batch): at equal stages they have also sampled equal episodes
FULL_VOLUME: frozenset[str] = frozenset({"teamtr", "stale_indep", "naive_bigB"})


def episode_stage(scheme: str, n: int, num_stages: int, extend_for_episodes: bool) -> int:
    """The stage at which ``scheme`` has sampled as many episodes as teamtr after ``num_stages`` stages with ``n``
    agents: ``num_stages`` for the :data:`FULL_VOLUME` schemes, n × that for the one-batch schemes (unless
    ``extend_for_episodes`` is off: then every scheme stops at ``num_stages``)."""
    return n * num_stages if scheme not in FULL_VOLUME and extend_for_episodes else num_stages


def stderr_say(progress: bool) -> Say:
    """Progress lines to stderr (flushed), or nowhere."""
    return (lambda line: print(line, file=sys.stderr, flush=True)) if progress else (lambda _line: None)


# ----------------------------------------------------------------------------------------------------------------
# the rows file


def maybe_float(text: str) -> float:
    """A float cell that may be empty (written for NaN: :func:`write_rows` with ``nan=""``)."""
    return float(text or "nan")


def _cell_text(v: Any, nan: str) -> Any:
    if isinstance(v, float):
        return nan if math.isnan(v) else repr(float(v))  # float(): a numpy scalar's repr names its type
    return v


def write_rows(path: Path, rows: Iterable[Row], fields: Sequence[str], *, nan: str, mode: str = "w") -> None:
    """Write (``mode="w"``) or append (``"a"``; the header only to a new file) ``rows`` as CSV: floats round-trip
    exactly (``repr``), a NaN as the text ``nan`` names (the chain writes ``""``, the LLM team ``"nan"``)."""
    new = mode == "w" or not path.exists()
    with path.open(mode, newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(fields))
        if new:
            w.writeheader()
        for r in rows:
            w.writerow({k: _cell_text(r[k], nan) for k in fields})


def read_rows(path: Path, columns: Mapping[str, Callable[[str], Any]], optional: Collection[str] = ()) -> list[Row]:
    """The rows of a rows file, each column read back by its parser (ValueError naming the file, or its line for a
    damaged row). A column of ``optional`` (one added after files were written) may be missing: it reads as its
    parser reads an empty cell."""
    rows: list[Row] = []
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        have = set(reader.fieldnames or [])
        missing = [k for k in columns if k not in have and k not in optional]
        if missing:
            raise ValueError(f"{path}: lacks the columns {missing}; use another output directory")
        for line, r in enumerate(reader, start=2):
            try:
                rows.append({k: parse(r[k] if k in have else "") for k, parse in columns.items()})
            except (TypeError, ValueError) as e:
                raise ValueError(f"{path}:{line}: a damaged row ({e}); delete the line to re-run its cell") from e
    return rows


def open_run_dir(out_dir: str | Path, cfg: Any, *, may_differ: Sequence[str] = ()) -> tuple[Path, bool]:
    """An experiment's output directory, created if need be, with ``cfg`` as its ``config.json``: (the directory,
    whether it already held one, i.e. the run resumes). A directory of another config is refused.

    Raises:
        ConfigMismatchError: ``out_dir`` holds a ``config.json`` that differs from ``cfg`` in a field other than
            ``may_differ`` (naming every field).
    """
    from trajectories.rundir import CONFIG_FILE, check_config, write_config

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    resume = (out / CONFIG_FILE).exists()
    if resume:
        check_config(out / CONFIG_FILE, cfg, may_differ=tuple(may_differ), hint="use another output directory")
    write_config(out, cfg)
    return out, resume


class RowLog(Generic[K]):
    """An experiment's rows file, resumed: the rows of its complete cells (:attr:`rows`, :attr:`done`), and every
    cell finished from now on appended (:meth:`add`) the moment it is.

    ``columns``: each column and how its text is read back; ``key``: a row's cell; ``complete``: the cells complete
    among some rows; ``nan``: how a NaN is written (:func:`write_rows`); ``resume=False`` starts the file afresh
    whatever it holds; ``optional``: columns an older file may lack (:func:`read_rows`). Opening drops the rows of a cell cut short from the file (written aside and swapped in, so the
    complete ones are never at risk)."""

    def __init__(
        self,
        path: Path,
        columns: Mapping[str, Callable[[str], Any]],
        key: Callable[[Row], K],
        complete: Callable[[Sequence[Row]], set[K]],
        *,
        nan: str,
        resume: bool = True,
        optional: Collection[str] = (),
    ) -> None:
        self.path, self.columns, self.nan = path, columns, nan
        rows = read_rows(path, columns, optional) if resume and path.exists() else []
        self.done: set[K] = complete(rows)
        self.rows: list[Row] = [r for r in rows if key(r) in self.done]
        partial = path.with_suffix(".csv.tmp")
        partial.unlink(missing_ok=True)
        write_rows(partial, self.rows, list(columns), nan=nan)
        os.replace(partial, path)

    def add(self, key: K, rows: Sequence[Row]) -> None:
        """Cell ``key`` finished: append its rows to the file and mark it done."""
        write_rows(self.path, rows, list(self.columns), nan=self.nan, mode="a")
        self.rows.extend(rows)
        self.done.add(key)


# ----------------------------------------------------------------------------------------------------------------
# the report


@dataclass(frozen=True)
class ExperimentResult:
    """What an experiment wrote: ``summary.md``, its named sections and every table (also ``OUT/{name}.csv``)."""

    summary: Path  # OUT/summary.md
    sections: Sections  # the summary's named sections (lines)
    tables: Tables  # every table, as written

    def section(self, *names: str) -> str:
        """The named sections as markdown (stripped)."""
        return join_sections(self.sections, names).strip()


def finish(out: Path, tables: Tables, sections: Sections, *, nan: str) -> ExperimentResult:
    """Write every non-empty table as ``OUT/{name}.csv`` (NaN written as ``nan``: :func:`write_rows`) and the
    sections as ``OUT/summary.md``. An empty table removes an ``OUT/{name}.csv`` an earlier call wrote, so no reader
    takes a stale table for this one."""
    for name, table in tables.items():
        if table:
            write_rows(out / f"{name}.csv", table, list(table[0]), nan=nan)
        else:
            (out / f"{name}.csv").unlink(missing_ok=True)
    summary = out / "summary.md"
    summary.write_text(join_sections(sections))
    return ExperimentResult(summary, sections, tables)


def join_sections(sections: Sections, names: Sequence[str] | None = None) -> str:
    """Markdown of the named sections (default: all, in order)."""
    return "\n".join(line for name in (names or list(sections)) for line in sections[name])


def cell(v: Any, digits: int = 3) -> str:
    """A table cell: a float to ``digits`` decimals, NaN as —."""
    if isinstance(v, float):
        return "—" if math.isnan(v) else f"{v:.{digits}f}"
    return str(v)


def pval(v: float) -> str:
    """A p-value to two significant digits, NaN as —."""
    return "—" if math.isnan(v) else f"{v:.2g}"


__all__ = [
    "FULL_VOLUME",
    "ExperimentResult",
    "RowLog",
    "Sections",
    "Tables",
    "cell",
    "episode_stage",
    "finish",
    "join_sections",
    "maybe_float",
    "open_run_dir",
    "pval",
    "read_rows",
    "stderr_say",
    "write_rows",
]
