"""The ``orchestra`` command line: record, evaluate, inspect trajectories, run the demo."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trajectories import Episode

EPILOG = "Every command takes --seed; runs repeat exactly on CPU. Docs: README.md."


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seed", type=int, default=0, help="run seed (tasks and per-episode seeds derive from it)")
    p.add_argument(
        "--num-envs", type=int, default=8, help="envs stepped at once; worker requests are batched across them"
    )
    p.add_argument("--no-cache", action="store_true", help="do not use the response cache for temperature-0 calls")
    p.add_argument("--cache", default=None, help="response cache file (default: $ORCHESTRA_CACHE_DIR/responses.sqlite)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="orchestra",
        description="Learn how to run a team of LLM agents: record orchestration trajectories, compare conductors.",
        epilog=EPILOG,
    )
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("record", help="record trajectories of a team under a conductor", epilog=EPILOG)
    p.add_argument("--team", required=True, help="built-in team name (see `orchestra teams`) or a team YAML file")
    p.add_argument(
        "--conductor",
        required=True,
        help="round_robin | random | pipeline | heuristic | human | llm | LABEL:CHECKPOINT; "
        "several, comma-separated, each run on the same tasks (mixed-source data)",
    )
    p.add_argument(
        "--epsilon",
        type=float,
        default=0.0,
        help="ε-random exploration: share of decisions replaced by a random legal action (recorded as NAME+epsE)",
    )
    p.add_argument(
        "--family", default=None, help="task family (default: the team's) or a .jsonl file of question/answer"
    )
    p.add_argument("--split", default="train", choices=["train", "test"], help="task split")
    p.add_argument("--episodes", type=int, default=20, help="number of episodes")
    p.add_argument("--difficulty", type=int, default=None, help="one difficulty level (default: mixed)")
    p.add_argument("--out", required=True, help="X.jsonl (run files go to X_run/) or a directory")
    p.add_argument("--resume", action="store_true", help="continue a killed recording: no duplicates, no gaps")
    _common(p)

    p = sub.add_parser("evaluate", help="compare conductors on the same held-out tasks", epilog=EPILOG)
    p.add_argument("--team", action="append", required=True, help="team (repeat: one per task family)")
    p.add_argument(
        "--conductor",
        action="append",
        required=True,
        help="conductor NAME or LABEL:CHECKPOINT of a learned one (repeat; all run on the same tasks and seeds)",
    )
    p.add_argument("--episodes", type=int, default=20, help="held-out tasks per family")
    p.add_argument("--split", default="test", choices=["train", "test"], help="split to evaluate on")
    p.add_argument(
        "--out",
        required=True,
        help="run directory (results.csv, results.md, success.png, episodes/); an existing one is continued (its recorded episodes are reused)",
    )
    _common(p)

    p = sub.add_parser("trajectories", help="inspect and export trajectory files", epilog=EPILOG)
    tsub = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    q = tsub.add_parser("stats", help="validate files and summarise them (damaged lines are reported)")
    q.add_argument("paths", nargs="+", help="JSONL files or directories")
    q.add_argument("--json", action="store_true", help="print the summary as JSON")
    q = tsub.add_parser("show", help="print one episode as a readable transcript")
    q.add_argument("path")
    q.add_argument("--episode", default=None, help="episode id (default: the first)")
    q.add_argument("--index", type=int, default=None, help="episode index in the file")
    q = tsub.add_parser("export", help="export to Parquet")
    q.add_argument("path")
    q.add_argument("--to", required=True, help="output .parquet file")
    q.add_argument("--table", default="steps", choices=["steps", "episodes"], help="one row per step or per episode")

    sub.add_parser("teams", help="list the built-in teams")
    sub.add_parser("families", help="list the task families")

    p = sub.add_parser(
        "demo",
        help="both phases at demo scale: record, train BC and CQL, evaluate against rule-based conductors (phase 1); "
        "TeamTR vs baselines on telephone chains and a Stage-0 swap (phase 2)",
        epilog=EPILOG,
    )
    p.add_argument("--out", default="runs/demo", help="run directory (phase 2 writes under OUT/phase2)")
    p.add_argument(
        "--phases", type=int, nargs="+", choices=[1, 2], default=[1, 2], help="which phases to run (default 1 2)"
    )
    p.add_argument("--episodes", type=int, default=None, help="held-out episodes per family and conductor")
    p.add_argument("--train-episodes", type=int, default=None, help="recorded training episodes per conductor")
    _common(p)

    p = sub.add_parser("bench", help="benchmarks (phase 2: TeamTR on the telephone chain)", epilog=EPILOG)
    bsub = p.add_subparsers(dest="bench", required=True, metavar="BENCH")
    q = bsub.add_parser(
        "teamtr",
        help="TeamTR vs naive / joint / HAPPO on the telephone chain: final J, regressions, drift exponents α",
        epilog=EPILOG,
    )
    q.add_argument(
        "--out", default="runs/bench_teamtr", help="output directory (an existing one of the same config is resumed)"
    )
    q.add_argument("--ns", type=int, nargs="+", default=None, help="chain lengths n (default 2 3 4 6 8)")
    q.add_argument(
        "--schemes",
        nargs="+",
        default=None,
        choices=["teamtr", "naive", "joint", "joint_indep", "happo"],
        help="schemes (default teamtr naive joint happo)",
    )
    q.add_argument("--seeds", type=int, default=None, help="seeds per (n, scheme) (default 8)")
    q.add_argument("--stages", type=int, default=None, help="stages of the equal-stages accounting (default 20)")
    q.add_argument("--batch-size", type=int, default=None, help="episodes per sampled batch (default 128)")
    q.add_argument("--delta", type=float, default=None, help="per-agent trust-region KL budget δ (default 0.03)")
    q.add_argument("--lr", type=float, default=None, help="Adam learning rate (default 0.03)")
    q.add_argument(
        "--warm-pass",
        type=float,
        default=None,
        help="warm-start per-hop pass probability (default 0.85, the reliable-agent regime; 0.55: the study's "
        "non-saturating regime for team success)",
    )
    q.add_argument(
        "--advantage",
        choices=["grpo", "batch_mean"],
        default=None,
        help="grpo: normalise per key group (default); batch_mean: R − mean(R) over the batch",
    )
    q.add_argument("--no-adv-scale", action="store_true", help="advantages mean-centred only (no division by std)")
    q.add_argument(
        "--no-equal-episodes", action="store_true", help="skip the equal-episodes accounting (runs n× shorter)"
    )
    q.add_argument("--smoke", action="store_true", help="tiny preset (n 2 3, teamtr naive, 1 seed, 2 stages)")
    q.add_argument("--seed", type=int, default=0, help="root seed (runs repeat exactly on CPU)")
    q.add_argument("--quiet", action="store_true", help="no progress output")
    from orchestra.cli_align import add_parsers as add_align
    from orchestra.cli_conductor import add_parsers
    from orchestra.cli_finetune import add_parsers as add_finetune

    COMMANDS.update(add_parsers(sub, _common, EPILOG))
    COMMANDS.update(add_finetune(sub, _common, EPILOG))  # phase 2: orchestra finetune
    COMMANDS.update(add_align(sub, _common, EPILOG))  # phase 2: orchestra align (Stage-0)
    return ap


def _run_options(a: argparse.Namespace) -> dict[str, Any]:
    """The options every job shares (``_common``'s flags)."""
    return {
        "seed": a.seed,
        "num_envs": a.num_envs,
        "use_cache": not a.no_cache,
        "cache_path": a.cache,
        "progress": not a.quiet,
    }


def _cmd_record(a: argparse.Namespace) -> int:
    from orchestra.runs import RecordConfig, record

    cfg = RecordConfig(
        team=a.team,
        conductor=a.conductor,
        episodes=a.episodes,
        split=a.split,
        family=a.family,
        difficulty=a.difficulty,
        epsilon=a.epsilon,
        **_run_options(a),
    )
    res = record(cfg, a.out, resume=a.resume)
    m = res.metrics
    print(
        f"recorded {len(res.episodes)} episodes ({res.skipped} already there) → {res.trajectories}\n"
        f"run dir: {res.run_dir}\n"
        f"success {100 * m.get('rollout/success_rate', 0):.1f}%  return {m.get('rollout/mean_return', 0):.3f}  "
        f"turns {m.get('rollout/mean_turns', 0):.2f}  tokens {m.get('rollout/mean_tokens', 0):.1f}  "
        f"({m.get('perf/episodes_per_s', 0):.2f} ep/s, {m.get('perf/tokens_per_s', 0):.0f} tok/s generated)"
    )
    return 0


def _cmd_evaluate(a: argparse.Namespace) -> int:
    from orchestra.runs import EvaluateConfig, evaluate, format_table

    cfg = EvaluateConfig(
        teams=a.team,
        conductors=a.conductor,
        episodes=a.episodes,
        split=a.split,
        **_run_options(a),
    )
    rows, paths = evaluate(cfg, a.out)
    print(format_table(rows))
    print("\n" + "  ".join(f"{k}: {v}" for k, v in paths.items()))
    return 0


def _cmd_trajectories(a: argparse.Namespace) -> int:
    from trajectories import read_many, read_trajectories, summarize, to_parquet

    if a.action == "stats":
        report = read_many([Path(p) for p in a.paths])
        for pr in report.problems:
            print(f"warning: {pr}", file=sys.stderr)
        s = summarize(report.episodes)
        if a.json:
            print(json.dumps(s, indent=2, default=str))
        else:
            print(_format_stats(s))
        return 1 if report.problems else 0
    if a.action == "show":
        report = read_trajectories(Path(a.path))
        for pr in report.problems:
            print(f"warning: {pr}", file=sys.stderr)
        eps = report.episodes
        if not eps:
            print(f"{a.path}: no valid episodes", file=sys.stderr)
            return 1
        if a.episode is not None:
            match = [e for e in eps if e.episode_id == a.episode]
            if not match:
                print(
                    f"{a.path}: no episode {a.episode!r} (first ids: {[e.episode_id for e in eps[:5]]})",
                    file=sys.stderr,
                )
                return 1
            ep = match[0]
        else:
            ep = eps[a.index or 0]
        print(_format_episode(ep))
        return 0
    if a.action == "export":
        n = to_parquet(Path(a.path), Path(a.to), table=a.table)
        print(f"wrote {a.to} ({n} rows)" if isinstance(n, int) else f"wrote {a.to}")
        return 0
    return 2


def _format_stats(s: dict[str, Any]) -> str:
    lines = [f"{k}: {v}" for k, v in s.items() if not isinstance(v, dict)]
    for k, v in s.items():
        if isinstance(v, dict):
            lines.append(f"{k}:")
            for kk, vv in v.items():
                lines.append(f"  {kk}: {vv}")
    return "\n".join(lines)


def _format_episode(ep: Episode) -> str:
    lines = [
        f"episode {ep.episode_id}  conductor={ep.conductor.name}  task={ep.task.id} ({ep.task.family}, {ep.task.split})",
        f"success={ep.success} score={ep.score} return={ep.return_:.3f} terminated={ep.terminated} truncated={ep.truncated}",
        "",
        ep.steps[0].state["task"]["prompt"] if ep.steps else "",
        "",
    ]
    for st in ep.steps:
        label = "submit" if st.action.kind == "submit" else f"{st.action.worker}:{st.action.instruction}"
        lines.append(f"[t={st.t}] conductor → {label}   reward {st.reward.scalar:+.3f} {st.reward.named}")
        if st.message is not None:
            tag = f" [{st.message.verdict}]" if st.message.verdict else ""
            lines.append(
                f"    {st.message.worker}{tag} ({st.message.completion_tokens} tok): {st.message.text.strip()}"
            )
    lines.append(f"\nverdict: {ep.metadata.get('verdict_reason', '')}")
    return "\n".join(lines)


def _cmd_teams(a: argparse.Namespace) -> int:
    from orchestra.team import builtin_teams, load_team

    for name in builtin_teams():
        t = load_team(name)
        workers = ", ".join(f"{w.name}({w.kind})" for w in t.env.workers)
        print(f"{name:16s} family={t.family:15s} workers: {workers}  max_turns={t.env.max_turns}")
    return 0


def _cmd_families(a: argparse.Namespace) -> int:
    from envs.tasks.registry import FAMILIES, get_family

    for name in FAMILIES:
        if name == "jsonl":
            print(f"{name:16s} your own question/answer data: --family data.jsonl")
            continue
        fam = get_family(name)
        print(f"{name:16s} difficulties={list(fam.difficulties)} tools={sorted(fam.tools())}")
    return 0


def _cmd_demo(a: argparse.Namespace) -> int:
    from orchestra.cli_conductor import phase1_from_args
    from orchestra.phase1 import demo_config, run_phase1

    if 1 in a.phases:
        cfg = phase1_from_args(demo_config(seed=a.seed), a)
        run_phase1(cfg, Path(a.out), command=f"orchestra demo --seed {a.seed}")
    if 2 in a.phases:
        return _demo_phase2(Path(a.out) / "phase2", a.seed, a.quiet)
    return 0


def _demo_phase2(out: Path, seed: int, quiet: bool) -> int:
    """Phase 2 at demo scale (about a minute): TeamTR vs naive / joint / HAPPO on short telephone chains, then a
    Stage-0 swap of one trained chain agent. Both parts resume: finished runs are kept."""
    import torch

    from orchestra.teamtr.bench import BenchConfig, run_bench

    torch.set_num_threads(1)  # tiny models are dispatch-bound
    summary = run_bench(BenchConfig.demo(seed=seed), out / "bench", progress=not quiet)
    text = summary.read_text(encoding="utf-8")
    print("\n# Phase 2 (demo scale): TeamTR on the telephone chain\n")
    print(text[text.index("## Final exact J") : text.index("Paired J_scheme")].strip())
    print("\n" + text[text.index("## Acceptance criteria") :].split("\n\nFiles:")[0])
    print(f"\nfull tables and plots: {summary.parent}")
    align_out = out / "align"
    if (align_out / "report.md").exists():
        print("\n" + (align_out / "report.md").read_text(encoding="utf-8"))
        return 0
    print("\n# Phase 2 (demo scale): Stage-0 swap of agent 1 of a 4-agent chain\n")
    return main(["align", "chain", "--out", str(align_out), "--seed", str(seed), *(["--quiet"] if quiet else [])])


def _cmd_bench(a: argparse.Namespace) -> int:
    import dataclasses

    import torch

    from orchestra.teamtr.bench import BenchConfig, run_bench

    cfg = BenchConfig.smoke() if a.smoke else BenchConfig()
    overrides = {
        "ns": tuple(a.ns) if a.ns else None,
        "schemes": tuple(a.schemes) if a.schemes else None,
        "seeds": a.seeds,
        "num_stages": a.stages,
        "batch_size": a.batch_size,
        "delta": a.delta,
        "lr": a.lr,
        "warm_pass": a.warm_pass,
        "advantage": a.advantage,
        "adv_scale": False if a.no_adv_scale else None,
        "extend_for_episodes": False if a.no_equal_episodes else None,
    }
    cfg = dataclasses.replace(cfg, seed=a.seed, **{k: v for k, v in overrides.items() if v is not None})
    torch.set_num_threads(1)  # tiny models are dispatch-bound
    print(f"summary: {run_bench(cfg, a.out, progress=not a.quiet)}")
    return 0


COMMANDS: dict[str, Any] = {
    "record": _cmd_record,
    "evaluate": _cmd_evaluate,
    "trajectories": _cmd_trajectories,
    "teams": _cmd_teams,
    "families": _cmd_families,
    "demo": _cmd_demo,
    "bench": _cmd_bench,
}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from envs.tasks.base import Task  # noqa: F401  (fail early with a clear message if the install is broken)
    from envs.team_env import IllegalActionError
    from orchestra.backends.base import BackendError
    from orchestra.team import TeamFileError
    from policies.base import PolicyError
    from policies.dataset import DatasetError
    from trajectories import SchemaError, TrajectoryFileError

    try:
        return COMMANDS[args.command](args)
    except (
        TeamFileError,
        PolicyError,
        DatasetError,
        IllegalActionError,
        BackendError,
        TrajectoryFileError,
        SchemaError,
        FileExistsError,
        FileNotFoundError,
    ) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted; recorded episodes are safe (rerun with --resume to continue)", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
