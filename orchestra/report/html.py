"""``orchestra report RUN_DIR``: one self-contained HTML file of a run (no network: inline CSS and JS, images as
data URIs), rendered with jinja2 from ``templates/report.html.j2``.

What it holds:

* every results CSV the run wrote (``results.csv``, ``paired.csv``, ``robustness.csv``, ``headroom.csv``…, found
  in the run directory and its ``report/`` and ``robustness/`` folders) as tables;
* every PNG there, embedded;
* a trajectory viewer: per episode, each conductor decision with the legal actions it had, the chosen worker's
  message (tool outputs included), the step's reward, tokens, and the perturbations that touched it; filters by
  family, conductor and outcome; and a side-by-side of two conductors on the same task. Filters can be preset in
  the URL fragment (``report.html#conductor=heuristic&outcome=failure``; ``#task=T&left=A&right=B``), which is how
  the browser test drives them.

Episodes come from every trajectory file under the run directory (``*.jsonl`` other than metrics and ledgers). A
perturbed run (``--perturb``) shows as ``CONDUCTOR @SPEC``. At most ``max_episodes`` are embedded, held-out ones
first (``test/``, ``episodes/``, then ``validation/``); the page says how many were left out.
"""

from __future__ import annotations

import base64
import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trajectories import Episode, read_trajectories

SUBDIRS = (
    "report",
    "robustness",
)  # where a run's tables and plots may also be (phase 1's report, the demo's robustness)
SKIP_JSONL = ("metrics", "updates", "stages", "test_ledger", "evals")
TABLES = (  # file stem -> section title, in page order
    ("results", "Results (success: 95% Wilson interval; return, turns, tokens: 95% bootstrap)"),
    ("paired", "Paired against the best rule-based conductor"),
    ("headroom", "Headroom: oracle router and captured fraction"),
    ("robustness", "Robustness: success under perturbation, paired with the clean run"),
    ("collapse", "Mode collapse: variety of action sequences"),
)


@dataclass(frozen=True)
class HTMLReportConfig:
    """``orchestra report``: which run, where the page goes, how many episodes it embeds."""

    run_dir: str  # a run directory (orchestra evaluate, record, reproduce conductor, demo…)
    out: str | None = None  # HTML file to write (None = RUN_DIR/report.html)
    max_episodes: int = 400  # episodes embedded in the viewer (the first, in file order)


class ReportError(ValueError):
    """The run directory cannot make a report (missing, or nothing in it); the message names it."""


@dataclass(frozen=True)
class _Table:
    id: str
    title: str
    header: list[str]
    rows: list[list[str]]


def _cell(v: str) -> str:
    try:
        x = float(v)
    except ValueError:
        return v
    return v if x.is_integer() and "." not in v else f"{x:.4g}"


def _tables(run_dir: Path) -> list[_Table]:
    out = []
    for stem, title in TABLES:
        for path in (run_dir / f"{stem}.csv", *(run_dir / d / f"{stem}.csv" for d in SUBDIRS)):
            if path.is_file():
                with path.open(newline="", encoding="utf-8") as f:
                    rows = list(csv.reader(f))
                if rows:
                    out.append(_Table(stem, title, rows[0], [[_cell(c) for c in r] for r in rows[1:]]))
                break
    return out


def _plots(run_dir: Path) -> list[dict[str, str]]:
    pngs = sorted([*run_dir.glob("*.png"), *(p for d in SUBDIRS for p in (run_dir / d).glob("*.png"))])
    return [{"name": p.name, "data": base64.b64encode(p.read_bytes()).decode("ascii")} for p in pngs]


def _episode_files(run_dir: Path) -> list[Path]:
    """Trajectory files under ``run_dir``, held-out ones first (``test/`` and ``episodes/``, then ``validation/``,
    then the rest), so the embedded episodes are the evaluated ones when there are more than ``max_episodes``."""
    files = [p for p in run_dir.rglob("*.jsonl") if not p.stem.startswith(SKIP_JSONL) and "_run" not in p.parent.name]
    rank = {"test": 0, "episodes": 0, "validation": 1}
    return sorted(files, key=lambda p: (min([rank.get(d, 2) for d in p.relative_to(run_dir).parts[:-1]] or [2]), p))


def _labels(team: str, n: int) -> list[str]:
    """Action labels of a built-in team (``worker:instruction``, ``submit``); ``action i`` for another team."""
    try:
        from orchestra.runtime.team_file import load_team

        cfg = load_team(team).env
        if cfg.num_actions == n:
            return [cfg.action_label(a) for a in range(n)]
    except (OSError, ValueError, KeyError):
        pass
    return [f"action {a}" for a in range(n)]


def _view(e: Episode, labels: dict[tuple[str, int], list[str]]) -> dict[str, Any]:
    perturb = e.metadata.get("perturb") or []
    conductor = e.conductor.name + (f" @{','.join(perturb)}" if perturb else "")
    transcript = e.metadata.get("final_state", {}).get("transcript", [])
    steps = []
    for st in e.steps:
        key = (e.team.name, len(st.action_mask))
        if key not in labels:
            labels[key] = _labels(*key)
        names = labels[key]
        entry = transcript[st.t] if st.t < len(transcript) else {}
        msg = st.message
        steps.append(
            {
                "t": st.t + 1,
                "label": st.action.label,
                "legal": [names[a] for a, bit in enumerate(st.action_mask) if bit],
                "reward": st.reward.scalar,
                "message": msg.text if msg is not None else None,
                "worker": msg.worker if msg is not None else "",
                "tokens": msg.completion_tokens if msg is not None else 0,
                "verdict": msg.verdict if msg is not None else None,
                "tool": bool(msg is not None and msg.model_id.startswith("tool")),
                "perturbed": entry.get("perturbed") if entry.get("worker") == st.action.worker else None,
            }
        )
    outcome = "error" if e.error is not None else "success" if e.success else "failure"
    return {
        "family": e.task.family,
        "conductor": conductor,
        "task": e.task.id,
        "outcome": outcome,
        "css": {"success": "ok", "failure": "fail", "error": "err"}[outcome],
        "return_": e.return_,
        "tokens": sum(int(v) for v in (e.usage.get("tokens") or {}).values()),
        "steps": steps,
        "reason": e.metadata.get("verdict_reason", ""),
    }


def write_html_report(run_dir: str | Path, out: str | Path | None = None, max_episodes: int = 400) -> Path:
    """Write ``RUN_DIR/report.html`` (or ``out``); returns its path."""
    import jinja2

    run = Path(run_dir)
    if not run.is_dir():
        raise ReportError(f"{run}: no such run directory")
    episodes: list[Episode] = []
    for path in _episode_files(run):
        episodes.extend(read_trajectories(path).episodes)
    tables, plots = _tables(run), _plots(run)
    if not episodes and not tables:
        raise ReportError(f"{run}: no results tables and no trajectory files to report")
    labels: dict[tuple[str, int], list[str]] = {}
    shown = [_view(e, labels) for e in episodes[:max_episodes]]
    facets = {k: sorted({v[k] for v in shown}) for k in ("family", "conductor", "outcome", "task")}
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("orchestra.report", "templates"), autoescape=True, undefined=jinja2.StrictUndefined
    )
    html = env.get_template("report.html.j2").render(
        title=f"orchestra run report: {run.name}",
        run_dir=str(run),
        tables=tables,
        plots=plots,
        episodes=shown,
        facets=facets,
        n_episodes=len(shown),
        n_left_out=max(0, len(episodes) - len(shown)),
    )
    target = Path(out) if out is not None else run / "report.html"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(html, encoding="utf-8")
    return target


__all__ = ["HTMLReportConfig", "ReportError", "write_html_report"]
