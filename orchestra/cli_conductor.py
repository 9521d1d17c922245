"""The conductor-learning commands of the ``orchestra`` CLI: dataset, train, ope, finetune-conductor,
distill, reproduce. (``orchestra.cli`` holds the parser root and the recording/evaluation commands.)"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

Handler = Callable[[argparse.Namespace], int]


def _seed(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seed", type=int, default=0, help="seed (runs repeat exactly on CPU)")
    p.add_argument("--quiet", action="store_true", help="no progress output")


def _weights(items: list[str] | None) -> dict[str, float]:
    out: dict[str, float] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        try:
            if not sep:
                raise ValueError
            out[key.strip()] = float(value)
        except ValueError:
            raise SystemExit(f"error: --weight {item!r}: expected COMPONENT=NUMBER, e.g. turn_cost=0.05") from None
    return out


def add_parsers(sub: Any, common: Callable[[argparse.ArgumentParser], None], epilog: str) -> dict[str, Handler]:
    """Add the phase-1 subcommands; returns their handlers by command name."""
    p = sub.add_parser("dataset", help="build or inspect an offline dataset of conductor decisions", epilog=epilog)
    dsub = p.add_subparsers(dest="dataset_command", required=True, metavar="SUBCOMMAND")
    q = dsub.add_parser("build", help="trajectory files → dataset (.npz), states re-encoded with the team's encoder")
    q.add_argument("--team", required=True, help="the team the trajectories were recorded with (built-in name or YAML)")
    q.add_argument("--input", nargs="+", required=True, help="trajectory JSONL files or directories")
    q.add_argument("--out", required=True, help="output .npz (a .summary.json is written beside it)")
    q.add_argument("--family", action="append", default=None, help="keep only this task family (repeat)")
    q.add_argument("--split", action="append", default=None, choices=["train", "test"], help="keep only this split")
    q.add_argument("--source", action="append", default=None, help="keep only this recorded conductor (repeat)")
    q.add_argument("--success-only", action="store_true", help="keep only solved episodes (for filtered BC)")
    q.add_argument("--min-return", type=float, default=None, help="keep episodes with at least this return")
    q.add_argument(
        "--weight", action="append", default=None, help="reward weight COMPONENT=NUMBER (default: the team's)"
    )
    _seed(q)
    q = dsub.add_parser("stats", help="episodes, transitions, action histogram, returns per source conductor")
    q.add_argument("path", help="dataset .npz")
    q.add_argument("--json", action="store_true", help="print as JSON")

    p = sub.add_parser("train", help="train an offline conductor with d3rlpy (bc | fbc | bcq | cql)", epilog=epilog)
    p.add_argument("--algo", required=True, choices=["bc", "fbc", "bcq", "cql"], help="offline algorithm")
    p.add_argument("--dataset", required=True, help="dataset .npz from `orchestra dataset build`")
    p.add_argument("--out", required=True, help="checkpoint / run directory")
    p.add_argument("--team", default=None, help="check the dataset's layout against this team first")
    p.add_argument("--steps", type=int, default=None, help="gradient steps (default 4000)")
    p.add_argument("--steps-per-epoch", type=int, default=None, help="steps per metrics row and checkpoint")
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--lr", type=float, default=None, help="learning rate")
    p.add_argument("--gamma", type=float, default=None, help="discount")
    p.add_argument("--cql-alpha", type=float, default=None, help="CQL conservatism weight")
    p.add_argument(
        "--critics", type=int, default=None, help="Q ensemble size (BCQ, CQL); targets take the ensemble minimum"
    )
    p.add_argument("--bcq-flexibility", type=float, default=None, help="BCQ action flexibility threshold")
    p.add_argument("--hidden", type=int, nargs="+", default=None, help="MLP hidden widths, e.g. 128 128")
    p.add_argument("--truncation", choices=["terminal", "bootstrap"], default=None, help="spent turn budget handling")
    _seed(p)

    p = sub.add_parser("ope", help="estimate a learned conductor's value from logs alone (d3rlpy FQE)", epilog=epilog)
    p.add_argument("--checkpoint", required=True, help="conductor checkpoint folder")
    p.add_argument("--dataset", required=True, help="logged data .npz to evaluate on")
    p.add_argument("--team", required=True, help="the team (its encoder recovers action masks)")
    p.add_argument("--steps", type=int, default=2000, help="FQE gradient steps")
    p.add_argument("--gamma", type=float, default=1.0, help="discount of the estimated value")
    p.add_argument("--out", default=None, help="write the estimate as JSON here")
    _seed(p)

    p = sub.add_parser(
        "finetune-conductor", help="refine a conductor online with MaskablePPO behind safety rails", epilog=epilog
    )
    p.add_argument("--team", required=True, help="built-in team name or team YAML")
    p.add_argument("--out", required=True, help="run directory (checkpoint in OUT/checkpoint)")
    p.add_argument("--timesteps", type=int, default=4096, help="conductor decisions to train on")
    p.add_argument("--n-steps", type=int, default=256, help="decisions per PPO rollout")
    p.add_argument(
        "--warm-start", default=None, help="dataset .npz, checkpoint folder or rule-based conductor to clone"
    )
    p.add_argument("--allow", action="append", default=None, help="rails: allowed action label/pattern (repeat)")
    p.add_argument("--max-turns", type=int, default=None, help="rails: worker turns per episode")
    p.add_argument("--max-tokens", type=int, default=None, help="rails: worker tokens per episode")
    p.add_argument("--risky", action="append", default=None, help="rails: label needing approval (default submit)")
    p.add_argument("--approve", action="store_true", help="rails: ask on the terminal before each risky action")
    p.add_argument("--embedder", default=None, choices=["minilm", "hash", "none"], help="override the team's")
    p.add_argument("--difficulty", type=int, default=None, help="one difficulty level")
    p.add_argument("--resume", action="store_true", help="continue from the run directory's checkpoint")
    common(p)

    p = sub.add_parser("distill", help="distil a conductor into a readable decision tree", epilog=epilog)
    p.add_argument("--dataset", required=True, help="states to label (.npz)")
    p.add_argument("--team", required=True, help="the team (built-in name or YAML)")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--checkpoint", help="learned conductor folder")
    g.add_argument("--conductor", help="rule-based conductor name")
    p.add_argument("--out", required=True, help="folder for rules.txt, tree.pkl, distill.json")
    p.add_argument("--max-depth", type=int, default=4)
    p.add_argument("--features", choices=["structural", "all"], default="structural", help="drop embeddings or not")
    p.add_argument("--heldout-frac", type=float, default=0.25, help="share of episodes held out for fidelity")
    _seed(p)

    p = sub.add_parser("reproduce", help="run a documented full-scale experiment", epilog=epilog)
    rsub = p.add_subparsers(dest="experiment", required=True, metavar="EXPERIMENT")
    q = rsub.add_parser("conductor", help="phase 1 at full scale: the table the README quotes")
    q.add_argument("--out", default="runs/reproduce-conductor", help="run directory (a rerun continues it)")
    q.add_argument("--train-episodes", type=int, default=None, help="training tasks per source conductor")
    q.add_argument("--episodes", type=int, default=None, help="held-out tasks per family")
    q.add_argument(
        "--report", default=None, help="also copy the summary (markdown) here, e.g. docs/results/conductor.md"
    )
    common(q)
    return {
        "dataset": _cmd_dataset,
        "train": _cmd_train,
        "ope": _cmd_ope,
        "finetune-conductor": _cmd_finetune,
        "distill": _cmd_distill,
        "reproduce": _cmd_reproduce,
    }


def _team_encoder(team: str) -> tuple[Any, Any]:
    from envs.observation import ObservationEncoder
    from orchestra.team import load_team

    spec = load_team(team)
    return spec, ObservationEncoder(spec.env)


def _cmd_dataset(a: argparse.Namespace) -> int:
    from policies.dataset import ConductorDataset, DatasetFilter, build_dataset

    if a.dataset_command == "stats":
        s = ConductorDataset.load(a.path).summary()
        if a.json:
            print(json.dumps(s, indent=2))
        else:
            print(format_summary(s))
        return 0
    team, enc = _team_encoder(a.team)
    paths: list[Path] = []
    for item in a.input:
        p = Path(item)
        paths.extend(sorted(p.glob("*.jsonl")) if p.is_dir() else [p])
    flt = DatasetFilter(
        families=tuple(a.family or ()),
        splits=tuple(a.split or ()),
        conductors=tuple(a.source or ()),
        success_only=a.success_only,
        min_return=a.min_return,
    )
    ds = build_dataset(paths, team.env, enc, weights=_weights(a.weight), filters=flt)
    out = ds.save(a.out)
    summary = ds.summary()
    out.with_suffix(".summary.json").write_text(json.dumps(summary, indent=2))
    print(format_summary(summary))
    print(f"\ndataset: {out}")
    return 0


def format_summary(s: dict[str, Any]) -> str:
    lines = [
        f"team {s['team']}: {s['episodes']} episodes, {s['transitions']} decisions, "
        f"observation {s['observation_size']} floats, {s['num_actions']} actions, "
        f"success {100 * s['success_rate']:.1f}%, {s['truncated_episodes']} truncated",
        "actions: " + ", ".join(f"{k} {v}" for k, v in s["action_histogram"].items() if v),
        "per source conductor:",
    ]
    for name, c in s["per_conductor"].items():
        lines.append(
            f"  {name:22s} {c['episodes']:4d} ep  success {100 * c['success_rate']:5.1f}%  return "
            f"mean {c['return_mean']:+.3f} sd {c['return_std']:.3f} [min {c['return_min']:+.3f}, "
            f"median {c['return_p50']:+.3f}, max {c['return_max']:+.3f}]"
        )
    return "\n".join(lines)


def _cmd_train(a: argparse.Namespace) -> int:
    from policies.dataset import ConductorDataset
    from policies.offline import OfflineConfig, train_offline

    ds = ConductorDataset.load(a.dataset)
    if a.team:
        team, enc = _team_encoder(a.team)
        ds.check_layout(team.env, enc, where=a.dataset)
    overrides = {
        "n_steps": a.steps,
        "n_steps_per_epoch": a.steps_per_epoch,
        "batch_size": a.batch_size,
        "learning_rate": a.lr,
        "gamma": a.gamma,
        "cql_alpha": a.cql_alpha,
        "n_critics": a.critics,
        "bcq_action_flexibility": a.bcq_flexibility,
        "hidden_units": tuple(a.hidden) if a.hidden else None,
        "truncation": a.truncation,
    }
    cfg = OfflineConfig(algo=a.algo, seed=a.seed, **{k: v for k, v in overrides.items() if v is not None})
    res = train_offline(ds, cfg, a.out, progress=not a.quiet)
    last = res.metrics[-1] if res.metrics else {}
    print(
        f"trained {a.algo} on {len(ds.episodes)} episodes ({len(ds)} decisions), {cfg.n_steps} steps; "
        f"agreement with the logged actions {last.get('perf/agreement', float('nan')):.3f}\n"
        f"checkpoint: {res.run_dir}  (use it as --conductor {a.algo}:{res.run_dir})"
    )
    return 0


def _cmd_ope(a: argparse.Namespace) -> int:
    from policies.checkpoint import load_conductor
    from policies.dataset import ConductorDataset
    from policies.offline import FQEConfig, fqe_evaluate

    team, enc = _team_encoder(a.team)
    ds = ConductorDataset.load(a.dataset)
    ds.check_layout(team.env, enc, where=a.dataset)
    conductor = load_conductor(a.checkpoint, team.env, enc)
    predict = getattr(conductor, "predict", None)
    if predict is None:

        def predict(obs: Any, masks: Any) -> Any:
            import numpy as np

            return np.array([conductor.act(o, m) for o, m in zip(obs, masks, strict=True)])

    res = fqe_evaluate(predict, ds, enc.legal_mask, FQEConfig(n_steps=a.steps, gamma=a.gamma, seed=a.seed))
    out = {
        "checkpoint": a.checkpoint,
        "dataset": a.dataset,
        "episodes": res.episodes,
        "fqe_estimate": res.estimate,
        "behaviour_return": res.behaviour_return,
        "gamma": a.gamma,
    }
    print(
        f"FQE estimate of {a.checkpoint}: {res.estimate:.3f} (gamma {a.gamma:g}) from {res.episodes} logged episodes; "
        f"the logged behaviour itself returned {res.behaviour_return:.3f}"
    )
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(out, indent=2))
    return 0


def _cmd_finetune(a: argparse.Namespace) -> int:
    from orchestra.online import FinetuneConfig, finetune_conductor

    cfg = FinetuneConfig(
        team=a.team,
        seed=a.seed,
        timesteps=a.timesteps,
        n_steps=a.n_steps,
        warm_start=a.warm_start,
        allow=list(a.allow or []),
        max_turns=a.max_turns,
        max_tokens=a.max_tokens,
        risky=list(a.risky) if a.risky else ["submit"],
        approve=a.approve,
        embedder=a.embedder,
        difficulty=a.difficulty,
        use_cache=not a.no_cache,
        cache_path=a.cache,
        resume=a.resume,
        progress=not a.quiet,
    )
    run = finetune_conductor(cfg, a.out)
    print(
        f"run dir: {run}\ncheckpoint: {Path(run) / 'checkpoint'}  (use it as --conductor ppo:{Path(run) / 'checkpoint'})"
    )
    return 0


def _cmd_distill(a: argparse.Namespace) -> int:
    from orchestra.conductors import conductor_factory
    from policies.dataset import ConductorDataset
    from policies.distill import DistillConfig, distill, labels_from_conductor

    team, enc = _team_encoder(a.team)
    ds = ConductorDataset.load(a.dataset)
    ds.check_layout(team.env, enc, where=a.dataset)
    spec = f"learned:{a.checkpoint}" if a.checkpoint else a.conductor
    conductor = conductor_factory(spec, team, a.seed)()
    labels = labels_from_conductor(conductor, ds.observations, ds.masks, ds.states, ds.episode_index, reset_seed=a.seed)
    cfg = DistillConfig(max_depth=a.max_depth, heldout_frac=a.heldout_frac, seed=a.seed, features=a.features)
    res = distill(
        labels, ds.observations, ds.masks, ds.feature_names, ds.action_labels, cfg, episode_index=ds.episode_index
    )
    res.save(Path(a.out))
    print(res.rules.rstrip())
    print(
        f"\nfidelity: {res.fidelity_heldout:.3f} on {res.n_heldout} held-out states, {res.fidelity_train:.3f} on "
        f"{res.n_train} training states (masked {res.masked_fidelity:.3f})\nwritten: {a.out}/rules.txt"
    )
    return 0


def phase1_from_args(cfg: Any, a: argparse.Namespace) -> Any:
    """Apply the shared run flags and the episode overrides of ``demo`` / ``reproduce`` to a Phase1Config."""
    cfg.num_envs, cfg.use_cache, cfg.cache_path, cfg.progress = a.num_envs, not a.no_cache, a.cache, not a.quiet
    if a.train_episodes is not None:
        cfg.train_episodes = a.train_episodes
    if a.episodes is not None:
        cfg.eval_episodes = a.episodes
    return cfg


def _cmd_reproduce(a: argparse.Namespace) -> int:
    from orchestra.phase1 import reproduce_config, run_phase1

    cfg = phase1_from_args(reproduce_config(seed=a.seed), a)
    res = run_phase1(cfg, Path(a.out), command=f"orchestra reproduce conductor --seed {a.seed}")
    if a.report:
        Path(a.report).parent.mkdir(parents=True, exist_ok=True)
        Path(a.report).write_text(res.paths["summary"].read_text(encoding="utf-8"), encoding="utf-8")
        print(f"report: {a.report}")
    return 0
