"""``orchestra record | evaluate | trajectories | teams | families``: recording, evaluation and inspection."""

from __future__ import annotations

import argparse
import json
import sys

from orchestra.cli.options import Command, Opt, add_options, build


def run_options(prefix: str = "run") -> list[str | Opt]:
    """The flags of a :class:`~orchestra.runtime.session.RunOptions` at ``prefix`` (seed, envs, cache, progress)."""
    return [
        Opt(f"{prefix}.seed"),
        Opt(f"{prefix}.num_envs"),
        Opt(f"{prefix}.use_cache", "--no-cache", help="do not use the response cache"),
        Opt(f"{prefix}.cache_path", "--cache"),
        Opt(f"{prefix}.progress", "--quiet", help="no progress bar"),
        Opt(f"{prefix}.serial", "--serial"),
        Opt(f"{prefix}.episode_retries", "--episode-retries"),
        Opt(f"{prefix}.ray", "--ray"),
        Opt(f"{prefix}.ray_address", "--ray-address", metavar="ADDR"),
        Opt(f"{prefix}.ray_actors", "--ray-actors"),
        Opt(f"{prefix}.ray_actor_cpus", "--ray-actor-cpus"),
    ]


def _record(p: argparse.ArgumentParser, epilog: str) -> None:
    from orchestra.jobs.record import RecordConfig

    opts: list[str | Opt] = ["team", Opt("conductor", help=_CONDUCTOR_HELP), "epsilon", "family", "split", "episodes"]
    add_options(
        p, RecordConfig, [*opts, "difficulty", Opt("perturb", action="append", metavar="KIND=STRENGTH"), *run_options()]
    )
    p.add_argument("--out", required=True, help="X.jsonl (run files go to X_run/) or a directory")
    p.add_argument("--resume", action="store_true", help="continue a killed recording: no duplicates, no gaps")


def _evaluate(p: argparse.ArgumentParser, epilog: str) -> None:
    from orchestra.jobs.evaluate import EvaluateConfig

    add_options(
        p,
        EvaluateConfig,
        [
            Opt("teams", "--team", action="append", help="team (repeat: one per task family)"),
            Opt("conductors", "--conductor", action="append"),
            "episodes",
            "split",
            Opt("perturb", action="append", metavar="KIND=STRENGTH"),
            *run_options(),
        ],
    )
    p.add_argument(
        "--out",
        required=True,
        help="run directory (results.csv, results.md, success.png, episodes/); an existing one is continued (its "
        "recorded episodes are reused)",
    )


def _trajectories(p: argparse.ArgumentParser, epilog: str) -> None:
    from orchestra.jobs.inspect import ExportConfig

    tsub = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    q = tsub.add_parser("stats", help="validate files and summarise them (damaged lines are reported)")
    q.add_argument("paths", nargs="+", help="JSONL files or directories")
    q.add_argument("--json", action="store_true", help="print the summary as JSON")
    q = tsub.add_parser("show", help="print one episode as a readable transcript")
    q.add_argument("path")
    q.add_argument("--episode", default=None, help="episode id (default: the first)")
    q.add_argument("--index", type=int, default=None, help="episode index in the file (default: the first)")
    q = tsub.add_parser("export", help="export to Parquet")
    add_options(q, ExportConfig, [Opt("path", positional=True), "to", "table"])


def _cache(p: argparse.ArgumentParser, epilog: str) -> None:
    csub = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    where = "response cache file (default: $ORCHESTRA_CACHE_DIR/responses.sqlite)"
    q = csub.add_parser("stats", help="how many replies the cache holds, per model")
    q.add_argument("--cache", default=None, help=where)
    q = csub.add_parser("export", help="write the cached replies to an xz-compressed JSONL shard")
    q.add_argument("--out", required=True, help="shard file, *.jsonl.xz")
    q.add_argument(
        "--exclude", nargs="*", default=None, help="shards whose replies are left out (ship only what is new)"
    )
    q.add_argument("--cache", default=None, help=where)
    q = csub.add_parser("import", help="add the replies of shards to the cache (a fresh clone then replays them)")
    q.add_argument("shards", nargs="+", help="*.jsonl.xz shards (e.g. docs/results/responses/*.jsonl.xz)")
    q.add_argument("--cache", default=None, help=where)


def _report(p: argparse.ArgumentParser, epilog: str) -> None:
    from orchestra.report.html import HTMLReportConfig

    add_options(p, HTMLReportConfig, [Opt("run_dir", positional=True), "out", "max_episodes"])


def _nothing(p: argparse.ArgumentParser, epilog: str) -> None:
    """A command without options."""


_CONDUCTOR_HELP = (
    "round_robin | random | pipeline | heuristic | human | llm | llm_instruct | LABEL:CHECKPOINT; several, "
    "comma-separated, each run on the same tasks (mixed-source data)"
)


def _cmd_record(a: argparse.Namespace) -> int:
    from orchestra.jobs.record import RecordConfig, record, run_paths
    from policies import QuitSession
    from trajectories import read_trajectories

    cfg = build(RecordConfig, a)
    try:
        res = record(cfg, a.out, resume=a.resume)
    except QuitSession:
        path = run_paths(a.out)[0]
        kept = len(read_trajectories(path).episodes) if path.exists() else 0
        print(
            f"\nsession stopped: {kept} completed episode(s) kept in {path}; the same command with --resume "
            "continues with the next task"
        )
        return 0
    m = res.metrics
    print(
        f"recorded {len(res.episodes)} episodes ({res.skipped} already there) → {res.trajectories}\n"
        f"run dir: {res.run_dir}\n"
        f"success {100 * m.get('rollout/success_rate', 0):.1f}%  return {m.get('rollout/mean_return', 0):.3f}  "
        f"turns {m.get('rollout/mean_turns', 0):.2f}  tokens {m.get('rollout/mean_tokens', 0):.1f}  "
        f"({m.get('perf/episodes_per_s', 0):.2f} ep/s, {m.get('perf/tokens_per_s', 0):.0f} tok/s generated)"
    )
    if "conductor/decisions" in m:
        print(llm_replies_line(m))
    if m.get("faults/turn_faults"):
        causes = ", ".join(f"{k.rsplit('/', 1)[1]} {int(v)}" for k, v in m.items() if k.startswith("faults/errors/"))
        print(
            f"faults: {int(m['faults/errored_episodes'])} episodes ended by a backend fault ({causes or 'none'}), "
            f"{int(m['faults/turn_faults'])} failed worker turns, {int(m['faults/episode_retries'])} episodes replayed"
        )
    return 0


def llm_replies_line(m: dict[str, float]) -> str:
    """An LLM conductor's reply counts in one line."""
    return (
        f"{int(m['conductor/decisions'])} decisions, {int(m['conductor/unparsed_replies'])} replies no move could be "
        f"read from (the first legal action was taken), {int(m['conductor/own_instructions'])} instructions in its "
        "own words"
    )


def _cmd_evaluate(a: argparse.Namespace) -> int:
    from orchestra.jobs.evaluate import EvaluateConfig, evaluate
    from orchestra.report.evaluation import format_table

    ev = evaluate(build(EvaluateConfig, a), a.out)
    rows, paths, replies = ev.rows, ev.paths, ev.replies
    print(format_table(rows))
    if "robustness_md" in paths:
        print("\n" + paths["robustness_md"].read_text(encoding="utf-8").split("\n\n", 2)[-1].rstrip())
    for name, m in replies.items():
        print(f"{name}: {llm_replies_line(m)}")
    print("\n" + "  ".join(f"{k}: {v}" for k, v in paths.items()))
    return 0


def _cmd_report(a: argparse.Namespace) -> int:
    from orchestra.report.html import HTMLReportConfig, write_html_report

    cfg = build(HTMLReportConfig, a)
    path = write_html_report(cfg.run_dir, cfg.out, cfg.max_episodes)
    print(f"report: {path} (open it in a browser; it needs no network)")
    return 0


def _cmd_trajectories(a: argparse.Namespace) -> int:
    from orchestra.jobs.inspect import ExportConfig, export, pick_episode, read_file, read_files
    from orchestra.report.summaries import format_episode, format_stats

    if a.action == "export":
        cfg = build(ExportConfig, a)
        n = export(cfg)
        print(f"wrote {cfg.to} ({n} rows)" if n is not None else f"wrote {cfg.to}")
        return 0
    report = read_files(a.paths) if a.action == "stats" else read_file(a.path)
    for pr in report.problems:
        print(f"warning: {pr}", file=sys.stderr)
    if a.action == "stats":
        from trajectories import summarize

        s = summarize(report.episodes)
        print(json.dumps(s, indent=2, default=str) if a.json else format_stats(s))
        return 1 if report.problems else 0
    try:
        ep = pick_episode(report, a.path, a.episode, a.index)
    except ValueError as e:
        print(e, file=sys.stderr)
        return 1
    print(format_episode(ep))
    return 0


def _cmd_cache(a: argparse.Namespace) -> int:
    from collections import Counter
    from pathlib import Path

    from orchestra.backends.cache import ResponseCache, export_responses, import_responses
    from orchestra.runtime.workers import default_cache_path

    cache = ResponseCache(Path(a.cache) if a.cache else default_cache_path())
    if a.action == "stats":
        per_model = Counter(model for _, model, _, _ in cache.rows())
        print(f"{cache.path}: {len(cache)} replies")
        for model, n in per_model.most_common():
            print(f"  {n:8d}  {model}")
    elif a.action == "export":
        n = export_responses(cache, a.out, a.exclude or [])
        print(f"wrote {n} replies of {len(cache)} to {a.out}")
    else:
        added, read = import_responses(cache, a.shards)
        print(f"imported {added} new replies ({read - added} already cached) into {cache.path}")
    return 0


def _cmd_teams(a: argparse.Namespace) -> int:
    from orchestra.jobs.inspect import team_lines

    print("\n".join(team_lines()))
    return 0


def _cmd_families(a: argparse.Namespace) -> int:
    from orchestra.jobs.inspect import family_lines

    print("\n".join(family_lines()))
    return 0


COMMANDS = {
    "record": Command("record trajectories of a team under a conductor", _record, _cmd_record),
    "evaluate": Command("compare conductors on the same held-out tasks", _evaluate, _cmd_evaluate),
    "trajectories": Command("inspect and export trajectory files", _trajectories, _cmd_trajectories),
    "cache": Command("the response cache: stats, export to / import from shards", _cache, _cmd_cache),
    "report": Command(
        "one self-contained HTML file of a run: tables, plots and a trajectory viewer", _report, _cmd_report
    ),
    "teams": Command("list the built-in teams", _nothing, _cmd_teams),
    "families": Command("list the task families", _nothing, _cmd_families),
}
