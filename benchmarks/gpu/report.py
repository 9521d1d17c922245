"""The GPU check's report (issue 33 item 4): the figures of an ``orchestra finetune`` run directory and of
``benchmarks/sampler.py``'s JSON files as markdown, every number computed from those files. Standard library only:
it runs on the GPU machine right after the run (``benchmarks/gpu/check.sh run``) and here on any run directory.

    python benchmarks/gpu/report.py --run RUN_DIR [--sampler bf16.json --sampler fp32.json] [--env env.txt]
        [--stages-asked 4 --finetune-exit 0 --finetune-seconds 180] --out docs/results/gpu.md

From ``RUN_DIR/updates.csv``: the share of updates kept (an update is kept when the trust region kept at least one of
its optimizer steps: ``agent/W/accepted``, one per worker updated) and the mean steps kept per update (of
``num_epochs × num_minibatches``), backtracks. From ``RUN_DIR/stages.csv``: the stage time without the held-out
evaluation (``perf/train_seconds``; runs written before that column get sampling + update seconds instead, said so)
and the held-out success before training (``perf/team_success_start`` of the first stage) and after every stage.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# the acceptance figures on a GPU
RATIO_TARGET = 0.8  # orchestra's sampler rate / plain generate's
STAGE_TARGET_S = 20.0  # a preset stage, evaluation excluded
SAMPLER_KEYS = (  # (JSON key, column title) of benchmarks/sampler.py's output
    ("orchestra_tok_s", "orchestra tok/s"),
    ("generate_tok_s", "generate tok/s"),
    ("ratio", "ratio"),
    ("orchestra_stops_tok_s", "orchestra tok/s, stops on"),
)
AGENT_KEY = re.compile(r"^agent/(.+)/(accepted|optimizer_steps|backtracks)$")


def _num(value: Any) -> float | None:
    if value in (None, ""):
        return None
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(x) else x


def read_csv(path: Path) -> list[dict[str, str]]:
    if not path.is_file():
        return []
    with path.open(newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


@dataclass
class StageFigures:
    stage: int
    updates: int  # (update, worker) pairs
    kept: int  # of them, kept (≥ 1 optimizer step survived the trust region)
    steps: float  # mean optimizer steps kept per (update, worker)
    backtracks: float  # mean backtracks per (update, worker)
    sample_s: float
    update_s: float
    train_s: float  # the stage without its held-out evaluation
    eval_s: float | None
    success: float | None  # held-out success after the stage


@dataclass
class RunFigures:
    """Everything the report says about one run directory."""

    config: dict[str, Any]
    stages: list[StageFigures]
    success_before: float | None
    train_s_measured: bool  # stages.csv has perf/train_seconds (else: sampling + update seconds)
    max_steps: int | None  # num_epochs × num_minibatches
    updates: int = 0
    kept: int = 0
    steps: float = float("nan")
    backtracks: float = float("nan")
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def kept_share(self) -> float:
        return self.kept / self.updates if self.updates else float("nan")

    @property
    def success_after(self) -> float | None:
        done = [s.success for s in self.stages if s.success is not None]
        return done[-1] if done else None

    @property
    def train_s_typical(self) -> float:
        """The stage time without evaluation: the median over the stages after the first (the first pays the
        warm-up: kernels, allocator, caches), the first stage's when it is the only one."""
        later = [s.train_s for s in self.stages[1:]] or [s.train_s for s in self.stages]
        return statistics.median(later) if later else float("nan")


def run_figures(run_dir: str | Path) -> RunFigures:
    """The figures of an ``orchestra finetune`` run directory (its config.json, updates.csv and stages.csv)."""
    run = Path(run_dir)
    config_path = run / "config.json"
    config = json.loads(config_path.read_text(encoding="utf-8")) if config_path.is_file() else {}
    trainer = config.get("trainer") or {}
    epochs, minibatches = trainer.get("num_epochs"), trainer.get("num_minibatches")
    max_steps = int(epochs) * int(minibatches) if epochs and minibatches else None
    updates, stages = read_csv(run / "updates.csv"), read_csv(run / "stages.csv")
    per_stage: dict[int, list[tuple[float, float, float]]] = {}  # stage → (accepted, steps, backtracks) per worker
    times: dict[int, list[float]] = {}  # stage → [sample s, update s]
    for row in updates:
        k = int(float(row["rollout/stage"]))
        cells: dict[str, dict[str, float]] = {}
        for key, value in row.items():
            m = AGENT_KEY.match(key)
            x = _num(value)
            if m and x is not None:
                cells.setdefault(m.group(1), {})[m.group(2)] = x
        for c in cells.values():
            if "accepted" in c:
                per_stage.setdefault(k, []).append(
                    (c["accepted"], c.get("optimizer_steps", 0.0), c.get("backtracks", 0.0))
                )
        t = times.setdefault(k, [0.0, 0.0])
        t[0] += _num(row.get("perf/sample_seconds")) or 0.0
        t[1] += _num(row.get("perf/update_seconds")) or 0.0
    measured = bool(stages) and all(_num(r.get("perf/train_seconds")) is not None for r in stages)
    out: list[StageFigures] = []
    for row in stages:
        k = int(float(row["rollout/stage"]))
        cells3 = per_stage.get(k, [])
        sample_s, update_s = times.get(k, [0.0, 0.0])
        train_s = _num(row.get("perf/train_seconds")) if measured else sample_s + update_s
        out.append(
            StageFigures(
                stage=k,
                updates=len(cells3),
                kept=sum(1 for a, _, _ in cells3 if a > 0),
                steps=statistics.fmean(s for _, s, _ in cells3) if cells3 else float("nan"),
                backtracks=statistics.fmean(b for _, _, b in cells3) if cells3 else float("nan"),
                sample_s=sample_s,
                update_s=update_s,
                train_s=float(train_s or 0.0),
                eval_s=_num(row.get("perf/eval_seconds")),
                success=_num(row.get("perf/team_success")),
            )
        )
    before = _num(stages[0].get("perf/team_success_start")) if stages else None
    fig = RunFigures(config, out, before, measured, max_steps)
    every = [c for k in sorted(per_stage) for c in per_stage[k] if k in {s.stage for s in out}]
    fig.updates, fig.kept = len(every), sum(1 for a, _, _ in every if a > 0)
    if every:
        fig.steps = statistics.fmean(s for _, s, _ in every)
        fig.backtracks = statistics.fmean(b for _, _, b in every)
    return fig


# ----------------------------------------------------------------------------------------------------------------
# markdown


def _pct(x: float | None) -> str:
    return "—" if x is None or math.isnan(x) else f"{x:.1%}"


def _f(x: float | None, digits: int = 1) -> str:
    return "—" if x is None or math.isnan(x) else f"{x:.{digits}f}"


def sampler_rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per batch size of a ``benchmarks/sampler.py --out`` JSON (its figures sit under ``batches``, keyed by
    the batch), each with the run's dtype, new tokens and machine."""
    head = {k: doc.get(k) for k in ("dtype", "new_tokens", "device", "machine")}
    return [head | {"batch": int(b)} | fig for b, fig in sorted(doc["batches"].items(), key=lambda kv: int(kv[0]))]


def summary_lines(fig: RunFigures, samplers: list[dict[str, Any]]) -> list[str]:
    """The headline figures, one per line (printed by the GPU script and listed in the report)."""
    lines = []
    for s in samplers:
        ratio = _num(s.get("ratio"))
        lines.append(
            f"sampler ratio against plain generate ({s.get('dtype', '?')}, batch {s.get('batch', '?')}): "
            f"{_f(ratio, 2)} (target ≥ {RATIO_TARGET}: {'met' if ratio is not None and ratio >= RATIO_TARGET else 'not met'})"
        )
    if not fig.stages:
        return [*lines, "finetune: no stage completed"]
    of = f" of {fig.max_steps}" if fig.max_steps else ""
    typical = fig.train_s_typical
    lines += [
        f"updates kept: {fig.kept} of {fig.updates} ({_pct(fig.kept_share)})",
        f"optimizer steps kept per update: {_f(fig.steps, 2)}{of} (backtracks per update {_f(fig.backtracks, 2)})",
        f"stage time without evaluation: {_f(typical)} s (target ≤ {STAGE_TARGET_S:g} s: "
        f"{'met' if typical <= STAGE_TARGET_S else 'not met'}); first stage {_f(fig.stages[0].train_s)} s"
        + ("" if fig.train_s_measured else " (sampling + update seconds: stages.csv has no perf/train_seconds)"),
        f"held-out success: {_pct(fig.success_before)} before training, {_pct(fig.success_after)} after "
        f"{len(fig.stages)} stage{'s' if len(fig.stages) != 1 else ''}",
    ]
    return lines


def markdown(
    fig: RunFigures,
    samplers: list[dict[str, Any]],
    *,
    env: str = "",
    stages_asked: int | None = None,
    finetune_exit: int | None = None,
    finetune_seconds: float | None = None,
    command: str = "",
) -> str:
    team, trainer = fig.config.get("team") or {}, fig.config.get("trainer") or {}
    lines = [
        "# Phase 2 on a GPU: the sampler and the preset (issue 33)",
        "",
        "Generated by `python benchmarks/gpu/report.py` from the run directory's `config.json`, `updates.csv` and "
        "`stages.csv` and from `benchmarks/sampler.py`'s JSON; the procedure: "
        "[docs/performance.md](../performance.md#phase-2-on-a-gpu-benchmarksgpu).",
        "",
    ]
    if env.strip():
        lines += ["```", env.strip(), "```", ""]
    lines += ["## Summary", "", *(f"- {line}" for line in summary_lines(fig, samplers)), ""]
    if samplers:
        lines += [
            "## The sampler against plain `model.generate`",
            "",
            "`benchmarks/sampler.py`: the same prompts, batch, dtype and device; stops off and a fixed number of new "
            "tokens for both, then orchestra's sampler again with stops on.",
            "",
            "| dtype | batch | new tokens | " + " | ".join(t for _, t in SAMPLER_KEYS) + " |",
            "|---|---|---|" + "---|" * len(SAMPLER_KEYS),
        ]
        for s in samplers:
            cells = [_f(_num(s.get(k)), 2 if k == "ratio" else 0) for k, _ in SAMPLER_KEYS]
            lines.append(
                f"| {s.get('dtype', '?')} | {s.get('batch', '?')} | {s.get('new_tokens', '?')} | "
                + " | ".join(cells)
                + " |"
            )
        lines.append("")
    head = command or "orchestra finetune --config orchestra/teamtr/configs/smollm2_gpu.yaml"
    done = f"{len(fig.stages)} stage{'s' if len(fig.stages) != 1 else ''} completed"
    if stages_asked is not None:
        done += f" of {stages_asked} asked"
    if finetune_exit is not None:
        done += f"; exit {finetune_exit}" + (" (the timeout)" if finetune_exit in (124, 137) else "")
    if finetune_seconds is not None:
        done += f", {finetune_seconds:.0f} s with the model load"
    lines += [
        "## The preset",
        "",
        f"`{head}`: {done}. {team.get('dtype', '?')} on {team.get('device', '?')}, "
        f"{trainer.get('batch_size', '?')} episodes per batch (G = {team.get('group_size', '?')}, temperature "
        f"{team.get('temperature', '?')}, {team.get('max_tokens', '?')} tokens per turn), {trainer.get('num_epochs', '?')} "
        f"epochs × {trainer.get('num_minibatches', '?')} minibatches, δ = {trainer.get('delta', '?')}, scheme "
        f"{trainer.get('scheme', '?')}; held-out success on {team.get('eval_tasks', '?')} test tasks (greedy).",
        "",
        "| stage | updates kept | steps kept per update | backtracks per update | sampling s | updates s "
        "| stage s without evaluation | evaluation s | held-out success after |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for st in fig.stages:
        lines.append(
            f"| {st.stage} | {st.kept} of {st.updates} | {_f(st.steps, 2)} | {_f(st.backtracks, 2)} | {_f(st.sample_s)} | "
            f"{_f(st.update_s)} | {_f(st.train_s)} | {_f(st.eval_s)} | {_pct(st.success)} |"
        )
    lines += ["", f"Held-out success before training: {_pct(fig.success_before)}.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run", required=True, help="an orchestra finetune run directory")
    p.add_argument("--sampler", action="append", default=[], help="a benchmarks/sampler.py JSON (repeatable)")
    p.add_argument("--env", default=None, help="a text file: the machine, the versions (shown as is)")
    p.add_argument("--stages-asked", type=int, default=None)
    p.add_argument("--finetune-exit", type=int, default=None)
    p.add_argument("--finetune-seconds", type=float, default=None)
    p.add_argument("--command", default="", help="the finetune command line, as shown")
    p.add_argument("--out", default=None, help="write the markdown here (default: print it)")
    a = p.parse_args(argv)
    fig = run_figures(a.run)
    samplers = []
    for path in a.sampler:
        try:
            samplers += sampler_rows(json.loads(Path(path).read_text(encoding="utf-8")))
        except (OSError, ValueError, AttributeError) as e:
            print(f"sampler JSON {path}: {e}")
    env = Path(a.env).read_text(encoding="utf-8") if a.env and Path(a.env).is_file() else ""
    text = markdown(
        fig,
        samplers,
        env=env,
        stages_asked=a.stages_asked,
        finetune_exit=a.finetune_exit,
        finetune_seconds=a.finetune_seconds,
        command=a.command,
    )
    print("\n".join(summary_lines(fig, samplers)))
    if a.out:
        Path(a.out).write_text(text, encoding="utf-8")
        print(f"written: {a.out}")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
