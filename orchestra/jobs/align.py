"""``orchestra align chain|llm``: Stage-0 alignment of a newcomer to one worker of a team, with the swap-shock report
(phase 2; the method: :mod:`orchestra.teamtr.align`, docs/algorithms.md §2.5).

One job per kind of team, each reusing :func:`orchestra.teamtr.align.swap_shock` through its team's own probes and
policies:

* :func:`align_chain` — the telephone-chain testbed, exact team success (:mod:`orchestra.teamtr.align_chain`);
* :func:`align_llm` — worker ``swap.worker`` of an LLM team (team file + fixed conductor, as ``orchestra finetune``),
  optionally with its fine-tuned adapter, replaced by a newcomer model of the same tokenizer family with a fresh (or
  given) LoRA adapter; team success = held-out greedy success on ``team.eval_tasks`` test tasks
  (:mod:`orchestra.teamtr.align_llm`).

Every job writes to ``out``: ``config.json`` (resolved), ``metrics.jsonl`` / ``metrics.csv`` (one row per KL
check), ``report.json``, ``report.md``, ``kl_curve.png`` and the newcomer's aligned weights (chain:
``newcomer.safetensors``; llm: the peft folder ``adapters/WORKER/``, plus the merged model ``newcomer_model/`` when
all its weights were trained).
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestra.teamtr.align import DIVERGENCES, AlignConfig, Divergence
from orchestra.teamtr.align_chain import ChainSwapConfig
from orchestra.teamtr.align_llm import LLMSwapConfig
from orchestra.teamtr.chain import ChainConfig
from orchestra.teamtr.config import CHAIN_TRAINER, TeamTRConfig, derive_seed
from orchestra.teamtr.llm_config import LLMTeamConfig, TinyModelConfig
from trajectories.rundir import CONFIG_FILE, write_config, write_table

FORMAT = "orchestra.teamtr.align/1"

# LLM-sized alignment: probes are episodes, and a step is a few teacher-forced forwards
LLM_ALIGN = AlignConfig(lr=1e-3, max_steps=200, batch_size=8, num_train_probes=16, num_heldout_probes=8)
# the incumbent's team: one probe episode per task, 48 tokens per turn, team success on 8 held-out tasks
LLM_ALIGN_TEAM = LLMTeamConfig(group_size=1, max_tokens=48, eval_tasks=8)


def _sizes(hidden_size: int | None, num_layers: int | None) -> dict[str, Any]:
    """The newcomer base's size fields that were set."""
    sizes = {"hidden_size": hidden_size, "num_layers": num_layers}
    return {k: v for k, v in sizes.items() if v is not None}


@dataclass(frozen=True)
class AlignChainConfig:
    """``orchestra align chain``: a warm-started telephone chain (optionally fine-tuned ``train_stages`` TeamTR stages
    with :data:`~orchestra.teamtr.config.CHAIN_TRAINER`, so the incumbent is a trained agent), agent ``swap.agent``
    swapped for a differently initialised newcomer, aligned, and exact J reported before / direct / aligned. The
    team's, the trainer's and Stage 0's seeds derive from ``seed``."""

    n_agents: int = 4  # chain length (agents)
    vocab_size: int = 8  # V message symbols
    train_stages: int = 3  # TeamTR stages before the swap (0 = warm start only)
    swap: ChainSwapConfig = ChainSwapConfig()  # which agent, and the newcomer built for it
    newcomer_hidden_size: int | None = None  # the newcomer base's width (None: the team's)
    newcomer_layers: int | None = None  # the newcomer base's depth (None: the team's)
    align: AlignConfig = AlignConfig()  # the alignment loop (its seed: ``seed``)
    compare: tuple[Divergence, ...] = ()  # also align the same newcomer by these (forward, sft, reverse): compare.csv
    compare_seeds: int = 1  # the comparison over this many newcomer inits and probe draws (paired across methods)
    out: str = "runs/align_chain"  # run directory (must not hold a finished align run)
    plot: bool = True  # draw kl_curve.png
    seed: int = 0  # root seed (team, training, probes, newcomer; exact on CPU)
    progress: bool = True  # progress lines on stderr

    def __post_init__(self) -> None:
        if self.train_stages < 0:
            raise ValueError(f"train_stages must be ≥ 0, got {self.train_stages}")
        bad = [d for d in self.compare if d not in DIVERGENCES]
        if bad or self.compare_seeds < 1:
            raise ValueError(
                f"compare: expected some of {DIVERGENCES} and compare_seeds ≥ 1, got {bad or self.compare_seeds}"
            )

    def team_config(self) -> ChainConfig:
        return ChainConfig(
            n_agents=self.n_agents,
            vocab_size=self.vocab_size,
            lora_r=max(8, self.vocab_size - 1),  # r ≥ V − 1: lm_head's LoRA can express any V×V policy
            lora_targets=("lm_head",),
            seed=derive_seed(self.seed, 0, bits=31),
        )

    def trainer_config(self) -> TeamTRConfig:
        """The pre-swap training: the chain experiment's trainer, fixed order, teamtr."""
        return dataclasses.replace(
            CHAIN_TRAINER, scheme="teamtr", num_stages=self.train_stages, seed=derive_seed(self.seed, 1, bits=31)
        )

    def swap_config(self, team_cfg: ChainConfig) -> ChainSwapConfig:
        sizes = _sizes(self.newcomer_hidden_size, self.newcomer_layers)
        model = dataclasses.replace(team_cfg.model, **sizes) if sizes else self.swap.newcomer_model
        return dataclasses.replace(self.swap, newcomer_model=model)


@dataclass(frozen=True)
class AlignLLMConfig:
    """``orchestra align llm``: worker ``swap.worker`` of an LLM team (``team``: team file, FIXED conductor, base
    model and sampling, as in ``orchestra finetune``) swapped for ``swap.newcomer`` of the same tokenizer family.
    ``seed`` is the team's seed (tiny base, LoRA init, held-out tasks) and Stage 0's; the team trains one worker,
    ``swap.worker``; a KL evaluation takes ``align.batch_size`` probes."""

    swap: LLMSwapConfig = LLMSwapConfig()  # the swapped worker, the incumbent's adapter and the newcomer
    team: LLMTeamConfig = field(default_factory=lambda: LLM_ALIGN_TEAM)  # the incumbent's team
    align: AlignConfig = field(default_factory=lambda: LLM_ALIGN)  # the alignment loop
    newcomer_hidden_size: int | None = None  # a tiny newcomer's width (None: the team's tiny)
    newcomer_layers: int | None = None  # a tiny newcomer's depth (None: the team's tiny)
    out: str = "runs/align_llm"  # run directory (must not hold a finished align run)
    plot: bool = True  # draw kl_curve.png
    seed: int = 0  # the team's and Stage 0's seed (an incumbent adapter of a tiny base needs its finetune seed)
    progress: bool = True  # progress lines on stderr

    def __post_init__(self) -> None:
        if self.team.eval_tasks < 1:
            raise ValueError(
                f"team.eval_tasks must be ≥ 1 (team success is measured on held-out tasks), got {self.team.eval_tasks}"
            )
        if (self.newcomer_hidden_size or self.newcomer_layers) and self.swap.newcomer != "tiny":
            raise ValueError("newcomer_hidden_size / newcomer_layers size a tiny newcomer only (newcomer: tiny)")

    def configs(self) -> tuple[AlignConfig, LLMTeamConfig, LLMSwapConfig]:
        """(alignment, the incumbent's team, the swap) as the job runs them."""
        align = dataclasses.replace(self.align, eval_batch_size=self.align.batch_size, seed=self.seed)
        team = dataclasses.replace(self.team, workers=(self.swap.worker,), seed=self.seed)
        sizes = _sizes(self.newcomer_hidden_size, self.newcomer_layers)
        tiny = dataclasses.replace(TinyModelConfig(), **sizes) if sizes else self.swap.newcomer_tiny
        return align, team, dataclasses.replace(self.swap, newcomer_tiny=tiny)


def _say(progress: bool) -> Callable[[str], None]:
    def say(msg: str) -> None:
        if progress:
            print(msg, file=sys.stderr, flush=True)

    return say


def _fresh_out(out: Path) -> None:
    for name in ("report.json", CONFIG_FILE):
        if (out / name).exists():
            raise FileExistsError(f"{out / name} exists: {out} holds an align run already; use another --out")


def _write_config(out: Path, mode: str, **parts: Any) -> None:
    write_config(out, {"format": FORMAT, "mode": mode, **parts})


def _on_check(say: Callable[[str], None], delta_0: float, wall_time: bool) -> Callable[[dict[str, float]], None]:
    """One progress line per KL check (with the wall time for the slow LLM mode)."""

    def on_check(row: dict[str, float]) -> None:
        wall = f", {row['perf/wall_seconds']:.0f} s" if wall_time else ""
        say(
            f"align step {int(row['align/step']):5d}: KL(new‖inc) train {row['kl/train']:.4f} "
            f"held-out {row['kl/heldout']:.4f} (δ_0 {delta_0:g}){wall}"
        )

    return on_check


@dataclass(frozen=True)
class AlignResult:
    """What an align job wrote, and its report as markdown."""

    markdown: str
    written: list[Path]


def align_chain(cfg: AlignChainConfig) -> AlignResult:
    """Stage 0 on the telephone chain (:class:`AlignChainConfig`). Input errors (ValueError, AlignError) surface
    before anything is built or written."""
    import torch
    from safetensors.torch import save_file

    from orchestra.teamtr.align import report_markdown, write_report
    from orchestra.teamtr.align_chain import build_chain_newcomer, chain_swap_shock, newcomer_config
    from orchestra.teamtr.chain import ChainTeam, team_success, warm_start
    from orchestra.teamtr.chain_team import ChainTrainable
    from orchestra.teamtr.trainer import train

    say = _say(cfg.progress)
    out = Path(cfg.out)
    align_cfg = dataclasses.replace(cfg.align, seed=cfg.seed)
    team_cfg = cfg.team_config()
    swap = cfg.swap_config(team_cfg)
    new_cfg = newcomer_config(team_cfg, swap)
    trainer_cfg = cfg.trainer_config()
    _fresh_out(out)
    out.mkdir(parents=True, exist_ok=True)
    _write_config(
        out,
        "chain",
        align=align_cfg,
        swap=swap,
        team=team_cfg,
        newcomer=new_cfg,
        trainer=trainer_cfg if cfg.train_stages > 0 else None,
    )

    torch.set_num_threads(1)  # tiny models are dispatch-bound
    t0 = time.perf_counter()
    team = ChainTeam(team_cfg)
    warm_start(team)
    say(f"align chain: n={cfg.n_agents} V={cfg.vocab_size}, warm-started team J = {team_success(team):.3f}")
    if cfg.train_stages > 0:
        log = train(ChainTrainable(team), trainer_cfg, out_dir=out / "incumbent_team")
        curve = " → ".join(f"{s['perf/team_success']:.3f}" for s in log.stages)
        say(f"align chain: {cfg.train_stages} TeamTR stages, J {curve} (run: {out / 'incumbent_team'})")
    newcomer = build_chain_newcomer(team_cfg, swap)
    report = chain_swap_shock(
        team, swap, align_cfg, newcomer=newcomer, on_check=_on_check(say, align_cfg.delta_0, False)
    )
    report = dataclasses.replace(report, meta={**report.meta, "total_seconds": time.perf_counter() - t0})
    paths = write_report(report, out, plot=cfg.plot)
    markdown = report_markdown(report)
    if cfg.compare:
        rows = compare_divergences(team, swap, align_cfg, cfg.compare, cfg.compare_seeds, say)
        paths["compare"] = out / "compare.csv"
        write_table(paths["compare"], rows)
        markdown = markdown.rstrip() + "\n\n" + compare_markdown(rows, align_cfg.delta_0)
        paths["markdown"].write_text(markdown, encoding="utf-8")
    params = (
        newcomer.adapter_parameters(0)
        if swap.train_params == "adapter"
        else dict(newcomer.models[0].named_parameters())
    )
    save_file({k: p.detach().contiguous() for k, p in params.items()}, str(out / "newcomer.safetensors"))
    return AlignResult(markdown, [out / CONFIG_FILE, *paths.values(), out / "newcomer.safetensors"])


def compare_divergences(
    team: Any,
    swap: Any,
    align_cfg: AlignConfig,
    divergences: Sequence[Divergence],
    seeds: int,
    say: Callable[[str], None],
) -> list[dict[str, Any]]:
    """Stage 0 by each divergence from the SAME newcomer init and the same probes, for ``seeds`` (newcomer seed,
    probe seed) pairs: one row per (seed, divergence) with exact J before / direct / aligned, steps, the stop reason
    and the held-out reverse and forward KL at the end (held-out probes: independent fresh rollouts of the team)."""
    from orchestra.teamtr.align_chain import build_chain_newcomer, chain_swap_shock, newcomer_config

    rows: list[dict[str, Any]] = []
    base_seed = newcomer_config(team.cfg, swap).seed
    for k in range(seeds):
        seed_swap = dataclasses.replace(swap, newcomer_seed=derive_seed(base_seed, k, bits=31))
        for div in divergences:
            cfg_k = dataclasses.replace(align_cfg, divergence=div, seed=derive_seed(align_cfg.seed, k, bits=31))
            r = chain_swap_shock(team, seed_swap, cfg_k, newcomer=build_chain_newcomer(team.cfg, seed_swap))
            rows.append(
                dict(
                    seed=k,
                    divergence=div,
                    j_before=r.j_before,
                    j_direct=r.j_direct,
                    j_aligned=r.j_aligned,
                    recovered=r.recovered_fraction,
                    steps=r.align.steps,
                    stopped=r.align.stopped,
                    heldout_reverse_kl=r.align.kl_heldout_after,
                    heldout_forward_kl=r.align.history[-1]["kl/heldout_forward"],
                    seconds=r.align.seconds,
                )
            )
            say(
                f"compare seed {k} {div}: J direct {r.j_direct:.3f} → aligned {r.j_aligned:.3f} in {r.align.steps} steps"
            )
    return rows


def compare_markdown(rows: Sequence[dict[str, Any]], delta_0: float) -> str:
    """The comparison table: per divergence, mean ± sd over seeds."""
    import numpy as np

    lines = [
        f"## Stage 0 against its baselines (same newcomer init and probes per seed; stop: held-out reverse KL ≤ δ_0 = "
        f"{delta_0:g} or the step budget)",
        "",
        "| trained on | seeds | J aligned | recovered | steps | reached δ_0 | held-out reverse KL | held-out forward KL |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for div in dict.fromkeys(r["divergence"] for r in rows):
        sel = [r for r in rows if r["divergence"] == div]

        def ms(key: str, digits: int = 3, sel: list[dict[str, Any]] = sel) -> str:
            v = np.asarray([r[key] for r in sel], dtype=np.float64)
            return f"{v.mean():.{digits}f} ± {v.std(ddof=1) if len(v) > 1 else 0.0:.{digits}f}"

        reached = sum(r["stopped"] == "delta_0" for r in sel)
        lines.append(
            f"| {div} | {len(sel)} | {ms('j_aligned')} | {ms('recovered', 2)} | {ms('steps', 0)} | {reached}/{len(sel)} | "
            f"{ms('heldout_reverse_kl', 4)} | {ms('heldout_forward_kl', 4)} |"
        )
    j_b, j_d = rows[0]["j_before"], float(np.mean([r["j_direct"] for r in rows]))
    lines += ["", f"Before the swap J = {j_b:.3f}; direct swap J = {j_d:.3f} (mean over seeds).", ""]
    return "\n".join(lines)


def align_llm(cfg: AlignLLMConfig) -> AlignResult:
    """Stage 0 in an LLM team (:class:`AlignLLMConfig`). Input errors (ValueError: AlignError, LLMTeamError) surface
    before anything is written or trained."""
    import torch

    from orchestra.backends.hf import quiet_loading
    from orchestra.teamtr.align import report_markdown, write_report
    from orchestra.teamtr.align_llm import (
        build_incumbent_team,
        build_llm_newcomer,
        check_newcomer_tokenizer,
        incumbent_team_config,
        llm_swap_shock,
        newcomer_config,
    )
    from orchestra.teamtr.llm_models import load_tokenizer

    say = _say(cfg.progress)
    out = Path(cfg.out)
    t0 = time.perf_counter()
    align_cfg, team_cfg, swap = cfg.configs()
    _fresh_out(out)
    team_cfg = incumbent_team_config(team_cfg, swap)  # the incumbent adapter's LoRA layout (missing folder…)
    new_cfg = newcomer_config(team_cfg, swap)
    check_newcomer_tokenizer(team_cfg, swap)  # another tokenizer family: refused before any model loads
    if team_cfg.device == "cpu":
        torch.set_num_threads(1)  # small models are dispatch-bound on a busy CPU
    say(f"align llm: team {team_cfg.team}, worker {swap.worker}, incumbent {team_cfg.model}, newcomer {swap.newcomer}")
    team = build_incumbent_team(team_cfg, swap, log=say)  # unknown / tool worker, bad model path…
    newcomer = build_llm_newcomer(team_cfg, swap, log=say)
    out.mkdir(parents=True, exist_ok=True)
    _write_config(out, "llm", align=align_cfg, swap=swap, team=team_cfg, newcomer=new_cfg)
    report = llm_swap_shock(
        team, swap, align_cfg, newcomer=newcomer, on_check=_on_check(say, align_cfg.delta_0, True), log=say
    )
    report = dataclasses.replace(report, meta={**report.meta, "total_seconds": time.perf_counter() - t0})
    paths = write_report(report, out, plot=cfg.plot)
    written = [out / CONFIG_FILE, *paths.values(), *newcomer.save_adapters(out / "adapters").values()]
    if swap.train_params == "all":  # the base moved too: the merged model is a local HF folder (--model DIR)
        tokenizer = load_tokenizer(new_cfg.model)
        merged = newcomer.model_of(0).merge_and_unload()
        with quiet_loading():
            merged.save_pretrained(str(out / "newcomer_model"))
            tokenizer.save_pretrained(str(out / "newcomer_model"))
        written.append(out / "newcomer_model")
    return AlignResult(report_markdown(report), written)


__all__ = [
    "LLM_ALIGN",
    "LLM_ALIGN_TEAM",
    "AlignChainConfig",
    "AlignLLMConfig",
    "AlignResult",
    "align_chain",
    "align_llm",
]
