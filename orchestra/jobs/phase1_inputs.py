"""What phase 1's report is built from, written beside it so the report can be rebuilt without the run.

A full phase-1 run directory is hundreds of MB (recordings, models, every episode with its observations and
messages). The report (stage 7) reads only a small part of that: each test episode's outcome, cost, action
sequence, task and prompt, plus what earlier stages decided (the best fixed schedule, the released configurations,
the simple routers, the validation headroom, FQE's figures, the distilled rules, the test ledger). Stage 7 writes
exactly that into ``report/inputs/`` and builds the report from what it wrote (one path, so the file cannot
drift from the page): ``report_inputs.json`` and the slim test episodes (``episodes.jsonl.xz``, and
``replicate.jsonl.xz`` for the menu's replicate run), a few hundred kB in all. Committed beside a results page,
``orchestra reproduce conductor --report-only --out DIR`` rebuilds the page from them on a fresh clone.

A slim episode (:func:`slim`) keeps the record's structure and validity: every step's action, action mask, reward
and flags, each worker message's worker, instruction, token counts, verdict and model (its text, token ids and
log-probabilities dropped), the first step's task prompt (the simple router's features), the usage; observations,
states and the final state are dropped.
"""

from __future__ import annotations

import dataclasses
import json
import lzma
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestra.report import stats
from orchestra.report.protocol import FQERow, MenuHeadroomRow
from trajectories import Episode
from trajectories.rundir import atomic_path
from trajectories.schema import SchemaError

INPUTS_FILE = "report_inputs.json"
EPISODES_FILE = "episodes.jsonl.xz"
REPLICATE_FILE = "replicate.jsonl.xz"


@dataclass
class ReportInputs:
    """Everything stage 7 builds the report from (module docstring)."""

    scale: str  # the report's sentence on tasks, seeds and the command that produced the run
    menus: dict[str, list[str]]  # team -> every rule of its team file
    best_fixed: dict[str, str]  # team -> the rule chosen on validation
    released: dict[str, dict[str, str]]  # team -> algorithm -> the configuration released on validation
    learners: dict[str, dict[str, list[str]]]  # team -> algorithm -> its test evaluations' labels, one per seed
    seeds: list[int]  # the learners' training seeds
    run_seed: int
    run_seconds: float  # the run's wall time up to the report
    episodes: list[Episode]  # the test episodes (slim)
    replicate: list[Episode] = field(default_factory=list)  # the menu's replicate run on the test tasks (slim)
    routers: dict[str, stats.StumpRouter] = field(default_factory=dict)  # team -> the simple router (validation)
    validation_headroom: list[MenuHeadroomRow] = field(default_factory=list)
    fqe: list[FQERow] = field(default_factory=list)
    selection: dict[str, stats.FQESelection] = field(default_factory=dict)  # team -> FQE's ranking of checkpoints
    rules: dict[str, str] = field(default_factory=dict)  # team/algorithm -> its distilled rules
    ledger: list[dict[str, Any]] = field(default_factory=list)  # the test ledger's entries

    def write(self, folder: Path) -> Path:
        """Write the inputs into ``folder`` (replacing what is there); returns the folder."""
        folder.mkdir(parents=True, exist_ok=True)
        meta = {k: v for k, v in dataclasses.asdict(self).items() if k not in ("episodes", "replicate")}
        with atomic_path(folder / INPUTS_FILE) as tmp:
            tmp.write_text(json.dumps(meta, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        for name, eps in ((EPISODES_FILE, self.episodes), (REPLICATE_FILE, self.replicate)):
            # the .xz container holds no timestamp: the same episodes give the same bytes
            with atomic_path(folder / name) as tmp, lzma.open(tmp, "wt", encoding="utf-8", preset=9) as f:
                for e in eps:
                    f.write(json.dumps(slim(e).to_dict(), ensure_ascii=False, separators=(",", ":")) + "\n")
        return folder

    @classmethod
    def read(cls, folder: Path) -> ReportInputs:
        """The inputs a :meth:`write` left in ``folder``.

        Raises:
            FileNotFoundError: ``folder`` holds no ``report_inputs.json`` (with what to run instead).
            ValueError: a file or one of its fields is malformed (naming the file, line and field).
        """
        path = folder / INPUTS_FILE
        if not path.exists():
            raise FileNotFoundError(
                f"{path}: missing; --report-only rebuilds a report from the inputs a phase-1 run writes into "
                "OUT/report/inputs (run the experiment first, or point --out at a directory that holds them)"
            )
        try:
            meta = json.loads(path.read_text(encoding="utf-8"))
            return cls(
                **{k: v for k, v in meta.items() if k not in _TYPED},
                routers={t: stats.StumpRouter(**r) for t, r in meta.get("routers", {}).items()},
                validation_headroom=[MenuHeadroomRow(**r) for r in meta.get("validation_headroom", [])],
                fqe=[FQERow(**r) for r in meta.get("fqe", [])],
                selection={t: stats.FQESelection(**s) for t, s in meta.get("selection", {}).items()},
                episodes=read_slim(folder / EPISODES_FILE),
                replicate=read_slim(folder / REPLICATE_FILE),
            )
        except (TypeError, json.JSONDecodeError) as err:
            raise ValueError(f"{path}: {err}") from None


_TYPED = ("routers", "validation_headroom", "fqe", "selection")


def slim(e: Episode) -> Episode:
    """``e`` with only what the report reads (module docstring); still a valid episode."""
    steps = []
    for i, s in enumerate(e.steps):
        msg = s.message and dataclasses.replace(s.message, text="", token_ids=[], logprobs=[])
        state = {"task": {"prompt": s.state["task"]["prompt"]}} if i == 0 and "task" in s.state else {}
        steps.append(dataclasses.replace(s, state=state, observation=[], message=msg))
    meta = {k: v for k, v in e.metadata.items() if k != "final_state"}
    return dataclasses.replace(e, steps=steps, final_observation=None, metadata=meta)


def read_slim(path: Path) -> list[Episode]:
    """The episodes of a ``.jsonl.xz`` file :meth:`ReportInputs.write` wrote; a bad line raises a ValueError that
    names the file, the line and the field."""
    out: list[Episode] = []
    with lzma.open(path, "rt", encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            try:
                out.append(Episode.from_dict(json.loads(line)))
            except (json.JSONDecodeError, SchemaError) as err:
                raise ValueError(f"{path}:{n}: {err}") from None
    return out


__all__ = ["EPISODES_FILE", "INPUTS_FILE", "REPLICATE_FILE", "ReportInputs", "read_slim", "slim"]
