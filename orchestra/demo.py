"""``orchestra demo``: record with the rule-based conductors on two families, then evaluate them on
held-out tasks. Sized to finish in a few minutes on 2 CPU cores with the embedded SmolLM2; a second run
is served from the response cache."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestra.runs import EvaluateConfig, RecordConfig, Session, evaluate, format_table, record


@dataclass
class DemoConfig:
    teams: list[str] = field(default_factory=lambda: ["arithmetic", "blocksworld"])  # built-in teams
    conductors: list[str] = field(default_factory=lambda: ["round_robin", "random", "pipeline", "heuristic"])
    train_episodes: int = 4  # recorded training-split episodes per team and conductor
    eval_episodes: int = 16  # held-out episodes per team and conductor
    seed: int = 0
    num_envs: int = 8
    use_cache: bool = True
    cache_path: str | None = None
    progress: bool = True

    def run_options(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in ("seed", "num_envs", "use_cache", "cache_path", "progress")}


def run_demo(cfg: DemoConfig, out: Path) -> Path:
    t0 = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    print(f"[1/2] recording {cfg.train_episodes} training episodes per conductor on {', '.join(cfg.teams)}")
    for team in cfg.teams:
        session = Session(team, None, cfg.use_cache, cfg.cache_path)
        for conductor in cfg.conductors:
            rc = RecordConfig(team, conductor, cfg.train_episodes, "train", **cfg.run_options())
            record(rc, out / "record" / f"{team}-{conductor}.jsonl", resume=True, session=session)
    print(f"[2/2] evaluating {len(cfg.conductors)} conductors on {cfg.eval_episodes} held-out tasks per family")
    ec = EvaluateConfig(teams=cfg.teams, conductors=cfg.conductors, episodes=cfg.eval_episodes, **cfg.run_options())
    rows, paths = evaluate(ec, out / "eval")
    print()
    print(format_table(rows))
    print(f"\ntrajectories: {out / 'record'} and {out / 'eval' / 'episodes'}")
    print(f"table: {paths['md']}  csv: {paths['csv']}  plot: {paths['png']}")
    print(f"demo finished in {time.perf_counter() - t0:.0f} s")
    return out
