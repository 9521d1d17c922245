"""The one metrics writer of every run directory: ``{name}.jsonl`` (the record), ``{name}.csv`` (columns = the union
of the keys, first-seen order) and, on request, TensorBoard event files under ``tensorboard/{name}/``.

Rows are flat mappings of namespaced keys (``losses/…``, ``kl/…``, ``rollout/…``, ``perf/…``, ``agent/{name}/…``).
The JSONL is appended and flushed at every :meth:`MetricsWriter.append`. The CSV is appended too, and rewritten
atomically when a row brings a new key, so a column that first appears late still gets its header. In TensorBoard
every numeric value of a row is a scalar under its key, at the row's step: the first of ``STEP_KEYS`` the row holds,
else its index in the file. A resumed run passes the rows it keeps; only the rows appended afterwards go to
TensorBoard, so a resume adds no duplicate points.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from trajectories.durable import write_text_atomic

STEP_KEYS: tuple[str, ...] = ("step", "global_step", "timesteps", "update", "stage", "epoch")


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a metrics JSONL. A last line cut by a kill is dropped; any other bad line is a ``ValueError``
    naming the file and line."""
    lines = path.read_text(encoding="utf-8").splitlines()
    out: list[dict[str, Any]] = []
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            if n == len(lines):
                break  # the write a kill interrupted
            raise ValueError(f"{path}:{n}: not a JSON metrics row ({e.msg})") from e
        if not isinstance(row, dict):
            raise ValueError(f"{path}:{n}: a metrics row is a JSON object, got {type(row).__name__}")
        out.append(row)
    return out


class MetricsWriter:
    """Appends flat metrics rows to ``{name}.jsonl`` / ``{name}.csv`` of ``run_dir`` (and TensorBoard if asked).

    ``rows``: the rows already there that the run keeps (a resume); the files are rewritten to hold exactly them.
    ``resume=True`` without ``rows`` keeps whatever ``{name}.jsonl`` holds. Otherwise the files start empty."""

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        name: str = "metrics",
        rows: Sequence[Mapping[str, Any]] | None = None,
        *,
        resume: bool = False,
        tensorboard: bool = False,
    ) -> None:
        run_dir = Path(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        self.jsonl = run_dir / f"{name}.jsonl"
        self.csv = run_dir / f"{name}.csv"
        if rows is None and resume and self.jsonl.exists():
            rows = read_rows(self.jsonl)
        self.rows: list[dict[str, Any]] = [dict(r) for r in rows or ()]
        self.columns: list[str] = []
        self._add_columns(self.rows)
        write_text_atomic(self.jsonl, "".join(json.dumps(r) + "\n" for r in self.rows))
        self._rewrite_csv()
        self.tensorboard_dir = run_dir / "tensorboard" / name if tensorboard else None
        self._tb: Any = None
        if self.tensorboard_dir is not None:
            from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package

            self._tb = SummaryWriter(log_dir=str(self.tensorboard_dir))

    def _add_columns(self, rows: Iterable[Mapping[str, Any]]) -> bool:
        seen = set(self.columns)
        new = False
        for r in rows:
            for k in r:
                if k not in seen:
                    seen.add(k)
                    self.columns.append(k)
                    new = True
        return new

    def _rewrite_csv(self) -> None:
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=self.columns, restval="")
        w.writeheader()
        w.writerows(self.rows)
        write_text_atomic(self.csv, buf.getvalue())

    def append(self, new_rows: Sequence[Mapping[str, Any]]) -> None:
        rows = [dict(r) for r in new_rows]
        if not rows:
            return
        first = len(self.rows)
        self.rows.extend(rows)
        with self.jsonl.open("a", encoding="utf-8") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
        if self._add_columns(rows):
            self._rewrite_csv()
        else:
            with self.csv.open("a", encoding="utf-8", newline="") as f:
                csv.DictWriter(f, fieldnames=self.columns, restval="").writerows(rows)
        if self._tb is not None:
            for i, r in enumerate(rows, start=first):
                step = next((int(r[k]) for k in STEP_KEYS if isinstance(r.get(k), int | float)), i)
                for k, v in r.items():
                    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
                        continue
                    self._tb.add_scalar(k, float(v), global_step=step)
            self._tb.flush()

    def write(self, row: Mapping[str, Any]) -> None:
        """Append one row."""
        self.append([row])

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
            self._tb = None


__all__ = ["STEP_KEYS", "MetricsWriter", "read_rows"]
