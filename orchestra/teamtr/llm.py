"""A team of real LLM workers as a :class:`~orchestra.teamtr.protocols.TrainableTeam` (docs/architecture.md §5, issue 4 part 1).

The SAME trainer (:func:`orchestra.teamtr.trainer.train`) that runs the telephone chain fine-tunes the workers of a
team file (``orchestra/teams/arithmetic.yaml``…) under a FIXED conductor, every knob in one
:class:`~orchestra.teamtr.llm_config.LLMTeamConfig`:

* **models**: by default ONE frozen base shared by every trainable worker, with ONE peft LoRA adapter per trainable
  worker (named after the worker) on one ``PeftModel``; ``shared_base=False`` gives each its own base (heterogeneous
  teams: ``worker_models``). The base is the embedded SmolLM2 GGUF (``from_pretrained(folder, gguf_file=...)``,
  dequantised to ``dtype``) or any model :func:`~orchestra.backends.models.resolve_model` accepts, or ``"tiny"``: a
  random-init Llama with the SmolLM2 tokenizer (unit tests). Base weights are frozen; only the adapters train.
* **rollouts**: episodes of the team's ``TeamEnv`` through the phase-1 :class:`~orchestra.runtime.rollout.RolloutEngine`;
  trainable workers are served by a :class:`~orchestra.backends.hf.TransformersBackend` with their adapter selected,
  sampling at ``temperature`` > 0 (the team file's greedy generation is overridden for them); tools and frozen LLM
  workers act as usual. A batch of B episodes is B / G tasks of the family's TRAIN split, each run G times with
  different seeds (GRPO groups: ``group_ids`` = task index). All randomness comes from the generator passed to
  :meth:`LLMTeam.sample`, so CPU runs repeat exactly. Reward = the episode's team return (or its success).
* **exact tokens, per-turn samples** (``docs/algorithms.md`` §4.5 layout (a)): every turn of a trainable worker
  is recorded as (episode row, agent, prompt token ids exactly as fed to the model, sampled token ids, behaviour
  log-probs). Nothing is ever re-tokenised: the training forward feeds ``prompt_ids + token_ids`` through the model
  with the agent's adapter active (teacher forcing). Other workers' messages and tool outputs are only context
  (inside the prompt ids); the own-token mask selects the agent's sampled tokens only.

Trainer layout (agent-major, :class:`LLMRollout`): ``mask``/``behaviour_logprobs`` are (n, B, T), n = trainable
workers, B = episodes, T = the longest concatenation of one agent's own tokens in one episode. Agent i's row b holds
ITS turns of episode b one after the other (turn 1's tokens, then turn 2's…), left-aligned, the rest masked off. An
episode's sum over the row is the agent's sequence log-probability (HAPPO factors, the joint ratio).

The policy being trained is the SAMPLING distribution: π_i(y | s) = softmax(z / temperature) — what the backend's
behaviour log-probs are (``orchestra.backends.sampling``). Logprobs and logits returned here are of z / temperature,
so behaviour log-probs equal the current ones right after sampling (fp32 CPU: |Δ| ≲ 1e-4, the decode path uses a KV
cache and another padding, so only rounding differs; bf16: mean 1e-2, 4e-2 with ``upcast="none"``). ``top_p`` < 1
samples from a truncated distribution the trainer does not model: its behaviour log-probs then differ (logged as
``behaviour_gap``).

Low precision (docs/algorithms.md §2.4). With a bfloat16 base, peft keeps the adapters in float32
(``autocast_adapter_dtype``), so Adam updates are not rounded; but every change of an adapter re-rolls the roundings
of the bf16 forward, so the trust region's k3 KL of a zero step reads 1.8e-3 nats per token on SmolLM2 (CPU, 256
tokens), and peft's bf16 sum of base and adapter outputs swallows adapter contributions under half an ulp. Hence
``LLMTeamConfig.upcast`` (default ``residual``): the final norm, the output head (an fp32 copy of the tied one), the
residual stream and every matmul's output compute in float32, weights and matmuls staying in bf16 — floor 2.7e-4, and
the model itself is changed, so sampling and training forwards agree. The trust region measures the floor that
remains once per update and accepts KL ≤ δ + floor (``TeamTRConfig.kl_floor``, :attr:`LLMTeam.reduced_precision`).

GPU configuration (``orchestra/teamtr/configs/smollm2_gpu.yaml``): ``dtype: bfloat16, device: cuda``, 64 episodes per
batch (8 tasks × G = 8), ``max_tokens: 128``, decode/forward batches of 64/32 rows, 64 held-out evaluation tasks.
CPU cost of a stage, phase by phase and against this machine's matmul roofline: ``benchmarks/finetune.py``. Levers in
place: identical prompts (a group's G samples) are prefilled once when sampling and run once in training forwards
(``share_prompts``); no observation encoder under a rule-based conductor; one logits forward for the end-of-update
diagnostics; ``TeamTRConfig.old_logprobs="behaviour"`` skips the π_cur forward.
"""

from __future__ import annotations

import dataclasses
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from envs.tasks.base import TaskFamily
from orchestra.backends import make_backend
from orchestra.backends.base import Backend, GenerationParams
from orchestra.backends.hf import TransformersBackend
from orchestra.backends.http import OpenAIHTTPBackend
from orchestra.backends.models import resolve_model
from orchestra.runtime.conductors import conductor_factory, split_spec
from orchestra.runtime.rollout import EpisodeJob, RolloutEngine, episode_seed, require_no_faults
from orchestra.runtime.session import resolve_family
from orchestra.runtime.team_file import TeamSpec, load_team
from orchestra.runtime.workers import Worker
from orchestra.teamtr.config import derive_seed
from orchestra.teamtr.llm_config import LLMTeamConfig, LLMTeamError
from orchestra.teamtr.llm_models import TINY, load_base, save_adapter, with_adapters
from orchestra.teamtr.llm_rollout import (
    AdapterBackend,
    EmptyBackend,
    LLMRollout,
    Recorder,
    Turn,
    by_length,
    check_turns,
)
from orchestra.teamtr.llm_sampler import ServerSampler
from orchestra.teamtr.protocols import base_parameters_of, load_snapshot, snapshot
from trajectories import Episode

# ----------------------------------------------------------------------------------------------------------------
# the team


class LLMTeam:
    """The workers of a team file as a ``TrainableTeam[LLMRollout]`` (module docstring); ``log`` gets progress lines.

    Construction checks the settings BEFORE loading any model: unknown worker, a tool named as trainable, a missing
    conductor checkpoint or model path fail at once with a message naming them.
    """

    def __init__(self, cfg: LLMTeamConfig, *, log: Callable[[str], None] | None = None) -> None:
        self.cfg, self._log = cfg, log
        self.spec, self.family = _load_team(cfg)
        label, checkpoint = split_spec(cfg.conductor)
        if checkpoint is not None and not Path(checkpoint).is_dir():
            raise LLMTeamError(f"conductor {cfg.conductor!r}: checkpoint folder {checkpoint!r} does not exist")
        self.conductor_factory = conductor_factory(cfg.conductor, self.spec, cfg.seed)
        self._conductor_ref = (label, checkpoint)
        for spec in {cfg.model_of(i) for i in range(len(cfg.workers))} - {TINY}:
            resolve_model(spec)  # a bad model path fails here, before anything loads
        self.recorder = Recorder()
        t0 = time.perf_counter()
        self.models: list[Any] = []  # one PeftModel (shared base) or one per agent
        self.backends: list[TransformersBackend] = []
        if cfg.shared_base:
            base, tok, model_id = load_base(cfg.model, cfg, cfg.seed)
            self.models.append(with_adapters(base, cfg, cfg.workers, cfg.seed))
            self.backends.append(
                TransformersBackend.from_model(self.models[0], tok, model_id, cfg.max_batch_size, cfg.seed)
            )
        else:
            for i, name in enumerate(cfg.workers):
                base, tok, model_id = load_base(cfg.model_of(i), cfg, cfg.seed + i)
                self.models.append(with_adapters(base, cfg, [name], cfg.seed + i))
                self.backends.append(
                    TransformersBackend.from_model(self.models[i], tok, model_id, cfg.max_batch_size, cfg.seed)
                )
        self._say(f"loaded {self.backends[0].model_id} ({cfg.dtype}, {cfg.device}) in {time.perf_counter() - t0:.1f} s")
        self._params = [
            [p for k, p in self.model_of(i).named_parameters() if f".{name}." in k]
            for i, name in enumerate(cfg.workers)
        ]
        self._frozen_backends: dict[str, Backend] = {}  # frozen_workers="team": team-file backends, built once
        self.sampler = (  # cfg.sampler_url: the server trainable workers sample on
            ServerSampler(
                cfg.sampler_url, cfg.sampler_model or cfg.model, cfg.sampler_adapter_dir, cfg.sampler_concurrency
            )
            if cfg.sampler_url is not None
            else None
        )
        self.workers = self._workers(cfg.temperature)
        self.eval_workers = self._workers(cfg.eval_temperature)
        self.engine = self._engine(self.workers, "teamtr")
        self.eval_engine = self._engine(self.eval_workers, "teamtr-eval")
        self.eval_tasks = (
            self.family.generate("test", cfg.eval_tasks, cfg.seed, cfg.difficulty) if cfg.eval_tasks else []
        )
        self.last_sample_seconds = 0.0

    # -- construction helpers ---------------------------------------------------------------------------------
    def _say(self, line: str) -> None:
        if self._log is not None:
            self._log(line)

    def _workers(self, temperature: float) -> dict[str, Worker]:
        cfg, spec = self.cfg, self.spec
        tools = self.family.tools()
        tool_backend: Backend | None = None
        frozen = self._frozen_backends
        out: dict[str, Worker] = {}
        for ws in spec.env.workers:
            rt = spec.workers[ws.name]
            if ws.name in cfg.workers:
                i = cfg.workers.index(ws.name)
                params = GenerationParams(
                    max_tokens=cfg.max_tokens, temperature=temperature, top_p=cfg.top_p, stop=rt.generation.stop
                )
                backend: Backend = AdapterBackend(self.backend_of(i), ws.name, i, self.recorder, self._server)
                out[ws.name] = Worker(ws.name, "llm", backend, params, ws.prompt_version)
            elif rt.kind == "tool":
                if rt.tool not in tools:
                    raise LLMTeamError(
                        f"{spec.path}: worker {ws.name!r}: tool {rt.tool!r} is not one of {sorted(tools)}"
                    )
                tool_backend = tool_backend or make_backend({"type": "tool", "tools": dict(tools)})
                out[ws.name] = Worker(ws.name, "tool", tool_backend, rt.generation, ws.prompt_version, rt.tool)
            else:
                assert rt.backend is not None
                if cfg.frozen_workers == "base":
                    # the base with every adapter disabled (context has no adapter), here or on the sampling server
                    backend = self._server or self.backends[0]
                else:
                    if rt.backend not in frozen:
                        frozen[rt.backend] = make_backend(dict(spec.backends[rt.backend]))
                    backend = frozen[rt.backend]
                out[ws.name] = Worker(ws.name, "llm", backend, rt.generation, ws.prompt_version)
        return out

    def _engine(self, workers: dict[str, Worker], run_id: str) -> RolloutEngine:
        label, checkpoint = self._conductor_ref
        return RolloutEngine(
            self.spec,
            self.family,
            workers,
            self.conductor_factory,
            conductor_name=label,
            conductor_checkpoint=checkpoint,
            run_id=run_id,
            num_envs=self.cfg.num_envs,
            progress=False,
        )

    # -- layout -------------------------------------------------------------------------------------------------
    @property
    def config(self) -> LLMTeamConfig:
        """``ConfiguredTeam``: written into run directories and checked on resume."""
        return self.cfg

    @property
    def agent_names(self) -> tuple[str, ...]:
        return self.cfg.workers

    @property
    def has_logits(self) -> bool:
        return self.cfg.has_logits

    @property
    def reduced_precision(self) -> bool:
        """A bfloat16 / float16 base: the trust region measures the KL estimate's rounding floor (module docstring)."""
        return self.cfg.dtype != "float32"

    @property
    def device(self) -> torch.device:
        return torch.device(self.cfg.device)

    def model_of(self, agent: int) -> Any:
        """The PeftModel holding ``agent``'s adapter."""
        return self.models[0] if self.cfg.shared_base else self.models[agent]

    def backend_of(self, agent: int) -> TransformersBackend:
        return self.backends[0] if self.cfg.shared_base else self.backends[agent]

    # -- sampling -----------------------------------------------------------------------------------------------
    @property
    def _server(self) -> OpenAIHTTPBackend | None:
        return self.sampler.http if self.sampler is not None else None

    def publish(self) -> dict[str, str]:
        """With a sampling server: every trainable worker's current adapter loaded into it (a version it holds is not
        sent again); called before every batch and held-out evaluation. {worker: served name}; {} without one."""
        return self.sampler.publish(self.save_adapters) if self.sampler is not None else {}

    def sample(self, batch_size: int, generator: torch.Generator) -> LLMRollout:
        """``batch_size`` fresh episodes: batch_size / G train tasks × G seeds, all drawn from ``generator``."""
        self.publish()
        g_size = self.cfg.group_size
        if batch_size % g_size:
            raise LLMTeamError(f"batch_size {batch_size} is not a multiple of group_size G = {g_size}")
        t0 = time.perf_counter()
        task_seed = int(torch.randint(2**31 - 1, (1,), generator=generator))
        tasks = self.family.generate("train", batch_size // g_size, task_seed, self.cfg.difficulty)
        seeds = torch.randint(2**31 - 1, (batch_size,), generator=generator).tolist()
        # one Task object per episode: a turn is matched to its episode row by the identity of its task
        jobs = [
            EpisodeJob(f"teamtr-{row:05d}", dataclasses.replace(tasks[row // g_size]), int(seed))
            for row, seed in enumerate(seeds)
        ]
        self.recorder.rows, self.recorder.turns = {id(j.task): row for row, j in enumerate(jobs)}, []
        try:
            done = require_no_faults(self.engine.run(jobs), "a training batch")
            turns = self.recorder.turns
        finally:
            self.recorder.rows, self.recorder.turns = None, []
        row_of = {j.episode_id: row for row, j in enumerate(jobs)}
        episodes: list[Episode | None] = [None] * batch_size
        for ep in done:
            episodes[row_of[ep.episode_id]] = ep
        eps = [e for e in episodes if e is not None]
        if len(eps) != batch_size:
            raise RuntimeError(f"the rollout engine returned {len(eps)} of {batch_size} episodes")
        check_turns(turns, eps, self.cfg.workers)
        rewards = [e.return_ if self.cfg.reward == "return" else float(e.success) for e in eps]
        batch = LLMRollout.build(
            turns,
            eps,
            torch.tensor(rewards, dtype=torch.float32, device=self.device),
            torch.tensor([row // g_size for row in range(batch_size)], device=self.device),
            len(self.cfg.workers),
        )
        self.last_sample_seconds = time.perf_counter() - t0
        per_agent = ", ".join(f"{n} {len(batch.turns_of(i))} turns" for i, n in enumerate(self.agent_names))
        self._say(
            f"  sampled {batch_size} episodes ({len(tasks)} tasks × G={g_size}): reward {sum(rewards) / batch_size:.3f}, "
            f"success {sum(e.success for e in eps) / batch_size:.0%}, {batch.num_tokens} tokens, {per_agent}, "
            f"{self.last_sample_seconds:.1f} s"
        )
        return batch

    def exact_success(self) -> float | None:
        """Held-out team success: the mean verifier success of ``eval_tasks`` TEST-split tasks (fixed tasks and
        seeds; trainable workers at ``eval_temperature``, greedy by default). None when ``eval_tasks`` = 0."""
        if not self.eval_tasks:
            return None
        self.publish()
        jobs = [EpisodeJob(f"eval-{i:05d}", t, episode_seed(self.cfg.seed, i)) for i, t in enumerate(self.eval_tasks)]
        eps = require_no_faults(self.eval_engine.run(jobs), "a held-out evaluation")
        success = sum(e.success for e in eps) / len(eps)
        self._say(f"  held-out success {success:.1%} on {len(eps)} test tasks")
        return success

    @contextmanager
    def serving(self, agent: int, backend: TransformersBackend, adapter: str | None = None) -> Iterator[None]:
        """Inside the block, trainable worker ``agent`` is served by ``backend`` (with ``adapter``, default the
        worker's name) in both the sampling and the held-out engines, and its turns are still recorded; every other
        worker is unchanged, and the team's worker entries are restored on exit (Stage 0: a direct or aligned swap).
        The rollout engines hold ``workers`` / ``eval_workers`` by reference, so the swap reaches them."""
        name = self.agent_names[agent]
        saved = [(d, d[name]) for d in (self.workers, self.eval_workers)]
        served = AdapterBackend(backend, adapter or name, agent, self.recorder)
        try:
            for d, worker in saved:
                d[name] = dataclasses.replace(worker, backend=served)
            yield
        finally:
            for d, worker in saved:
                d[name] = worker

    # -- coalition values (credit assignment) --------------------------------------------------------------------
    def coalition_value(self, present: frozenset[int], null: str) -> float:
        """``CoalitionTeam``: the mean reward (``cfg.reward``) of ``credit_episodes`` fixed train-split episodes (the
        same tasks and seeds for every coalition: common random numbers) with the trainable workers outside
        ``present`` replaced by ``null`` — ``drop``: an empty message; ``reference``: the base model with every
        adapter off (the workers' policy before fine-tuning). Sampling as in training (temperature ``temperature``).
        ``uniform`` (a uniformly random message) has no meaning over a 49k-token vocabulary and is refused."""
        if null not in ("drop", "reference"):
            raise LLMTeamError(f"credit_null {null!r}: an LLM team offers drop or reference")
        n = self.cfg.credit_episodes
        tasks = self.family.generate("train", n, derive_seed(self.cfg.seed, 5), self.cfg.difficulty)
        jobs = [
            EpisodeJob(f"credit-{i:05d}", t, episode_seed(derive_seed(self.cfg.seed, 6), i))
            for i, t in enumerate(tasks)
        ]
        saved = dict(self.workers)
        try:
            for i, name in enumerate(self.agent_names):
                if i in present:
                    continue
                worker = self.workers[name]
                backend: Backend = EmptyBackend() if null == "drop" else self.backend_of(i)  # no adapter: the base
                self.workers[name] = dataclasses.replace(worker, backend=backend)
            eps = require_no_faults(self.engine.run(jobs), "a counterfactual evaluation")
        finally:
            self.workers.clear()
            self.workers.update(saved)
        return sum(e.return_ if self.cfg.reward == "return" else float(e.success) for e in eps) / len(eps)

    # -- teacher-forced log-probs -------------------------------------------------------------------------------
    def _select(self, agent: int) -> Any:
        """Activate ``agent``'s adapter (trainable; the others frozen by peft) in train mode (no dropout: LoRA dropout
        0 by default, Llama has none) and return its model."""
        model = self.model_of(agent)
        model.set_adapter(self.cfg.workers[agent])
        model.train()
        return model

    def turn_logits(self, agent: int, turns: Sequence[Turn]) -> Iterator[tuple[Tensor, Tensor, Tensor]]:
        """Per chunk of ``forward_batch_size`` turns: (logits (N, R, V) of z / temperature, targets (N, R), valid
        (N, R)); turn n's ids sit in the last L_n columns of its row, column c of the logits predicting column c.

        Turns that share their prompt (a GRPO group's G samples at the same turn) are computed with the prompt's
        forward done ONCE (:meth:`_shared_logits`: its KV cache, with grad, repeated per sample); the others as one
        left-padded batch of prompt + sampled ids (:meth:`_padded_logits`). Both give the same numbers."""
        model = self._select(agent)
        for start in range(0, len(turns), self.cfg.forward_batch_size):
            chunk = list(turns[start : start + self.cfg.forward_batch_size])
            groups: dict[tuple[int, ...], list[int]] = defaultdict(list)
            for n, t in enumerate(chunk):
                groups[t.prompt_ids].append(n)
            shared = [n for rows in groups.values() if len(rows) > 1 for n in rows] if self.cfg.share_prompts else []
            alone = sorted(set(range(len(chunk))) - set(shared))
            r_max = max(len(t.token_ids) for t in chunk)
            parts: list[tuple[list[int], Tensor]] = []
            if shared:
                parts.append((shared, self._shared_logits(model, agent, [chunk[n] for n in shared], r_max)))
            if alone:
                parts.append((alone, self._padded_logits(model, agent, [chunk[n] for n in alone], r_max)))
            order = [n for rows, _ in parts for n in rows]
            logits = torch.cat([lg for _, lg in parts]) if len(parts) > 1 else parts[0][1]
            logits = logits[torch.tensor([order.index(n) for n in range(len(chunk))], device=logits.device)]
            tgt = torch.zeros((len(chunk), r_max), dtype=torch.long)
            valid = torch.zeros((len(chunk), r_max), dtype=torch.bool)
            for n, t in enumerate(chunk):
                if t.token_ids:
                    tgt[n, r_max - len(t.token_ids) :] = torch.tensor(t.token_ids)
                    valid[n, r_max - len(t.token_ids) :] = True
            yield logits, tgt.to(self.device), valid.to(self.device)

    def _left_padded(self, seqs: Sequence[Sequence[int]], agent: int) -> tuple[Tensor, Tensor, Tensor]:
        """(ids, attention mask, position ids), each (N, W): ``seqs`` LEFT-padded to one width (positions =
        cumsum(mask) − 1, as in decoding), on the team's device."""
        width = max(len(q) for q in seqs)
        ids = torch.full((len(seqs), width), self.backend_of(agent).pad_id, dtype=torch.long)
        attn = torch.zeros((len(seqs), width), dtype=torch.long)
        for n, q in enumerate(seqs):
            ids[n, width - len(q) :] = torch.tensor(list(q))
            attn[n, width - len(q) :] = 1
        ids, attn = ids.to(self.device), attn.to(self.device)
        return ids, attn, (attn.cumsum(-1) - 1).clamp(min=0)

    def _padded_logits(self, model: Any, agent: int, chunk: Sequence[Turn], r_max: int) -> Tensor:
        """(N, r_max, V): prompt + sampled ids LEFT-padded (positions = cumsum(mask) − 1, as in decoding), so every
        turn's ids end at the last column; the last r_max + 1 positions' logits predict the last r_max columns."""
        ids, attn, pos = self._left_padded([t.prompt_ids + t.token_ids for t in chunk], agent)
        out = model(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=False, logits_to_keep=r_max + 1)
        return out.logits[:, :-1, :].float() / self.cfg.temperature

    def _shared_logits(self, model: Any, agent: int, chunk: Sequence[Turn], r_max: int) -> Tensor:
        """(N, r_max, V) for turns whose prompts repeat: each distinct prompt is run once (use_cache, with grad: the
        adapter acts on the prompt's keys and values too), its cache rows are repeated for its turns, and the
        sampled ids but the last are run on top (right-padded; causal attention keeps pads out of real positions).
        Logits are right-aligned as in :meth:`_padded_logits`."""
        from transformers import DynamicCache

        pad = self.backend_of(agent).pad_id
        first: dict[tuple[int, ...], int] = {}
        row_of = [first.setdefault(t.prompt_ids, len(first)) for t in chunk]
        ids, attn, pos = self._left_padded(list(first), agent)
        cache = DynamicCache(config=getattr(model, "config", None))
        cache_arg = self.backend_of(agent)._cache_arg
        out = model(
            input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=True, logits_to_keep=1, **{cache_arg: cache}
        )
        expand = torch.tensor(row_of, dtype=torch.long, device=self.device)
        head = out.logits[:, -1, :][expand]  # (N, V): predicts each turn's first sampled id
        cache.batch_select_indices(expand)
        lens = [len(t.token_ids) for t in chunk]
        rest = max(lens) - 1
        first_logits = head.float() / self.cfg.temperature
        if rest <= 0:
            cont = first_logits.new_zeros((len(chunk), 0, first_logits.shape[-1]))
        else:
            c_ids = torch.full((len(chunk), rest), pad, dtype=torch.long)
            c_attn = torch.zeros((len(chunk), rest), dtype=torch.long)
            for n, t in enumerate(chunk):
                if len(t.token_ids) > 1:
                    c_ids[n, : len(t.token_ids) - 1] = torch.tensor(t.token_ids[:-1])
                    c_attn[n, : len(t.token_ids) - 1] = 1
            c_ids, c_attn = c_ids.to(self.device), c_attn.to(self.device)
            full_attn = torch.cat([attn[expand], c_attn], dim=-1)
            c_pos = pos[expand][:, -1:] + 1 + torch.arange(rest, device=self.device)
            out2 = model(
                input_ids=c_ids, attention_mask=full_attn, position_ids=c_pos, use_cache=True, **{cache_arg: cache}
            )
            cont = out2.logits.float() / self.cfg.temperature  # (N, rest, V): column j predicts token j + 1
        vocab = first_logits.shape[-1]
        rows = []
        for n, length in enumerate(lens):
            own = torch.cat([first_logits[n : n + 1], cont[n, : max(length - 1, 0)]])[:length]  # (L_n, V)
            rows.append(torch.cat([own.new_zeros((r_max - length, vocab)), own]))
        return torch.stack(rows)

    def _positions(self, turns: Sequence[Turn], width: int) -> Tensor:
        """Flat (B·T) indices of the turns' sampled ids, in turn order then token order."""
        return torch.tensor(
            [t.row * width + t.offset + j for t in turns for j in range(len(t.token_ids))],
            dtype=torch.long,
            device=self.device,
        )

    def _anchor(self, agent: int) -> Tensor:
        """0 · Σ θ_agent: joins an output to the agent's parameters, so an agent with no tokens gets zero gradients."""
        return sum((p.sum() for p in self.parameters(agent)), torch.zeros((), device=self.device)) * 0.0

    def logprobs(self, agent: int, batch: LLMRollout) -> Tensor:
        """(B, T) log π_agent^θ(y_u | s_u) = log_softmax(z / temperature)[y_u] at the agent's own positions (0 off the
        mask), with grad through its adapter."""
        self._select(agent)
        b_size, width = batch.batch_size, batch.width
        turns = by_length(batch.turns_of(agent))
        flat = torch.zeros(b_size * width, device=self.device) + self._anchor(agent)
        if not turns:
            return flat.view(b_size, width)
        values = []
        for logits, tgt, valid in self.turn_logits(agent, turns):
            logp = logits.gather(-1, tgt.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)  # (N, R)
            values.append(logp[valid])
        return flat.index_put((self._positions(turns, width),), torch.cat(values)).view(b_size, width)

    def logits(self, agent: int, batch: LLMRollout) -> Tensor:
        """(B, T, V) current z / temperature at the agent's own positions (0 elsewhere), with grad. Needs
        ``has_logits`` (B·T·V floats: memory-hungry at V = 49152)."""
        if not self.cfg.has_logits:
            raise LLMTeamError("logits() needs has_logits=True (exact-vocabulary KL)")
        self._select(agent)
        b_size, width = batch.batch_size, batch.width
        turns = by_length(batch.turns_of(agent))
        chunks = [logits[valid] for logits, _, valid in self.turn_logits(agent, turns)]  # (M, V) each
        vocab = chunks[0].shape[-1] if chunks else self.vocab_size_of(agent)
        flat = torch.zeros(b_size * width, vocab, device=self.device) + self._anchor(agent)
        if chunks:
            flat = flat.index_put((self._positions(turns, width),), torch.cat(chunks))
        return flat.view(b_size, width, vocab)

    def vocab_size_of(self, agent: int) -> int:
        return int(self.model_of(agent).get_output_embeddings().weight.shape[0])

    # -- parameters -----------------------------------------------------------------------------------------------
    def parameters(self, agent: int) -> list[torch.nn.Parameter]:
        """The agent's LoRA parameters (never the base's)."""
        return self._params[agent]

    def named_parameters(self, agent: int) -> dict[str, torch.nn.Parameter]:
        name = self.cfg.workers[agent]
        return {k: p for k, p in self.model_of(agent).named_parameters() if f".{name}." in k}

    def state(self, agent: int) -> dict[str, Tensor]:
        return snapshot(self.named_parameters(agent))

    def load_state(self, agent: int, state: dict[str, Tensor]) -> None:
        load_snapshot(self.named_parameters(agent), state, repr(self.cfg.workers[agent]))

    def base_parameters(self) -> dict[str, Tensor]:
        """Every non-LoRA parameter of every base by name (prefixed ``base{j}.`` with separate bases)."""
        return base_parameters_of(self.models, self.cfg.shared_base)

    def save_adapters(self, folder: str | Path) -> dict[str, Path]:
        """Every agent's adapter as a peft folder ``folder/{worker}/`` (llm_models.save_adapter); returns the paths."""
        return {
            name: save_adapter(self.model_of(i), name, Path(folder) / name) for i, name in enumerate(self.cfg.workers)
        }


# ----------------------------------------------------------------------------------------------------------------
# helpers


def _load_team(cfg: LLMTeamConfig) -> tuple[TeamSpec, TaskFamily]:
    """The team file (with the config's overrides) and its task family; checks the trainable workers."""
    overrides: dict[str, Any] = {}
    learned = split_spec(cfg.conductor)[1] is not None
    embedder = cfg.embedder if cfg.embedder is not None else (None if learned else "none")
    if cfg.pipeline or embedder is not None:
        raw = load_team(cfg.team).raw
        if cfg.pipeline:
            conductors = dict(raw.get("conductors") or {})
            conductors["pipeline"] = {**dict(conductors.get("pipeline") or {}), "steps": list(cfg.pipeline)}
            overrides["conductors"] = conductors
        if embedder is not None:
            overrides["embedder"] = embedder
    spec = load_team(cfg.team, overrides=overrides)
    names = list(spec.env.worker_names)
    for name in cfg.workers:
        if name not in spec.workers:
            raise LLMTeamError(f"unknown worker {name!r}: team {spec.name!r} has workers {names}")
        if spec.workers[name].kind != "llm":
            raise LLMTeamError(f"worker {name!r} of team {spec.name!r} is a tool: only LLM workers can be fine-tuned")
    return spec, resolve_family(spec, cfg.family)


__all__ = ["LLMTeam"]
