"""``orchestra report RUN_DIR``: one self-contained HTML file of a run (no network: inline CSS and JS, images as
data URIs), rendered with jinja2 from ``templates/report.html.j2``.

What it holds, in page order:

* "What this run found": what was run (teams, task families, conductors, tasks from ``results.csv`` /
  ``paired.csv``; seeds from ``config.json`` when the run has one), one sentence per paired comparison with its 95%
  interval and verdict, what the numbers do not show (no comparison significant, or which ones are not, and how
  wide their intervals are at this number of tasks), and the main figure (``cost_quality.png``, the phase-1
  success–cost plane, else ``cost.png``, else ``success.png``) beside them;
* every results CSV the run wrote (``results.csv``, ``paired.csv``, ``robustness.csv``, ``headroom.csv``…, found
  in the run directory and its ``report/`` and ``robustness/`` folders) as tables for people: success-like
  fractions as percentages with one decimal, differences of them in points, intervals as ``[lo, hi]``, booleans as
  yes/no, the columns a reader needs first (``MAIN_COLUMNS``) and the rest in a "details" fold; fixed layout with
  wrapping, so no table scrolls sideways at 1280 px;
* every other PNG there, embedded, on a two-column grid, each figure once (a plane without the hull beside phase 1's
  cost–quality plane, or the perturbed runs' plots beside ``robustness.png``, are left out; so is the page's own
  screenshot);
* a trajectory viewer: per episode, each conductor decision with the legal actions it had, the chosen worker's
  message (tool outputs included), the step's reward, tokens, and the perturbations that touched it; filters by
  family, conductor and outcome; and a side-by-side of two conductors on the same task. Filters can be preset in
  the URL fragment (``report.html#conductor=heuristic&outcome=failure``; ``#task=T&left=A&right=B``), which is how
  the browser test drives them.

Episodes come from every trajectory file under the run directory (``*.jsonl`` other than metrics and ledgers). A
perturbed run (``--perturb``) shows as ``CONDUCTOR @SPEC``. At most ``max_episodes`` are embedded, held-out ones
first (``test/``, ``episodes/``, then ``validation/``); the page says how many were left out.

:func:`first_screen` photographs the page's first 1280 × 900 px with a headless Chromium (``make demo`` keeps it as
``report_first_screen.png`` beside the report).
"""

from __future__ import annotations

import base64
import csv
import json
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


MAIN_FIGURES = ("cost_quality.png", "cost.png", "success.png")  # the first one a run has leads the page
MAIN_COLUMNS = {  # file stem -> the columns a reader needs first (an interval by its low column); the rest fold away
    "results": ("family", "conductor", "episodes", "success_rate", "ci_low", "mean_tokens", "mean_turns", "errored"),
    "paired": (
        "family",
        "conductor",
        "baseline",
        "n_pairs",
        "success",
        "baseline_success",
        "success_diff",
        "success_lo",
        "mcnemar_p_holm",
        "verdict",
    ),
    "headroom": (
        "team",
        "tasks",
        "best_fixed",
        "best_fixed_success",
        "oracle_success",
        "headroom",
        "learner",
        "learner_success_mean",
        "captured_mean",
    ),
    "robustness": (
        "team",
        "conductor",
        "perturbation",
        "tasks",
        "clean_success",
        "perturbed_success",
        "diff_lo",
        "p_holm",
    ),
    "collapse": ("family", "conductor", "episodes", "distinct", "top_share", "collapsed"),
}
KEYS = ("family", "team", "conductor")  # repeated in the details fold so its rows can be read on their own
DETAIL_WIDTH = 7  # columns per table in the details fold (besides the keys), so none is wider than the page
LABELS = {
    "success_rate": "success (%)",
    "success": "success (%)",
    "baseline_success": "baseline success (%)",
    "clean_success": "clean success (%)",
    "oracle_success": "oracle success (%)",
    "success_diff": "Δ success (points)",
    "diff": "Δ success (points)",
    "perturbed_success": "perturbed success (%)",
    "best_fixed_success": "best fixed success (%)",
    "best_on_test_success": "best on test success (%)",
    "learner_success_mean": "learner success, mean (%)",
    "captured_mean": "captured, mean (%)",
    "headroom": "headroom (points)",
    "p_holm": "McNemar p (Holm)",
    "truncated_rate": "truncated (%)",
    "top_share": "top sequence share (%)",
    "mean_tokens": "tokens / episode",
    "mean_turns": "turns / episode",
    "mean_return": "return / episode",
    "n_pairs": "paired tasks",
    "mcnemar_p_holm": "McNemar p (Holm)",
    "mcnemar_p": "McNemar p",
    "ni_p_holm": "non-inferiority p (Holm)",
    "ni_p": "non-inferiority p",
    "ni_lower": "non-inferiority lower bound (points)",
    "rule_based": "rule-based",
    "entropy_bits": "entropy (bits)",
}
# what a headline sentence reads from a paired.csv row: the table's reader columns and the interval's high end
VERDICT_COLUMNS = (*MAIN_COLUMNS["paired"], "success_hi")
PERCENT = {
    "success_rate",
    "success",
    "baseline_success",
    "clean_success",
    "oracle_success",
    "truncated_rate",
    "top_share",
    "perturbed_success",
    "best_fixed_success",
    "best_on_test_success",
    "learner_success_mean",
    "captured_mean",
}
POINTS = {
    "success_diff",
    "ni_lower",
    "diff",
    "headroom",
    "learner_success_sd",
    "captured_sd",
}  # differences of success fractions, shown in percentage points


@dataclass(frozen=True)
class _Column:
    name: str  # the CSV column (an interval: its low column)
    label: str  # the header a person reads, with the unit
    hi: str | None = None  # an interval's high column


@dataclass(frozen=True)
class _Table:
    id: str
    title: str
    header: list[str]
    rows: list[list[str]]
    details: list[tuple[list[str], list[list[str]]]]  # the other columns, in tables of at most DETAIL_WIDTH


def _interval_of(name: str, header: list[str]) -> tuple[str, str] | None:
    """``(subject, high column)`` when ``name`` is an interval's low column (``ci_low``, ``X_ci_low``, ``X_lo``)."""
    if name == "ci_low" and "ci_high" in header:
        return "success_rate", "ci_high"
    for lo, hi in (("_ci_low", "_ci_high"), ("_lo", "_hi")):
        if name.endswith(lo) and name[: -len(lo)] + hi in header:
            base = name[: -len(lo)]
            return (base + "_diff" if base + "_diff" in header else base), base + hi
    return None


def _columns(header: list[str]) -> list[_Column]:
    highs = {iv[1] for h in header if (iv := _interval_of(h, header))}
    out = []
    for h in header:
        if h in highs:
            continue
        iv = _interval_of(h, header)
        if iv is None:
            out.append(_Column(h, LABELS.get(h, h.replace("_", " "))))
        else:
            subject = LABELS.get(iv[0], iv[0].replace("_", " "))
            out.append(_Column(h, f"{subject.split(' (')[0]} 95% CI" + _unit(iv[0]), iv[1]))
    return out


def _unit(subject: str) -> str:
    return " (%)" if subject in PERCENT else " (points)" if subject in POINTS else ""


def _number(v: str, kind: str) -> str:
    """One cell for a person: ``kind`` is ``%`` (a fraction as a percentage), ``pt`` (a difference of fractions in
    percentage points), or ``""`` (counts as they are, other numbers to 3 significant digits); yes/no for booleans."""
    if v in ("True", "False"):
        return "yes" if v == "True" else "no"
    try:
        x = float(v)
    except ValueError:
        return v
    if kind == "%":
        return f"{100 * x:.1f}%"
    if kind == "pt":
        return f"{100 * x:+.1f}".replace("-", "−")
    if x.is_integer() and "." not in v:
        return v
    return f"{x:.3g}"


def _kind(name: str) -> str:
    return "%" if name in PERCENT else "pt" if name in POINTS else ""


def _render(col: _Column, header: list[str], row: dict[str, str]) -> str:
    if col.hi is None:
        return _number(row.get(col.name, ""), _kind(col.name))
    iv = _interval_of(col.name, header)
    kind = _kind(iv[0]) if iv else ""
    return f"[{_number(row.get(col.name, ''), kind)}, {_number(row.get(col.hi, ''), kind)}]"


def _table(stem: str, title: str, header: list[str], raw: list[list[str]]) -> _Table:
    """A results CSV as a table for people: the reader's columns first, the rest in folded tables."""
    rows = [dict(zip(header, r, strict=False)) for r in raw]
    cols = _columns(header)
    first = [c for c in cols if c.name in MAIN_COLUMNS.get(stem, ())] or cols[:6]
    rest = [c for c in cols if c not in first]
    keys = [c for c in first if c.name in KEYS]
    details = []
    for i in range(0, len(rest), DETAIL_WIDTH):
        part = keys + rest[i : i + DETAIL_WIDTH]
        details.append(([c.label for c in part], [[_render(c, header, r) for c in part] for r in rows]))
    return _Table(
        stem, title, [c.label for c in first], [[_render(c, header, r) for c in first] for r in rows], details
    )


def _tables(run_dir: Path) -> list[_Table]:
    out = []
    for stem, title in TABLES:
        path = _find(run_dir, f"{stem}.csv")
        if path is not None:
            rows = _read_csv(path)
            if rows:
                out.append(_table(stem, title, rows[0], rows[1:]))
    return out


def _find(run_dir: Path, name: str) -> Path | None:
    """``run_dir/name``, else the first of ``run_dir/report/name``, ``run_dir/robustness/name``."""
    return next((p for p in (run_dir / name, *(run_dir / d / name for d in SUBDIRS)) if p.is_file()), None)


def _read_csv(path: Path) -> list[list[str]]:
    with path.open(newline="", encoding="utf-8") as f:
        return list(csv.reader(f))


def _dicts(run_dir: Path, stem: str) -> list[dict[str, str]]:
    path = _find(run_dir, f"{stem}.csv")
    rows = _read_csv(path) if path is not None else []
    return [dict(zip(rows[0], r, strict=False)) for r in rows[1:]] if rows else []


def _pct(v: str) -> str:
    return f"{100 * float(v):.1f}%"


def _pt(v: str) -> str:
    return f"{100 * float(v):+.1f}".replace("-", "−")


SIGNIFICANT = ("beats", "better", "worse")  # the paired table's verdicts that rest on a significant McNemar test
MAX_HEADLINES = 5  # sentences on the first screen; the rest are counted in one line (the paired table has them all)


def _verdicts(paired: list[dict[str, str]]) -> tuple[list[str], str]:
    """The first screen's sentences from ``paired.csv`` and what they do not show (the caveat, read first). One
    sentence per comparison with its interval, the comparisons with a verdict first (significant, then cheaper or
    non-inferior), at most :data:`MAX_HEADLINES`; one line counts the rest, which the paired table lists."""

    def sentence(r: dict[str, str]) -> str:
        return (
            f"{r['conductor']} against {r['baseline']} on {r['family']} ({r['n_pairs']} paired tasks): success "
            f"{_pct(r['success'])} vs {_pct(r['baseline_success'])}, a difference of {_pt(r['success_diff'])} points "
            f"[{_pt(r['success_lo'])}, {_pt(r['success_hi'])}] (95% interval); McNemar p = "
            f"{float(r['mcnemar_p_holm']):.3g} (Holm): {r['verdict']}."
        )

    significant = [r for r in paired if r.get("verdict") in SIGNIFICANT]
    unclear = [r for r in paired if r not in significant]
    ranked = significant + [r for r in unclear if r.get("verdict") != "no clear difference"]
    ranked += [r for r in unclear if r not in ranked]
    shown = ranked if len(ranked) <= MAX_HEADLINES else [r for r in ranked[:MAX_HEADLINES] if r in significant]
    if not shown and len(ranked) > MAX_HEADLINES:  # nothing significant: the widest-apart comparisons
        shown = sorted(ranked, key=lambda r: -abs(float(r["success_diff"])))[:2]
    sentences = [sentence(r) for r in shown]
    rest = [r for r in ranked if r not in shown]
    if rest:
        counts: dict[str, int] = {}
        for r in rest:
            counts[r.get("verdict", "?")] = counts.get(r.get("verdict", "?"), 0) + 1
        sentences.append(
            f"{len(rest)} more comparison{'s' if len(rest) > 1 else ''} ("
            + ", ".join(f"{v} {k}" for k, v in counts.items())
            + ") in the paired table below."
        )
    widest = max((100 * (float(r["success_hi"]) - float(r["success_lo"])) for r in unclear), default=0.0)
    tasks = sorted({int(r["n_pairs"]) for r in unclear or paired})
    n = "–".join(str(t) for t in (tasks[0], tasks[-1])) if len(tasks) > 1 else str(tasks[0]) if tasks else "0"
    if not paired:
        caveat = ""
    elif not unclear:
        caveat = f"All {len(paired)} comparisons are significant (5% level, Holm-adjusted)."
    elif not significant:
        caveat = (
            f"No comparison is significant (5% level, Holm-adjusted across {len(paired)}). At {n} paired tasks per "
            f"comparison the 95% intervals span up to {widest:.1f} points: these numbers do not show that any "
            "conductor is better or worse than its baseline, nor that they are equal."
        )
    else:
        caveat = (
            f"{len(significant)} of {len(paired)} comparisons are significant (5% level, Holm-adjusted); the others "
            f"do not show a difference either way at {n} paired tasks (intervals up to {widest:.1f} points wide)."
        )
    return sentences, caveat


def _best(results: list[dict[str, str]]) -> list[str]:
    """Without paired comparisons: the highest success per family, with its interval."""
    out = []
    for fam in sorted({r["family"] for r in results}):
        r = max((r for r in results if r["family"] == fam), key=lambda r: float(r["success_rate"]))
        out.append(
            f"Highest success on {fam}: {r['conductor']}, {_pct(r['success_rate'])} "
            f"[{_pct(r['ci_low'])}, {_pct(r['ci_high'])}] over {r['episodes']} episodes."
        )
    return out


def _summary(run_dir: Path, plots: list[dict[str, str]]) -> dict[str, Any]:
    """The page's first section: what was run (from results.csv, paired.csv and config.json), the headline
    verdicts, what they do not show, and the main figure."""
    results, paired = _dicts(run_dir, "results"), _dicts(run_dir, "paired")
    if not all(set(VERDICT_COLUMNS) <= r.keys() for r in paired):  # another table's paired.csv: no sentences
        paired = []
    if not all({"family", "conductor", "episodes", "success_rate", "ci_low", "ci_high"} <= r.keys() for r in results):
        results = []
    rows = results or paired
    run: list[tuple[str, str]] = []
    for key, label in (("team", "teams"), ("family", "task families"), ("conductor", "conductors")):
        values = sorted({r[key] for r in rows if r.get(key)})
        if values:
            run.append((label, ", ".join(values)))
    tasks = sorted({r["n_pairs"] for r in paired} or {r["episodes"] for r in results if r.get("episodes")})
    if tasks:
        run.append(("tasks", (" / ".join(tasks)) + (" paired tasks per comparison" if paired else " per conductor")))
    config_path = run_dir / "config.json"
    config = json.loads(config_path.read_text(encoding="utf-8")) if config_path.is_file() else {}
    seeds = [f"{k} = {v}" for k, v in _seed_fields(config)]
    run.append(("seeds", ", ".join(seeds) if seeds else "not recorded in the run directory (no config.json seed)"))
    if paired:
        sentences, caveat = _verdicts(paired)
    else:
        sentences, caveat = _best(results), ("No paired comparison in this run." if results else "")
    by_name: dict[str, dict[str, str]] = {}
    for p in plots:  # the main figure by file name, the run directory's own before a folder's
        by_name.setdefault(Path(p["name"]).name, p)
    figure = next((by_name[n] for n in MAIN_FIGURES if n in by_name), plots[0] if plots else None)
    return {"run": run, "verdicts": sentences, "caveat": caveat, "figure": figure}


def _seed_fields(config: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """Every field of a run's ``config.json`` whose name holds "seed", nested ones by their dotted path
    (``phase1.run.seed``)."""
    if not isinstance(config, dict):
        return []
    out: list[tuple[str, Any]] = []
    for k, v in config.items():
        path = f"{prefix}{k}"
        if isinstance(v, dict):
            out += _seed_fields(v, path + ".")
        elif "seed" in str(k).lower():
            out.append((path, v))
    return out


SCREENSHOT = "report_first_screen.png"  # :func:`first_screen`'s picture of this page, never embedded in it
# a figure left out when its folder holds the one it duplicates: the success–tokens plane without the hull and oracle
# (cost.png) beside phase 1's cost–quality plane; the bars and plane of the perturbed runs beside robustness.png
SUPERSEDED_BY = {"cost.png": ("cost_quality.png", "robustness.png"), "success.png": ("robustness.png",)}


def _plots(run_dir: Path) -> list[dict[str, str]]:
    """The run's figures, named by their path in the run directory, each once (:data:`SUPERSEDED_BY`)."""
    pngs = sorted([*run_dir.glob("*.png"), *(p for d in SUBDIRS for p in (run_dir / d).glob("*.png"))])
    keep = [
        p
        for p in pngs
        if p.name != SCREENSHOT and not any((p.parent / s).is_file() for s in SUPERSEDED_BY.get(p.name, ()))
    ]
    return [
        {"name": p.relative_to(run_dir).as_posix(), "data": base64.b64encode(p.read_bytes()).decode("ascii")}
        for p in keep
    ]


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
    summary = _summary(run, plots)
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
        plots=[p for p in plots if p is not summary["figure"]],
        summary=summary,
        episodes=shown,
        facets=facets,
        n_episodes=len(shown),
        n_left_out=max(0, len(episodes) - len(shown)),
    )
    target = Path(out) if out is not None else run / "report.html"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(html, encoding="utf-8")
    return target


BROWSERS = ("chromium", "chromium-browser", "google-chrome")  # headless browsers tried, in order


def first_screen(report: str | Path, png: str | Path, size: tuple[int, int] = (1280, 900)) -> Path | None:
    """A screenshot of the report's first screen (``size``: 1280 × 900 px, what a laptop shows before scrolling)
    taken by a headless Chromium, to ``png``; None when no browser is installed (Debian: ``apt-get install
    chromium``)."""
    import shutil
    import subprocess
    import tempfile

    browser = next((b for b in BROWSERS if shutil.which(b)), None)
    if browser is None:
        return None
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run(
            [
                browser,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--hide-scrollbars",
                f"--user-data-dir={profile}",
                f"--window-size={size[0]},{size[1]}",
                f"--screenshot={Path(png).resolve()}",
                Path(report).resolve().as_uri(),
            ],
            capture_output=True,
            timeout=120,
            check=True,
        )
    return Path(png)


__all__ = ["BROWSERS", "HTMLReportConfig", "ReportError", "first_screen", "write_html_report"]
