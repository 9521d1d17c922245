"""Models of an LLM team (:mod:`orchestra.teamtr.llm`): tokenizer and base loading, and the multi-adapter
``PeftModel`` (one LoRA adapter per trainable worker on one frozen base)."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from orchestra.backends.base import BackendError
from orchestra.backends.model_cache import from_pretrained
from orchestra.backends.models import resolve_model
from orchestra.teamtr.llm_config import DTYPES, LLMTeamConfig

TINY = "tiny"  # model name of the random-init test model (a small Llama with the SmolLM2 tokenizer)


@functools.lru_cache(maxsize=4)
def load_tokenizer(model: str) -> Any:
    """The tokenizer of ``model`` (``"tiny"``: SmolLM2's), loaded once per process (from the
    GGUF's dequantised cache folder, orchestra/backends/model_cache.py)."""
    from transformers import AutoTokenizer

    from orchestra.backends.hf import quiet_loading

    source = resolve_model("smollm2" if model == TINY else model)
    try:
        with quiet_loading():
            return from_pretrained(AutoTokenizer, source)
    except (OSError, ValueError) as e:
        raise BackendError(f"transformers could not load the tokenizer of {str(source.path)!r}: {e}") from e


def load_base(model: str, cfg: LLMTeamConfig, seed: int) -> tuple[Any, Any, str]:
    """(causal LM on ``cfg.device`` in ``cfg.dtype``, tokenizer, model id) for a model spec; frozen by peft later."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    from orchestra.backends.hf import quiet_loading

    tokenizer = load_tokenizer(model)
    dtype = DTYPES[cfg.dtype]
    extra = {"attn_implementation": cfg.attn_implementation} if cfg.attn_implementation else {}
    if model == TINY:
        t = cfg.tiny
        llama = LlamaConfig(
            vocab_size=len(tokenizer),
            hidden_size=t.hidden_size,
            intermediate_size=t.intermediate_size,
            num_hidden_layers=t.num_layers,
            num_attention_heads=t.num_heads,
            num_key_value_heads=t.num_heads,
            max_position_embeddings=t.max_position_embeddings,
            initializer_range=t.initializer_range,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            tie_word_embeddings=False,
        )
        with torch.random.fork_rng(devices=[]):  # deterministic init, the caller's RNG untouched
            torch.manual_seed(seed)
            tiny: Any = AutoModelForCausalLM.from_config(llama, **extra)
        return tiny.to(device=cfg.device, dtype=dtype), tokenizer, f"tiny-llama-s{seed}"
    source = resolve_model(model)
    try:
        with quiet_loading():
            lm: Any = from_pretrained(AutoModelForCausalLM, source, dtype=dtype, **extra)
    except (OSError, ValueError) as e:
        raise BackendError(f"transformers could not load {str(source.path)!r}: {e}") from e
    return lm.to(cfg.device), tokenizer, f"hf:{source.name}"


def with_adapters(base: Any, cfg: LLMTeamConfig, names: Sequence[str], seed: int) -> Any:
    """One ``PeftModel`` with a LoRA adapter per name (base frozen by peft); adapter init seeded by ``seed``."""
    from orchestra.teamtr.lora import multi_adapter_model

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = multi_adapter_model(
            base, names, r=cfg.lora_r, alpha=cfg.lora_alpha, dropout=cfg.lora_dropout, targets=cfg.lora_targets
        )
    return model.eval()


def save_adapter(model: Any, name: str, target: Path) -> Path:
    """Write adapter ``name`` of a PeftModel as a peft folder ``target`` (loadable by a team file's transformers
    backend: ``adapters: {worker: target}``, and by vLLM)."""
    with warnings.catch_warnings():  # a GGUF folder has no config.json; the vocabulary is not modified
        warnings.filterwarnings("ignore", message="Could not find a config file", category=UserWarning)
        model.save_pretrained(str(target), selected_adapters=[name])
    nested = target / name  # peft writes a non-"default" adapter into a sub-folder named after it
    if nested.is_dir():
        for f in nested.iterdir():
            f.replace(target / f.name)
        nested.rmdir()
    return target


__all__ = ["save_adapter", "TINY", "load_base", "load_tokenizer", "with_adapters"]
