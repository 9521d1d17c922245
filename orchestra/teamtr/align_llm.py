"""Stage-0 alignment of an LLM worker (:mod:`orchestra.teamtr.align` is the generic part; the telephone chain's is
:mod:`orchestra.teamtr.align_chain`).

Worker i of an :class:`~orchestra.teamtr.llm.LLMTeam` (the INCUMBENT: its base, optionally with a fine-tuned LoRA
adapter) is replaced by a NEWCOMER model of the same tokenizer family (another base, or a tiny random Llama of
another seed, with a fresh or given LoRA adapter). Before the swap the newcomer minimises

    D^tok(π_new ‖ π_inc) = (1 / Σ_n L_n) Σ_n Σ_{u < L_n} KL(π_new(·| p_n, y_n,<u) ‖ π_inc(·| p_n, y_n,<u))

over the full vocabulary, where each probe n is one turn of worker i harvested from the CURRENT team's sampled
rollouts (:meth:`LLMTeam.sample` with the incumbent in place): its exact prompt ids p_n (chat template, other workers'
messages and tool outputs included) and the L_n ids y_n the incumbent sampled; the positions compared are the
incumbent's own sampled tokens, teacher forced. π = softmax(z / temperature), the team's sampling policy (as in
:mod:`orchestra.teamtr.llm`). Train and held-out probes come from independent rollouts (generator streams
``seeded_generator(seed, 0)`` and ``(seed, 1)``).

Team success J before the swap / after a direct (unaligned) swap / after the aligned swap is the team's held-out
success :meth:`LLMTeam.exact_success` (``eval_tasks`` TEST-split tasks, fixed seeds, greedy by default) with worker
i served by the incumbent, the unaligned newcomer and the aligned newcomer. Swapping is done by
:meth:`LLMTeam.serving`: the team's worker entries (read by reference by its rollout engines) are pointed at the
newcomer's backend for the duration of a ``with`` block and restored afterwards; the team's models are never
modified (checked at the end of :func:`llm_swap_shock`).

The newcomer is a one-worker :class:`LLMTeam` (shared base, adapter named after the worker), so the teacher-forced
forward, the adapter parameters and the peft saving are the team's own (``turn_logits``, ``parameters``,
``save_adapters``).

Memory: the incumbent's logits are cached ONCE per probe set as a dense (N, T, V) float32 tensor (V = 49 152 for the
SmolLM2 family; padded positions hold zeros) when both sets fit in ``LLMSwapConfig.cache_limit_mb``, otherwise they
are recomputed for every minibatch and every check (``AlignConfig.cache_incumbent`` = False). E.g. 16 probes × 48
tokens: 16·48·49 152·4 B = 151 MB. ``AlignConfig.eval_batch_size`` probes go through one no-grad KL evaluation
(several (n, T, V) tensors): keep it near ``batch_size`` (the CLI sets it equal).

What a LoRA can reach: a fresh adapter on the attention/MLP projections (the default ``lora_targets``) moves the
newcomer's hidden states only; its output matrix stays its own. Aligning to a fine-tuned adapter on the SAME base
works with ``train_params="adapter"``; a newcomer of another base (another tiny seed, another size) keeps most of
the gap unless ``train_params="all"`` (measured on tiny, V = 49 152: adapter-only held-out KL 0.0128 → 0.0125 in 60
steps; all weights 0.0128 → 0.0005 in 20 steps with one token per turn).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from torch import Tensor

from orchestra.backends.hf import TransformersBackend
from orchestra.teamtr.align import (
    AlignConfig,
    AlignError,
    AlignPolicy,
    SwapShockReport,
    check_tokenizer_family,
    swap_shock,
)
from orchestra.teamtr.config import derive_seed, seeded_generator
from orchestra.teamtr.llm import LLMTeam
from orchestra.teamtr.llm_config import LLMTeamConfig, TinyModelConfig
from orchestra.teamtr.llm_models import TINY, load_tokenizer
from orchestra.teamtr.llm_rollout import LLMRollout, Turn
from orchestra.teamtr.protocols import Metrics

# ----------------------------------------------------------------------------------------------------------------
# probes


@dataclass(frozen=True)
class LLMProbes:
    """N turns of one worker as probe contexts (a :class:`~orchestra.teamtr.align.ProbeBatch`).

    Layout (N, T): T = ``width`` ≥ the longest turn; turn n's L_n sampled ids sit LEFT-aligned in columns
    0..L_n − 1 of row n, and column u stands for the next-token distribution π(·| prompt_n, y_n,<u) that produced
    y_n,u (teacher forcing). ``mask`` (N, T) bool marks columns u < L_n. ``select`` keeps T, so cached (N, T, V)
    incumbent logits index by row.
    """

    turns: tuple[Turn, ...]  # N turns (each with ≥ 1 sampled id): exact prompt ids + the incumbent's sampled ids
    width: int  # T
    device: str = "cpu"  # where mask and token tensors live (the team's device)

    def __post_init__(self) -> None:
        if any(not t.token_ids for t in self.turns):
            raise ValueError("every probe turn needs at least one sampled id")
        longest = max((len(t.token_ids) for t in self.turns), default=0)
        if self.width < max(longest, 1):
            raise ValueError(f"width {self.width} < the longest probe turn ({longest} ids)")

    @property
    def size(self) -> int:
        return len(self.turns)

    @property
    def lengths(self) -> Tensor:
        """(N,) long: L_n, the sampled ids of each turn."""
        return torch.tensor([len(t.token_ids) for t in self.turns], dtype=torch.long, device=self.device)

    @property
    def mask(self) -> Tensor:
        """(N, T) bool: column u < L_n."""
        return torch.arange(self.width, device=self.device)[None, :] < self.lengths[:, None]

    @property
    def num_tokens(self) -> int:
        """Σ_n L_n: the probed positions."""
        return sum(len(t.token_ids) for t in self.turns)

    def positions(self) -> Tensor:
        """(Σ L_n,) long flat indices n·T + u of the probed positions, row-major (turn order, then token order)."""
        return torch.tensor(
            [n * self.width + u for n, t in enumerate(self.turns) for u in range(len(t.token_ids))],
            dtype=torch.long,
            device=self.device,
        )

    def token_ids(self) -> Tensor:
        """(N, T) long: y_n,u, the incumbent's sampled ids (0 off the mask)."""
        out = torch.zeros(self.size * self.width, dtype=torch.long, device=self.device)
        ids = [i for t in self.turns for i in t.token_ids]
        return out.index_put((self.positions(),), torch.tensor(ids, dtype=torch.long, device=self.device)).view(
            self.size, self.width
        )

    def behaviour_logprobs(self) -> Tensor:
        """(N, T) float32: log π_inc(y_n,u | ·) recorded while sampling (0 off the mask)."""
        out = torch.zeros(self.size * self.width, device=self.device)
        lps = [lp for t in self.turns for lp in t.logprobs]
        return out.index_put((self.positions(),), torch.tensor(lps, device=self.device)).view(self.size, self.width)

    def select(self, rows: Tensor) -> LLMProbes:
        return LLMProbes(tuple(self.turns[int(r)] for r in rows.tolist()), self.width, self.device)


def _harvest(team: LLMTeam, agent: int, episodes: int, generator: torch.Generator) -> tuple[LLMProbes, LLMRollout]:
    with torch.no_grad():
        batch = team.sample(episodes, generator)
    turns = tuple(t for t in batch.turns_of(agent) if t.token_ids)
    if not turns:
        raise AlignError(
            f"worker {team.agent_names[agent]!r} never spoke in {episodes} sampled episodes of team "
            f"{team.spec.name!r} under conductor {team.cfg.conductor!r}: no probe contexts (more episodes, or a "
            f"conductor that calls it)"
        )
    width = max(len(t.token_ids) for t in turns)
    return LLMProbes(turns, width, team.cfg.device), batch


def harvest_llm_probes(team: LLMTeam, agent: int, episodes: int, generator: torch.Generator) -> LLMProbes:
    """Probe contexts of trainable worker ``agent``: every turn it took (with ≥ 1 sampled id) in ``episodes`` fresh
    episodes of the CURRENT team, sampled from ``generator`` (occupancy as sampled: a frequent context appears
    often). ``episodes`` must be a multiple of the team's ``group_size``. T = the longest harvested turn."""
    return _harvest(team, agent, episodes, generator)[0]


# ----------------------------------------------------------------------------------------------------------------
# the policies


class LLMWorkerPolicy:
    """Trainable worker ``agent`` of an :class:`LLMTeam` (its model with its adapter active) as an
    :class:`~orchestra.teamtr.align.AlignPolicy` over :class:`LLMProbes`.

    ``logits(probes)`` → (N, T, V): z / temperature at the probed positions from teacher-forced, left-padded
    forwards of ``prompt_ids + token_ids`` (the team's own ``turn_logits``, ``forward_batch_size`` turns per
    forward), V = ``vocab_size`` (the tokenizer's ids: a model padding its embedding past the tokenizer is cut);
    zeros off the mask. Grad flows when enabled.

    ``train_params="adapter"``: :meth:`parameters` = the worker's LoRA; ``"all"``: every weight of its model (only
    for a model no other worker uses, e.g. a newcomer built by :func:`build_llm_newcomer`).
    """

    def __init__(
        self,
        team: LLMTeam,
        agent: int,
        train_params: Literal["adapter", "all"] = "adapter",
        vocab_size: int | None = None,
    ) -> None:
        if not 0 <= agent < len(team.agent_names):
            raise AlignError(f"agent {agent} out of range: the team trains workers {list(team.agent_names)}")
        if train_params not in ("adapter", "all"):
            raise AlignError(f"train_params must be adapter|all, got {train_params!r}")
        if train_params == "all" and team.cfg.shared_base and len(team.agent_names) > 1:
            raise AlignError(
                f"train_params='all' would move the base that workers {list(team.agent_names)} share; "
                "use a one-worker team (the newcomer) or train the adapter"
            )
        self.team, self.agent, self.train_params = team, agent, train_params
        if vocab_size is None:
            tokenizer = team.backend_of(agent).tokenizer
            vocab_size = len(tokenizer) if tokenizer is not None else team.vocab_size_of(agent)
        self.vocab_size = int(vocab_size)

    @property
    def name(self) -> str:
        """Model id and adapter, for reports."""
        return f"{self.team.backend_of(self.agent).model_id}+lora:{self.team.agent_names[self.agent]}"

    def logits(self, probes: LLMProbes) -> Tensor:
        turns = list(probes.turns)
        packed = torch.cat(
            [chunk[valid] for chunk, _, valid in self.team.turn_logits(self.agent, turns)]
        )  # (Σ L_n, V_model), turn order then token order
        if packed.shape[-1] < self.vocab_size:
            raise AlignError(f"{self.name} has {packed.shape[-1]} output logits < the tokenizer's {self.vocab_size}")
        packed = packed[:, : self.vocab_size]
        flat = torch.zeros(probes.size * probes.width, self.vocab_size, device=packed.device, dtype=packed.dtype)
        return flat.index_put((probes.positions().to(packed.device),), packed).view(
            probes.size, probes.width, self.vocab_size
        )

    def parameters(self) -> list[torch.nn.Parameter]:
        if self.train_params == "adapter":
            return list(self.team.parameters(self.agent))
        return list(self.team.model_of(self.agent).parameters())


def token_stats(
    policy: LLMWorkerPolicy, probes: LLMProbes, *, reference_argmax: Tensor | None = None, chunk: int = 16
) -> Metrics:
    """No-grad statistics of ``policy`` on ``probes`` (token means over the mask):

    * ``probe/nll_sampled`` = −(1/Σ L) Σ log π(y_n,u | ·): cross-entropy of the incumbent's sampled ids;
    * ``probe/argmax_agreement`` = share of positions where argmax π = ``reference_argmax`` (N, T) (if given).
    """
    nll = agree = 0.0
    with torch.no_grad():
        for start in range(0, probes.size, chunk):
            mb = probes.select(torch.arange(start, min(start + chunk, probes.size)))
            logp = torch.log_softmax(policy.logits(mb).double(), dim=-1)  # (n, T, V)
            mask, ids = mb.mask, mb.token_ids()
            nll -= float(logp.gather(-1, ids.unsqueeze(-1)).squeeze(-1)[mask].sum())
            if reference_argmax is not None:
                ref = reference_argmax[start : start + mb.size].to(logp.device)
                agree += float((logp.argmax(-1) == ref)[mask].sum())
    tokens = max(probes.num_tokens, 1)
    out: Metrics = {"probe/nll_sampled": nll / tokens}
    if reference_argmax is not None:
        out["probe/argmax_agreement"] = agree / tokens
    return out


def argmax_of(policy: LLMWorkerPolicy, probes: LLMProbes, chunk: int = 16) -> Tensor:
    """(N, T) long argmax_v π(v | ·) at every column (meaningful on the mask)."""
    out = []
    with torch.no_grad():
        for start in range(0, probes.size, chunk):
            out.append(policy.logits(probes.select(torch.arange(start, min(start + chunk, probes.size)))).argmax(-1))
    return torch.cat(out)


# ----------------------------------------------------------------------------------------------------------------
# adapters as peft folders


def read_adapter_settings(folder: str | Path, what: str = "adapter") -> dict[str, Any]:
    """The LoRA layout of a peft adapter folder as LLMTeamConfig fields: ``lora_r``, ``lora_alpha``,
    ``lora_dropout``, ``lora_targets`` (AlignError naming ``what`` if it is no peft LoRA folder)."""
    path = Path(folder)
    if not path.is_dir():
        raise AlignError(
            f"{what} {str(path)!r}: no such folder (expected a peft adapter folder, e.g. RUN/adapters/WORKER)"
        )
    config = path / "adapter_config.json"
    if not config.is_file():
        raise AlignError(f"{what} {str(path)!r} is not a peft adapter folder (no adapter_config.json)")
    try:
        raw = json.loads(config.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise AlignError(f"{what} {str(config)!r}: not valid JSON: {e}") from e
    if raw.get("peft_type") != "LORA":
        raise AlignError(f"{what} {str(path)!r}: a {raw.get('peft_type')!r} adapter, expected LORA")
    targets = raw.get("target_modules") or []
    targets = [targets] if isinstance(targets, str) else list(targets)
    return {
        "lora_r": int(raw["r"]),
        "lora_alpha": int(raw["lora_alpha"]),
        "lora_dropout": float(raw.get("lora_dropout") or 0.0),
        "lora_targets": tuple(sorted(targets)),
    }


def with_adapter_settings(cfg: LLMTeamConfig, folder: str | Path | None, what: str = "adapter") -> LLMTeamConfig:
    """``cfg`` with its LoRA layout taken from the peft folder ``folder`` (unchanged if None)."""
    if folder is None:
        return cfg
    return dataclasses.replace(cfg, **read_adapter_settings(folder, what))


def load_adapter_folder(team: LLMTeam, agent: int, folder: str | Path, what: str = "adapter") -> None:
    """Copy the LoRA weights of a peft folder (``LLMTeam.save_adapters`` / ``orchestra finetune``'s
    ``RUN/adapters/WORKER``) into trainable worker ``agent``'s adapter. The layout (r, alpha, target modules) and
    every weight name and shape must match (AlignError otherwise)."""
    from peft.utils import load_peft_weights

    settings = read_adapter_settings(folder, what)
    cfg = team.cfg
    mine = {"lora_r": cfg.lora_r, "lora_alpha": cfg.lora_alpha, "lora_targets": tuple(sorted(cfg.lora_targets))}
    differ = {k: (v, settings[k]) for k, v in mine.items() if settings[k] != v}
    if differ:
        raise AlignError(f"{what} {str(folder)!r}: LoRA layout differs from the team's (team vs folder: {differ})")
    name = team.agent_names[agent]
    saved = load_peft_weights(str(folder), device=str(team.device))
    params = team.named_parameters(agent)
    by_saved = {k.replace(f".{name}.", "."): k for k in params}  # peft saves without the adapter name
    if set(saved) != set(by_saved):
        missing, extra = sorted(set(by_saved) - set(saved)), sorted(set(saved) - set(by_saved))
        raise AlignError(
            f"{what} {str(folder)!r} does not fit worker {name!r}'s adapter: {len(missing)} weights missing "
            f"(e.g. {missing[:2]}), {len(extra)} unexpected (e.g. {extra[:2]})"
        )
    state = {}
    for k, v in saved.items():
        target = params[by_saved[k]]
        if tuple(v.shape) != tuple(target.shape):
            raise AlignError(
                f"{what} {str(folder)!r}: {k} has shape {tuple(v.shape)}, the adapter {tuple(target.shape)}"
            )
        state[by_saved[k]] = v.to(device=target.device, dtype=target.dtype)
    team.load_state(agent, state)


def _finetune_base_seed(folder: Path, worker: str) -> tuple[str, int, dict[str, Any]] | None:
    """(model, base seed, tiny) of the ``orchestra finetune`` run a ``RUN/adapters/WORKER`` folder belongs to."""
    config = folder.parent.parent / "config.json"
    try:
        team = json.loads(config.read_text(encoding="utf-8"))["team"]
        workers = list(team["workers"])
        models = list(team.get("worker_models") or [])
        i = workers.index(worker)
        model = models[i] if models else team["model"]
        seed = int(team["seed"]) + (0 if team.get("shared_base", True) else i)
        return str(model), seed, dict(team.get("tiny") or {})
    except (OSError, ValueError, KeyError, TypeError):
        return None


# ----------------------------------------------------------------------------------------------------------------
# the swap


@dataclass(frozen=True)
class LLMSwapConfig:
    """What is swapped in an LLM team, and the newcomer built for it."""

    worker: str = "solver"  # the swapped worker (one of the team's trainable workers)
    incumbent_adapter: str | None = None  # peft folder of the incumbent's adapter (RUN/adapters/WORKER); None = fresh
    newcomer: str = "smollm2"  # newcomer base: alias, .gguf, local HF folder, or "tiny" (random Llama, tests)
    newcomer_seed: int | None = None  # its tiny-base and LoRA init seed; None = derived from the team's seed
    newcomer_adapter: str | None = None  # peft folder to start the newcomer's adapter from; None = fresh LoRA (B = 0)
    newcomer_tiny: TinyModelConfig | None = None  # size of a tiny newcomer; None = the team's ``tiny``
    train_params: Literal["adapter", "all"] = "adapter"  # alignment trains the newcomer's LoRA, or all its weights
    cache_limit_mb: float = 2048.0  # cache incumbent (N, T, V) float32 logits if both probe sets fit, else recompute

    def __post_init__(self) -> None:
        if self.train_params not in ("adapter", "all"):
            raise AlignError(f"train_params must be adapter|all, got {self.train_params!r}")
        if not self.cache_limit_mb >= 0:
            raise AlignError(f"cache_limit_mb must be ≥ 0, got {self.cache_limit_mb}")


def _agent(team_cfg: LLMTeamConfig, worker: str) -> int:
    if worker not in team_cfg.workers:
        raise AlignError(f"worker {worker!r} is not a trainable worker of this team config ({list(team_cfg.workers)})")
    return team_cfg.workers.index(worker)


def incumbent_team_config(team_cfg: LLMTeamConfig, swap: LLMSwapConfig) -> LLMTeamConfig:
    """The incumbent team's config: ``team_cfg`` with the LoRA layout of ``swap.incumbent_adapter`` (if given).
    A ``RUN/adapters/WORKER`` folder of an ``orchestra finetune`` run must come from the same base (for ``tiny``:
    the same seed and size), else AlignError."""
    agent = _agent(team_cfg, swap.worker)
    cfg = with_adapter_settings(team_cfg, swap.incumbent_adapter, "--incumbent-adapter")
    if swap.incumbent_adapter is not None:
        run = _finetune_base_seed(Path(swap.incumbent_adapter), swap.worker)
        model = cfg.model_of(agent)
        seed = cfg.seed + (0 if cfg.shared_base else agent)
        if run is not None and (
            run[0] != model or (model == TINY and (run[1] != seed or run[2] != dataclasses.asdict(cfg.tiny)))
        ):
            raise AlignError(
                f"--incumbent-adapter {swap.incumbent_adapter!r} was trained on base {run[0]!r} (seed {run[1]}, "
                f"tiny {run[2]}) but the team's worker {swap.worker!r} runs {model!r} (seed {seed}): pass the "
                "finetune run's --model and --seed"
            )
    return cfg


def newcomer_config(team_cfg: LLMTeamConfig, swap: LLMSwapConfig) -> LLMTeamConfig:
    """A one-worker team config for the newcomer: base ``swap.newcomer`` (tiny size ``newcomer_tiny`` or the team's),
    one LoRA adapter named after the worker (layout of ``newcomer_adapter`` if given, else the team's), init seed
    ``newcomer_seed`` (default derived ≠ the team's); no held-out tasks, frozen workers = its base (never used)."""
    agent = _agent(team_cfg, swap.worker)
    seed = swap.newcomer_seed
    if seed is None:
        seed = derive_seed(team_cfg.seed, agent, 11, bits=31)
    tiny = swap.newcomer_tiny or team_cfg.tiny
    inc_seed = team_cfg.seed + (0 if team_cfg.shared_base else agent)
    if (
        swap.newcomer == TINY
        and team_cfg.model_of(agent) == TINY
        and seed == inc_seed
        and tiny == team_cfg.tiny
        and swap.newcomer_adapter is None
        and swap.incumbent_adapter is None
    ):
        raise AlignError(
            f"newcomer seed {seed} equals the incumbent's tiny base seed and neither has an adapter: the newcomer "
            "would be the incumbent (pass another --newcomer-seed)"
        )
    cfg = dataclasses.replace(
        team_cfg,
        model=swap.newcomer,
        worker_models=(),
        tiny=tiny,
        workers=(swap.worker,),
        shared_base=True,
        frozen_workers="base",
        eval_tasks=0,
        has_logits=False,
        seed=seed,
    )
    return with_adapter_settings(cfg, swap.newcomer_adapter, "--newcomer-adapter")


def check_newcomer_tokenizer(team_cfg: LLMTeamConfig, swap: LLMSwapConfig) -> None:
    """:func:`~orchestra.teamtr.align.check_tokenizer_family` of the newcomer's tokenizer against the incumbent's,
    before any model is loaded (AlignError naming both models)."""
    inc_model = team_cfg.model_of(_agent(team_cfg, swap.worker))
    check_tokenizer_family(
        load_tokenizer(inc_model),
        load_tokenizer(swap.newcomer),
        incumbent_name=f"{inc_model!r} (worker {swap.worker!r})",
        newcomer_name=repr(swap.newcomer),
    )


def build_incumbent_team(
    team_cfg: LLMTeamConfig, swap: LLMSwapConfig, *, log: Callable[[str], None] | None = None
) -> LLMTeam:
    """The team with worker ``swap.worker`` served by the incumbent: :func:`incumbent_team_config`, then the adapter
    of ``swap.incumbent_adapter`` loaded (else its fresh adapter: B = 0, i.e. the base model)."""
    cfg = incumbent_team_config(team_cfg, swap)
    team = LLMTeam(cfg, log=log)
    if swap.incumbent_adapter is not None:
        load_adapter_folder(team, _agent(cfg, swap.worker), swap.incumbent_adapter, "--incumbent-adapter")
    return team


def build_llm_newcomer(
    team_cfg: LLMTeamConfig, swap: LLMSwapConfig, *, log: Callable[[str], None] | None = None
) -> LLMTeam:
    """The newcomer as a one-worker :class:`LLMTeam` (:func:`newcomer_config`; adapter = the worker's name), after
    :func:`check_newcomer_tokenizer`; its adapter starts from ``swap.newcomer_adapter`` if given."""
    check_newcomer_tokenizer(team_cfg, swap)
    newcomer = LLMTeam(newcomer_config(team_cfg, swap), log=log)
    if swap.newcomer_adapter is not None:
        load_adapter_folder(newcomer, 0, swap.newcomer_adapter, "--newcomer-adapter")
    return newcomer


def _bytes(probes: LLMProbes, vocab: int) -> int:
    return probes.size * probes.width * vocab * 4


def llm_swap_shock(
    team: LLMTeam,
    swap: LLMSwapConfig,
    cfg: AlignConfig,
    *,
    newcomer: LLMTeam | None = None,
    on_check: Callable[[Metrics], None] | None = None,
    log: Callable[[str], None] | None = None,
) -> SwapShockReport:
    """Stage 0 in an LLM team: harvest probes at ``swap.worker``'s turns from the current team (``num_train_probes``
    and ``num_heldout_probes`` EPISODES, independent generator streams), swap in ``newcomer`` (default
    :func:`build_llm_newcomer`; worker 0 of that one-worker team), align it (:func:`~orchestra.teamtr.align.align`
    on :class:`LLMWorkerPolicy`), and report J before / direct / aligned (``team.exact_success()`` with the worker
    served by the incumbent, the unaligned and the aligned newcomer: needs ``eval_tasks`` ≥ 1). Diagnostics before
    and after: ``probe/nll_sampled`` and ``probe/argmax_agreement`` with the incumbent on the held-out probes.
    ``cfg.cache_incumbent`` is turned off when the two probe sets' (N, T, V) float32 logits exceed
    ``swap.cache_limit_mb``. The team is not modified (checked). The newcomer is trained in place."""
    say = log or (lambda _line: None)
    agent = _agent(team.cfg, swap.worker)
    if not team.eval_tasks:
        raise AlignError("team success needs held-out tasks: build the team with eval_tasks ≥ 1")
    if newcomer is None:
        newcomer = build_llm_newcomer(team.cfg, swap, log=log)
    check_tokenizer_family(
        team.backend_of(agent).tokenizer,
        newcomer.backend_of(0).tokenizer,
        incumbent_name=f"{team.backend_of(agent).model_id!r} (worker {swap.worker!r})",
        newcomer_name=repr(newcomer.backend_of(0).model_id),
    )
    if newcomer.cfg.temperature != team.cfg.temperature:
        raise AlignError(
            f"newcomer temperature {newcomer.cfg.temperature} ≠ the team's {team.cfg.temperature}: the KL compares "
            "the sampling distributions softmax(z / temperature)"
        )
    incumbent = LLMWorkerPolicy(team, agent)
    new_policy = LLMWorkerPolicy(newcomer, 0, swap.train_params, vocab_size=incumbent.vocab_size)

    say(
        f"align llm: harvesting probes at {swap.worker}'s turns ({cfg.num_train_probes} + {cfg.num_heldout_probes} episodes)"
    )
    train_probes, train_batch = _harvest(team, agent, cfg.num_train_probes, seeded_generator(cfg.seed, 0))
    heldout_probes, held_batch = _harvest(team, agent, cfg.num_heldout_probes, seeded_generator(cfg.seed, 1))
    cache_mb = (_bytes(train_probes, incumbent.vocab_size) + _bytes(heldout_probes, incumbent.vocab_size)) / 2**20
    if cfg.cache_incumbent and cache_mb > swap.cache_limit_mb:
        cfg = dataclasses.replace(cfg, cache_incumbent=False)
    say(
        f"align llm: {train_probes.size} train turns ({train_probes.num_tokens} tokens, T = {train_probes.width}), "
        f"{heldout_probes.size} held-out turns; incumbent logits "
        + (f"cached ({cache_mb:.0f} MB)" if cfg.cache_incumbent else f"recomputed ({cache_mb:.0f} MB > limit)")
    )
    chunk = team.cfg.forward_batch_size
    inc_argmax = argmax_of(incumbent, heldout_probes, chunk)
    inc_stats = token_stats(incumbent, heldout_probes, chunk=chunk)
    new_backend = newcomer.backend_of(0)
    served_backend = TransformersBackend.from_model(
        new_backend.model, new_backend.tokenizer, new_backend.model_id, team.cfg.max_batch_size, team.cfg.seed
    )  # the team's sampling salt: both swaps decode like the incumbent's worker

    def success(policy: AlignPolicy[LLMProbes]) -> float:
        if policy is incumbent:
            j = team.exact_success()
        else:
            with team.serving(agent, served_backend, newcomer.agent_names[0]):
                j = team.exact_success()
        assert j is not None
        return float(j)

    def diagnostics(policy: AlignPolicy[LLMProbes]) -> Metrics:
        assert isinstance(policy, LLMWorkerPolicy)
        return token_stats(policy, heldout_probes, reference_argmax=inc_argmax, chunk=chunk)

    meta: dict[str, Any] = {
        "team": team.spec.name,
        "conductor": team.cfg.conductor,
        "worker": swap.worker,
        "incumbent": team.backend_of(agent).model_id,
        "incumbent_adapter": swap.incumbent_adapter or "fresh (= the base)",
        "newcomer": newcomer.backend_of(0).model_id,
        "newcomer_seed": newcomer.cfg.seed,
        "newcomer_adapter": swap.newcomer_adapter or "fresh",
        "train_params": swap.train_params,
        "num_trainable": sum(p.numel() for p in new_policy.parameters()),
        "temperature": team.cfg.temperature,
        "vocab_size": incumbent.vocab_size,
        "eval_tasks": len(team.eval_tasks),
        "probe_episodes": f"{cfg.num_train_probes} train + {cfg.num_heldout_probes} held-out",
        "num_train_probes": train_probes.size,
        "num_heldout_probes": heldout_probes.size,
        "train_tokens": train_probes.num_tokens,
        "heldout_tokens": heldout_probes.num_tokens,
        "probe_width": max(train_probes.width, heldout_probes.width),
        "probe_rollout_success": sum(e.success for b in (train_batch, held_batch) for e in b.episodes)
        / (train_batch.batch_size + held_batch.batch_size),  # the sampled (temperature) team's success
        "incumbent_cache": f"{cache_mb:.1f} MB" if cfg.cache_incumbent else "off (recomputed)",
        "incumbent_nll_sampled": inc_stats["probe/nll_sampled"],
    }
    report = swap_shock(
        incumbent,
        new_policy,
        train_probes,
        heldout_probes,
        cfg,
        success=success,
        diagnostics=diagnostics,
        on_check=on_check,
        meta=meta,
        incumbent_state=lambda: team.state(agent),
    )
    if not math.isfinite(report.align.kl_heldout_after):
        raise RuntimeError("alignment diverged: the held-out KL is not finite (lower --lr)")
    return report


__all__ = [
    "LLMProbes",
    "LLMSwapConfig",
    "LLMWorkerPolicy",
    "argmax_of",
    "build_incumbent_team",
    "build_llm_newcomer",
    "check_newcomer_tokenizer",
    "harvest_llm_probes",
    "incumbent_team_config",
    "llm_swap_shock",
    "load_adapter_folder",
    "newcomer_config",
    "read_adapter_settings",
    "token_stats",
    "with_adapter_settings",
]
