"""transformers backend: real batched decoding with left padding, per-row sampling, peft adapters.

This is the trainable-worker backend (phase 2 fine-tunes these weights with LoRA), and it loads the
same GGUF as llama.cpp: ``AutoModelForCausalLM.from_pretrained(folder, gguf_file=name)`` dequantises
the Q4_1 weights to ``dtype`` (transformers docs, "GGUF and interaction with Transformers").

Why our own decode loop rather than ``model.generate``: rows of one batch may carry different
seeds, temperatures, stop strings and token budgets, and we need each row's sampled ids and their
behaviour log-probs exactly. The loop is the textbook KV-cache loop (nanoGPT / HF ``_sample``):

    prefill   logits[B, V] = model(ids[B, L], mask[B, L], pos[B, L]).logits[:, -1]
    step t    choose token per row (orchestra.backends.sampling rule) -> feed [B, 1] with the cache

Left padding + ``position_ids = cumsum(mask) - 1`` gives every row the positions it would have
alone (as ``GenerationMixin._prepare_position_ids_for_generation`` does), so a row's output does not
depend on its batch-mates (up to float rounding, which the tests check on greedy decoding). Finished
rows are dropped from the batch and the KV cache (``Cache.batch_select_indices``).

As fast as ``model.generate`` (``benchmarks/sampler.py`` measures both in one run): logits and token choice stay on
the device (``sampling.choose_tokens_torch``: every row at once, each with its own temperature and nucleus, drawing
the uniforms its request's seed gives, drawn up front, so a seed samples what the numpy rule samples); a step's
only host read is its sampled ids, from which EOS, ``max_tokens`` and stop strings are decided in the batch (the
decoded text is searched only after a token that can complete a stop string: ``sampling.stop_candidates``);
log-probs come back once, at the end.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import os
import threading
from collections import Counter, defaultdict
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from typing import Any

import numpy as np
import torch

from orchestra.backends.base import (
    BackendError,
    ChatMessage,
    Completion,
    FinishReason,
    GeneratedIds,
    GenerationParams,
    GenerationRequest,
    Usage,
)
from orchestra.backends.model_cache import from_pretrained
from orchestra.backends.models import resolve_model
from orchestra.backends.sampling import choose_tokens_torch, first_stop, stop_candidates, uniforms

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@contextmanager
def quiet_loading() -> Iterator[None]:
    """No progress bars while loading. The GGUF dequantisation loop uses a bare ``tqdm`` that the
    transformers progress-bar switch does not reach (modeling_gguf_pytorch_utils.py), so that module's
    ``tqdm`` is swapped for a disabled one for the duration of the load, then restored."""
    from transformers.utils import logging as hf_logging

    gguf_utils: Any = importlib.import_module("transformers.modeling_gguf_pytorch_utils")
    bar = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    old = getattr(gguf_utils, "tqdm", None)
    if old is not None:
        gguf_utils.tqdm = functools.partial(old, disable=True)
    try:
        yield
    finally:
        if old is not None:
            gguf_utils.tqdm = old
        if bar:
            hf_logging.enable_progress_bar()


class TransformersBackend:
    """Batched chat completion with a transformers causal LM (optionally with peft LoRA adapters).

    Args:
        model: ``"smollm2"`` (embedded GGUF), a ``.gguf`` path, or a local HF folder.
        dtype: ``"float32"`` (CPU default), ``"bfloat16"`` or ``"float16"``.
        device: torch device string.
        max_batch_size: rows per forward pass; larger groups are split.
        adapters: ``{name: path}`` of peft adapters to load now (more via :meth:`load_adapter`).
        seed: mixed into each request's seed (see :class:`~orchestra.backends.llamacpp.LlamaCppBackend`).
        attn_implementation: passed to ``from_pretrained`` (None = transformers' default, sdpa).

    A request selects an adapter with ``context["adapter"]`` (None/absent = the base model with all
    adapters disabled). Requests are grouped by adapter; inside a group rows may differ in every
    generation parameter.
    """

    def __init__(
        self,
        model: str | os.PathLike[str] = "smollm2",
        dtype: str = "float32",
        device: str = "cpu",
        max_batch_size: int = 16,
        adapters: Mapping[str, str | os.PathLike[str]] | None = None,
        seed: int = 0,
        attn_implementation: str | None = None,
    ) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if dtype not in _DTYPES:
            raise BackendError(f"dtype {dtype!r} not supported; expected one of {sorted(_DTYPES)}")
        source = resolve_model(model)
        try:
            with quiet_loading():  # a GGUF loads from its dequantised cache folder (orchestra/backends/model_cache.py)
                tokenizer = from_pretrained(AutoTokenizer, source)
                extra = {"attn_implementation": attn_implementation} if attn_implementation else {}
                lm: Any = from_pretrained(AutoModelForCausalLM, source, dtype=_DTYPES[dtype], **extra)
        except (OSError, ValueError) as e:
            raise BackendError(f"transformers could not load {str(source.path)!r}: {e}") from e
        lm = lm.to(torch.device(device))
        self._setup(lm, tokenizer, f"hf:{source.name}", max_batch_size, seed)
        for name, path in (adapters or {}).items():
            self.load_adapter(name, path)

    @classmethod
    def from_model(
        cls, model: Any, tokenizer: Any | None, model_id: str, max_batch_size: int = 16, seed: int = 0
    ) -> TransformersBackend:
        """Wrap an in-memory model (e.g. a tiny one built from a config, or a ``PeftModel`` being
        trained). ``tokenizer`` may be None: then only :meth:`generate_ids` works."""
        self = cls.__new__(cls)
        self._setup(model, tokenizer, model_id, max_batch_size, seed)
        return self

    def _setup(self, model: Any, tokenizer: Any | None, model_id: str, max_batch_size: int, seed: int) -> None:
        if max_batch_size < 1:
            raise BackendError("max_batch_size must be >= 1")
        self.model = model
        self.tokenizer = tokenizer
        self.model_id = model_id
        self.max_batch_size = int(max_batch_size)
        self.share_prefill = (
            True  # identical prompts of one call are prefilled once (False: one row each, for benchmarks)
        )
        self.seed = int(seed)
        # work done so far, for benchmarks: decode forwards by the rows they carried, prompt positions prefilled
        self.decode_steps: Counter[int] = Counter()
        self.prefill_tokens = 0
        self._lock = threading.RLock()
        self._pieces: list[str] | None = None  # each vocabulary id decoded alone (stop-string tables), built on demand
        self._exact_pieces = True
        self._stop_tables: dict[tuple[str, ...], np.ndarray] = {}
        ids: set[int] = set()
        for src in (getattr(model, "generation_config", None), getattr(model, "config", None), tokenizer):
            value = getattr(src, "eos_token_id", None)
            ids.update([value] if isinstance(value, int) else list(value or []))
        self.eos_ids = frozenset(ids)
        pad = getattr(tokenizer, "pad_token_id", None)
        self.pad_id = int(pad if pad is not None else min(self.eos_ids, default=0))
        # transformers 5.24 renamed the KV-cache argument ``past_key_values`` -> ``cache`` (the old
        # name warns until 5.40); ask the model's own forward which one it takes.
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        self._cache_arg = "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"

    def __repr__(self) -> str:
        return f"TransformersBackend(model_id={self.model_id!r}, adapters={self.adapters}, max_batch_size={self.max_batch_size})"

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    # ------------------------------------------------------------------------------------- adapters
    @property
    def adapters(self) -> list[str]:
        cfg = getattr(self.model, "peft_config", None)
        return sorted(cfg) if isinstance(cfg, Mapping) else []

    def load_adapter(self, name: str, path: str | os.PathLike[str]) -> None:
        """Load a peft adapter saved with ``save_pretrained``; the base weights are shared."""
        from peft import PeftModel

        if not os.path.isfile(os.path.join(path, "adapter_config.json")):
            raise BackendError(f"adapter {name!r}: {str(path)!r} is not a peft adapter folder (no adapter_config.json)")
        if isinstance(self.model, PeftModel):
            self.model.load_adapter(os.fspath(path), adapter_name=name)
        else:
            self.model = PeftModel.from_pretrained(self.model, os.fspath(path), adapter_name=name)
        self.model.eval()

    # ------------------------------------------------------------------------------------- generate
    def prompt_ids(self, messages: Sequence[ChatMessage]) -> list[int]:
        """Chat template (from the tokenizer, i.e. the GGUF's ``tokenizer.chat_template``) + tokens.
        The template writes the special tokens, so none are added again."""
        if self.tokenizer is None:
            raise BackendError(f"{self.model_id}: no tokenizer; use generate_ids with token ids")
        text = self.tokenizer.apply_chat_template(
            [{"role": m.role, "content": m.content} for m in messages], add_generation_prompt=True, tokenize=False
        )
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        prompts = [self.prompt_ids(r.messages) for r in requests]
        out: list[Completion | None] = [None] * len(requests)
        groups: dict[str | None, list[int]] = defaultdict(list)
        for i, r in enumerate(requests):
            groups[r.context.get("adapter")].append(i)
        for adapter, idx in groups.items():
            rows = self.generate_ids([prompts[i] for i in idx], [requests[i].params for i in idx], adapter=adapter)
            for i, row in zip(idx, rows, strict=True):
                out[i] = Completion(
                    text=row.text or "",
                    token_ids=row.token_ids,
                    logprobs=row.logprobs,
                    finish_reason=row.finish_reason,
                    usage=Usage(prompt_tokens=len(prompts[i]), completion_tokens=len(row.token_ids)),
                    model_id=self.model_id,
                    metadata={"adapter": adapter} if adapter else {},
                )
        return [c for c in out if c is not None]

    def generate_ids(
        self,
        prompts: Sequence[Sequence[int]],
        params: GenerationParams | Sequence[GenerationParams],
        adapter: str | None = None,
    ) -> list[GeneratedIds]:
        """Lower-level entry: complete token-id prompts (no chat template). Output order = input
        order. Prompts are sorted by length and cut into batches of ``max_batch_size`` (less padding).
        Stop strings need a tokenizer; without one only EOS and ``max_tokens`` end a row."""
        plist = [params] * len(prompts) if isinstance(params, GenerationParams) else list(params)
        if len(plist) != len(prompts):
            raise BackendError(f"{len(prompts)} prompts but {len(plist)} params")
        if any(len(p) == 0 for p in prompts):
            raise BackendError("empty prompt: a causal LM needs at least one token to condition on")
        limit = getattr(getattr(self.model, "config", None), "max_position_embeddings", None)
        for i, (prompt, p) in enumerate(zip(prompts, plist, strict=True)):
            if isinstance(limit, int) and len(prompt) + p.max_tokens > limit:
                raise BackendError(
                    f"request {i}: {len(prompt)} prompt tokens + max_tokens={p.max_tokens} exceed the "
                    f"model's context of {limit} positions"
                )
        order = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))
        out: list[GeneratedIds | None] = [None] * len(prompts)
        # one call at a time: the active adapter and the train/eval mode are model-wide state
        with self._lock, self._adapter(adapter):
            for start in range(0, len(order), self.max_batch_size):
                chunk = order[start : start + self.max_batch_size]
                rows = self._decode([list(prompts[i]) for i in chunk], [plist[i] for i in chunk])
                for i, row in zip(chunk, rows, strict=True):
                    out[i] = row
        return [r for r in out if r is not None]

    @contextmanager
    def _adapter(self, name: str | None) -> Iterator[None]:
        """Select adapter ``name`` (None = base model, adapters disabled) in eval mode, for one call.

        Leaves the model as it found it: train/eval mode, the active adapter, and every parameter's
        ``requires_grad`` (peft's ``set_adapter`` marks the selected adapter trainable), so a
        trainer that shares this model (phase 2) is not disturbed by sampling from it."""
        if name is not None and name not in self.adapters:
            raise BackendError(f"unknown adapter {name!r}; loaded adapters: {self.adapters}")
        was_training = self.model.training
        grads = [(p, p.requires_grad) for p in self.model.parameters()]
        previous = getattr(self.model, "active_adapter", None) if self.adapters else None
        self.model.eval()  # no dropout while sampling, whatever mode the trainer left it in
        try:
            with ExitStack() as stack:
                if name is not None:
                    self.model.set_adapter(name)
                elif self.adapters:
                    stack.enter_context(self.model.disable_adapter())
                yield
        finally:
            if name is not None and isinstance(previous, str) and previous != name:
                self.model.set_adapter(previous)
            for p, flag in grads:
                p.requires_grad_(flag)
            self.model.train(was_training)

    @torch.inference_mode()
    def _decode(self, prompts: list[list[int]], params: list[GenerationParams]) -> list[GeneratedIds]:
        from transformers import DynamicCache

        device, n = self.device, len(prompts)
        # identical prompts (a GRPO group's G samples of one task) are prefilled once and their cache rows repeated
        first: dict[tuple[int, ...], int] = {}
        row_of = [first.setdefault(tuple(p), len(first)) for p in prompts] if self.share_prefill else list(range(n))
        unique = [list(k) for k in first] if self.share_prefill else [list(p) for p in prompts]
        width = max(len(p) for p in unique)
        ids = torch.full((len(unique), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(unique), width), dtype=torch.long)
        for i, prompt in enumerate(unique):  # left padding: the last column is every row's last token
            ids[i, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
            mask[i, width - len(prompt) :] = 1
        ids, mask = ids.to(device), mask.to(device)
        pos = (mask.cumsum(-1) - 1).clamp(min=0)  # per-row positions 0..len-1, pads at 0
        cache = DynamicCache(config=getattr(self.model, "config", None))
        logits = self._forward(ids, mask, pos, cache)  # [u, V]
        self.prefill_tokens += int(mask.sum())
        if len(unique) < n:
            expand = torch.tensor(row_of, dtype=torch.long, device=device)
            logits, mask, pos = logits[expand], mask[expand], pos[expand]
            cache.batch_select_indices(expand)  # [n, …]: each request's row of its prompt's prefill
        # per-row sampling state on the device: temperatures, nucleus masses, the uniforms each row will consume
        temps = torch.tensor([max(p.temperature, 0.0) for p in params], dtype=torch.float32, device=device)
        top_p = (
            torch.tensor([p.top_p for p in params], dtype=torch.float64, device=device)
            if any(p.temperature > 0 and p.top_p < 1.0 for p in params)
            else None
        )
        horizon = max((p.max_tokens for p in params), default=0)
        u_host = np.zeros((n, max(horizon, 1)))
        for i, p in enumerate(params):
            if p.temperature > 0 and p.max_tokens > 0:
                u_host[i, : p.max_tokens] = uniforms([self.seed, p.seed], p.max_tokens)
        u = torch.from_numpy(u_host).to(device)
        lp_buf = torch.zeros((n, max(horizon, 1)), dtype=torch.float64, device=device)
        stops = [self._stop_table(p.stop) for p in params]
        toks: list[list[int]] = [[] for _ in range(n)]
        finish: list[FinishReason] = ["length"] * n
        texts: list[str | None] = [None] * n
        alive = [i for i in range(n) if params[i].max_tokens > 0]  # original row of each batch row
        for i in range(n):
            if params[i].max_tokens <= 0:
                texts[i] = "" if self.tokenizer is not None else None
        rows = torch.tensor(alive, dtype=torch.long, device=device)
        if len(alive) < n:
            logits, mask, pos = logits[rows], mask[rows], pos[rows]
            cache.batch_select_indices(rows)
        t = 0
        while alive:
            tok, lp = choose_tokens_torch(logits, temps[rows], None if top_p is None else top_p[rows], u[rows, t])
            lp_buf[rows, t] = lp
            sampled = tok.tolist()  # the step's one host read: ends are decided on the ids, in the batch
            still = [
                b
                for b, (i, v) in enumerate(zip(alive, sampled, strict=True))
                if not self._ends(i, v, toks[i], params[i], stops[i], finish, texts)
            ]
            t += 1
            if not still:
                break
            if len(still) < len(alive):  # drop finished rows from the batch and the cache
                keep = torch.tensor(still, dtype=torch.long, device=device)
                mask, pos, tok, rows = mask[keep], pos[keep], tok[keep], rows[keep]
                cache.batch_select_indices(keep)
                alive = [alive[b] for b in still]
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=-1)
            pos = pos[:, -1:] + 1
            logits = self._forward(tok[:, None], mask, pos, cache)
            self.decode_steps[len(alive)] += 1
        lps = lp_buf.cpu().tolist()
        return [GeneratedIds(tuple(toks[i]), tuple(lps[i][: len(toks[i])]), finish[i], texts[i]) for i in range(n)]

    def _forward(self, ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor, cache: Any) -> torch.Tensor:
        kwargs = {self._cache_arg: cache}
        out = self.model(
            input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, logits_to_keep=1, **kwargs
        )
        return out.logits[:, -1, :].float()

    def _stop_table(self, stop: Sequence[str]) -> np.ndarray | None:
        """Which token ids can complete one of ``stop`` (None: no stop strings, or no tokenizer to decode them);
        built once per stop tuple from the vocabulary's pieces (:func:`~orchestra.backends.sampling.stop_candidates`)."""
        key = tuple(s for s in stop if s)
        if not key or self.tokenizer is None:
            return None
        table = self._stop_tables.get(key)
        if table is None:
            if self._pieces is None:
                tok = self.tokenizer
                size = max(len(tok), int(getattr(getattr(self.model, "config", None), "vocab_size", 0) or 0))
                self._pieces = tok.batch_decode([[v] for v in range(size)], skip_special_tokens=True)
                probe = tok("x y", add_special_tokens=False)["input_ids"]
                self._exact_pieces = tok.decode(probe[-1:], skip_special_tokens=True).startswith(" ")
            table = stop_candidates(self._pieces, key, exact_pieces=self._exact_pieces)
            self._stop_tables[key] = table
        return table

    def _ends(
        self,
        i: int,
        tok_id: int,
        toks: list[int],
        p: GenerationParams,
        stop_table: np.ndarray | None,
        finish: list[FinishReason],
        texts: list[str | None],
    ) -> bool:
        """Row ``i`` just sampled ``tok_id``: record it, decide whether the row ends, and set its text if so. Stop
        strings are searched in the decoded text only when the token can complete one (``stop_table``)."""
        toks.append(tok_id)
        tok = self.tokenizer
        if tok_id in self.eos_ids:  # EOS id kept (it was sampled); text excludes it
            finish[i] = "stop"
            texts[i] = None if tok is None else tok.decode(toks[:-1], skip_special_tokens=True)
            return True
        if tok is not None and stop_table is not None and (tok_id >= len(stop_table) or stop_table[tok_id]):
            text = tok.decode(toks, skip_special_tokens=True)
            cut = first_stop(text, p.stop)
            if cut is not None:  # text cut before the stop string; the ids that produced it kept
                finish[i], texts[i] = "stop", text[:cut]
                return True
        if len(toks) >= p.max_tokens:
            finish[i] = "length"
            texts[i] = None if tok is None else tok.decode(toks, skip_special_tokens=True)
            return True
        return False
