"""``orchestra report``: the HTML run report, loaded in a real headless browser (Debian's chromium). The test reads
the DOM after the page's own JavaScript ran (``--dump-dom``): the episodes' steps are there, and a filter (preset in
the URL fragment, applied by the same code the filter menus call) hides exactly the episodes it should. A screenshot
is saved in the run directory. Without chromium the browser test is skipped, with that reason."""

from __future__ import annotations

import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from orchestra.cli import main
from orchestra.report.evaluation import evaluation_report
from orchestra.report.html import ReportError, write_html_report
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


def _dom(url: str, tmp: Path) -> str:
    assert CHROMIUM is not None
    cmd = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        f"--user-data-dir={tmp / 'profile'}",
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
