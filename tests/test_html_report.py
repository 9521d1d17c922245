"""``orchestra report``: the HTML run report, loaded in a real headless browser (Debian's chromium). The test reads
the DOM after the page's own JavaScript ran (``--dump-dom``): the episodes' steps are there, and a filter (preset in
the URL fragment, applied by the same code the filter menus call) hides exactly the episodes it should. A screenshot
is saved in the run directory. A second browser test measures the page at 1280 × 900 px (a script added to a copy of
the page writes the measurements into the DOM before it is dumped): the first viewport holds the "What this run
found" section and its figure, and no table is wider than its container (every fold opened); the first screen is
kept as ``report_first_screen.png``. Without chromium the browser tests are skipped, with that reason."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from orchestra.cli import main
from orchestra.report.evaluation import evaluation_report
from orchestra.report.html import ReportError, _plots, _seed_fields, _table, _verdicts, first_screen, write_html_report
from tests.scripted import arithmetic_team, record_scripted
from trajectories import TrajectoryWriter

CHROMIUM = next((c for c in ("chromium", "chromium-browser", "google-chrome") if shutil.which(c)), None)


class _Episodes(HTMLParser):
    """The viewer's episode sections (their data attributes and whether hidden) and the steps inside each."""

    def __init__(self) -> None:
        super().__init__()
        self.episodes: list[dict[str, object]] = []
        self._in_list = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "div" and a.get("id") == "episodes":
            self._in_list = True
        elif tag == "div" and a.get("id") == "compare":
            self._in_list = False
        if not self._in_list:
            return
        cls = (a.get("class") or "").split()
        if tag == "section" and "episode" in cls:
            self.episodes.append(
                {
                    "conductor": a.get("data-conductor"),
                    "outcome": a.get("data-outcome"),
                    "hidden": "hidden" in a,
                    "steps": 0,
                }
            )
        elif tag == "div" and "step" in cls and self.episodes:
            self.episodes[-1]["steps"] = int(self.episodes[-1]["steps"]) + 1  # type: ignore[call-overload]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("run")
    team = arithmetic_team()
    eps = []
    for conductor in ("heuristic", "round_robin"):
        mine = record_scripted(team, conductor, 6, split="test")
        with TrajectoryWriter(out / "episodes" / f"arithmetic-{conductor}.jsonl") as w:
            for e in mine:
                w.write(e)
        eps += mine
    evaluation_report(eps, out)
    return out


def _dom(url: str, tmp: Path, *extra: str) -> str:
    assert CHROMIUM is not None
    cmd = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        f"--user-data-dir={tmp / 'profile'}",
        *extra,
        "--dump-dom",
        url,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True).stdout


def test_report_is_self_contained(run_dir: Path) -> None:
    html = write_html_report(run_dir).read_text(encoding="utf-8")
    assert "<table" in html and "data:image/png;base64," in html  # tables and embedded plots
    for remote in ("http://", "https://", "<link ", 'src="http'):
        assert remote not in html  # nothing fetched from anywhere
    with pytest.raises(ReportError, match="no such run directory"):
        write_html_report(run_dir / "missing")


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium on this machine (.ci/run installs Debian's chromium)")
def test_report_renders_in_a_browser_and_filters(run_dir: Path, tmp_path: Path) -> None:
    report = write_html_report(run_dir)
    everything = _Episodes()
    everything.feed(_dom(report.as_uri(), tmp_path))
    assert len(everything.episodes) == 12 and not any(e["hidden"] for e in everything.episodes)
    assert all(int(e["steps"]) >= 2 for e in everything.episodes)  # every decision of every episode is on the page
    only = _Episodes()
    only.feed(_dom(report.as_uri() + "#conductor=heuristic", tmp_path))
    shown = [e for e in only.episodes if not e["hidden"]]
    assert len(shown) == 6 and {e["conductor"] for e in shown} == {"heuristic"}
    assert all(e["hidden"] for e in only.episodes if e["conductor"] == "round_robin")
    failures = _Episodes()
    failures.feed(_dom(report.as_uri() + "#outcome=failure", tmp_path))
    assert all(e["hidden"] == (e["outcome"] != "failure") for e in failures.episodes)
    shot = run_dir / "report.png"
    subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            f"--user-data-dir={tmp_path / 'p2'}",
            "--window-size=1300,1800",
            f"--screenshot={shot}",
            report.as_uri(),
        ],
        capture_output=True,
        timeout=120,
        check=True,
    )
    assert shot.stat().st_size > 10_000


def test_cli_report(run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "r.html"
    assert main(["report", str(run_dir), "--out", str(target), "--max-episodes", "3"]) == 0
    assert str(target) in capsys.readouterr().out
    assert "9 more not embedded" in target.read_text(encoding="utf-8")
    assert main(["report", str(tmp_path / "nothing")]) != 0
    assert "no such run directory" in capsys.readouterr().err


MEASURE = """<script>
window.addEventListener("load", function () {
  document.querySelectorAll("details").forEach(function (d) { d.open = true; });
  var box = function (el) { var r = el.getBoundingClientRect(); return {top: r.top, bottom: r.bottom, height: r.height}; };
  var img = document.getElementById("main-figure"), head = document.getElementById("summary");
  var firstTable = document.querySelector("table.data");
  var out = {
    viewport: [window.innerWidth, window.innerHeight],
    page_scroll: document.documentElement.scrollWidth,
    summary: box(head),
    figure: img ? Object.assign(box(img), {natural: img.naturalWidth}) : null,
    summary_first: !!(firstTable && (head.compareDocumentPosition(firstTable) & Node.DOCUMENT_POSITION_FOLLOWING)),
    tables: Array.prototype.map.call(document.querySelectorAll("table.data"), function (t) {
      return {scroll: t.scrollWidth, client: t.clientWidth, box_scroll: t.parentElement.scrollWidth,
              box_client: t.parentElement.clientWidth};
    })
  };
  var pre = document.createElement("pre"); pre.id = "measure"; pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>"""


def _png_size(path: Path) -> tuple[int, int]:
    w, h = struct.unpack(">II", path.read_bytes()[16:24])
    return w, h


def test_report_leads_with_what_the_run_found(run_dir: Path) -> None:
    html = write_html_report(run_dir).read_text(encoding="utf-8")
    head, tables = html.index('id="summary"'), html.index('<table class="data"')
    assert head < tables  # the headline comes before every table
    summary = html[head:tables]
    assert "heuristic, round_robin" in summary and "6 paired tasks" in summary  # what was run
    assert "round_robin against heuristic on arithmetic" in summary and "[−91.1, +16.1]" in summary
    assert "No comparison is significant" in summary and 'id="main-figure"' in summary  # the caveat, the figure
    assert html.count('alt="cost.png"') == 1  # the main figure is not repeated in the plots
    results = html[html.index('id="table-results"') :]
    results = results[: results.index("</details>")]
    assert "<td>100.0%</td>" in results and "<td>[61.0%, 100.0%]</td>" in results  # percentages and intervals
    assert "<td>yes</td>" in results and "True" not in results and "0.6096" not in results  # yes/no, no raw floats
    main_header = results[: results.index("<details>")]
    assert "rule-based" not in main_header and "rule-based" in results  # a secondary column, folded away


def test_verdicts_say_what_is_significant() -> None:
    row = {"conductor": "learned", "baseline": "heuristic", "family": "math", "n_pairs": "40", "success": "0.8",
           "baseline_success": "0.5", "success_diff": "0.3", "success_lo": "0.12", "success_hi": "0.45",
           "mcnemar_p_holm": "0.001", "verdict": "better"}  # fmt: skip
    other = {**row, "family": "code", "success_diff": "0.05", "success_lo": "-0.1", "success_hi": "0.2",
             "mcnemar_p_holm": "0.6", "verdict": "no clear difference"}  # fmt: skip
    sentences, caveat = _verdicts([row, other])
    assert sentences[0].startswith("learned against heuristic on math (40 paired tasks): success 80.0% vs 50.0%")
    assert "+30.0 points [+12.0, +45.0]" in sentences[0] and sentences[0].endswith("better.")
    assert caveat.startswith("1 of 2 comparisons are significant") and "30.0 points wide" in caveat
    assert _verdicts([other])[1].startswith("No comparison is significant")
    # many comparisons: the first screen keeps the significant ones and counts the rest in one line
    many = [row, {**row, "verdict": "beats"}] + [{**other, "conductor": f"c{k}"} for k in range(16)]
    sentences, caveat = _verdicts(many)
    assert len(sentences) == 3 and sentences[1].endswith("beats.")
    assert sentences[2] == "16 more comparisons (16 no clear difference) in the paired table below."
    assert caveat.startswith("2 of 18 comparisons are significant")
    none = [{**other, "conductor": f"c{k}", "success_diff": str(k / 100)} for k in range(8)]
    sentences, _ = _verdicts(none)  # nothing significant: the two largest differences, then the count
    assert sentences[0].startswith("c7 against") and sentences[1].startswith("c6 against") and len(sentences) == 3


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium on this machine (.ci/run installs Debian's chromium)")
def test_first_screen_at_1280_holds_the_headline_and_no_table_overflows(run_dir: Path, tmp_path: Path) -> None:
    assert CHROMIUM is not None
    report = write_html_report(run_dir)
    probe = tmp_path / "probe.html"
    probe.write_text(report.read_text(encoding="utf-8").replace("</body>", MEASURE + "</body>"), encoding="utf-8")
    dom = _dom(probe.as_uri(), tmp_path, "--window-size=1280,900", "--virtual-time-budget=3000")
    m = json.loads(dom[dom.index('<pre id="measure">') + 18 : dom.index("</pre>", dom.index('id="measure"'))])
    assert m["viewport"][0] == 1280 and m["summary_first"]  # (headless may report less height: 900 px is the fold)
    assert m["summary"]["top"] < 200 and m["summary"]["bottom"] <= 900  # the headline section, whole, on screen
    fig = m["figure"]
    assert fig is not None and fig["natural"] > 0 and fig["height"] > 250 and fig["bottom"] <= 900
    assert len(m["tables"]) >= 6  # main tables and their opened folds
    for t in m["tables"]:
        assert t["scroll"] <= t["client"] and t["box_scroll"] <= t["box_client"], t
    assert m["page_scroll"] <= 1280  # no horizontal scroll bar
    shot = first_screen(report, run_dir / "report_first_screen.png")  # kept in the run directory
    assert shot is not None
    assert shot.stat().st_size > 10_000 and _png_size(shot) == (1280, 900)


def test_each_figure_is_embedded_once(tmp_path: Path) -> None:
    for name in ("report_first_screen.png", "report/cost.png", "report/cost_quality.png", "report/success.png",
                 "robustness/cost.png", "robustness/success.png", "robustness/robustness.png", "curves.png"):  # fmt: skip
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_bytes(b"png")
    names = [p["name"] for p in _plots(tmp_path)]
    assert names == ["curves.png", "report/cost_quality.png", "report/success.png", "robustness/robustness.png"]


def test_seeds_are_read_from_nested_config_fields() -> None:
    config = {"phase1": {"seeds": [0, 1], "run": {"seed": 3}, "lr": 0.1}, "seed": 7, "name": "demo"}
    assert _seed_fields(config) == [("phase1.seeds", [0, 1]), ("phase1.run.seed", 3), ("seed", 7)]
    assert _seed_fields([1, 2]) == []


def test_robustness_table_reads_as_percentages_and_points() -> None:
    header = ["team", "conductor", "perturbation", "tasks", "clean_success", "perturbed_success", "diff", "diff_lo",
              "diff_hi", "wins", "losses", "p_mcnemar", "p_holm"]  # fmt: skip
    row = ["arithmetic", "heuristic", "drop=0.3", "10", "0.9", "0.6", "-0.3", "-0.55", "-0.05", "0", "3", "0.2", "0.4"]
    t = _table("robustness", "r", header, [row])
    assert t.header[:4] == ["team", "conductor", "perturbation", "tasks"]
    assert t.rows[0][4:] == ["90.0%", "60.0%", "[−55.0, −5.0]", "0.4"]  # the interval of the difference, in points
    folded = [h for header, _ in t.details for h in header]
    assert "Δ success (points)" in folded and "wins" in folded and "team" in folded  # keys repeated in the fold
