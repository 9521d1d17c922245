"""Models of an LLM team (:mod:`orchestra.teamtr.llm`): tokenizer and base loading, and the multi-adapter
``PeftModel`` (one LoRA adapter per trainable worker on one frozen base)."""

from __future__ import annotations

import copy
import functools
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from orchestra.backends.base import BackendError
from orchestra.backends.model_cache import from_pretrained
from orchestra.backends.models import resolve_model
from orchestra.teamtr.llm_config import DTYPES, LLMTeamConfig, LLMTeamError

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
        lm: Any = tiny.to(device=cfg.device, dtype=dtype)
        model_id = f"tiny-llama-s{seed}"
    else:
        source = resolve_model(model)
        try:
            with quiet_loading():
                lm = from_pretrained(AutoModelForCausalLM, source, dtype=dtype, **extra)
        except (OSError, ValueError) as e:
            raise BackendError(f"transformers could not load {str(source.path)!r}: {e}") from e
        lm, model_id = lm.to(cfg.device), f"hf:{source.name}"
    if dtype != torch.float32:
        upcast(lm, cfg.upcast, model)
    return lm, tokenizer, model_id


def upcast(lm: Any, level: str, model: str) -> None:
    """Make the causal LM ``lm``, loaded below float32, compute more of its forward in float32, in place (``level`` =
    ``LLMTeamConfig.upcast``): ``head`` = :func:`float32_head`, ``residual`` = that and :func:`float32_residual`.

    Why: with a bfloat16 base, any change of an adapter re-rolls the roundings of every activation, so the k3 KL
    estimate of a step whose true KL is 2e-9 nats per token reads 1.8e-3 on SmolLM2 (CPU, 256 tokens), 9e-4 with
    ``head`` and 2.7e-4 with ``residual`` (docs/algorithms.md §2.4). Every forward of the model goes through the
    change, the sampler's included."""
    if level in ("head", "residual"):
        float32_head(lm, model)
    if level == "residual":
        float32_residual(lm, model)


class Float32Norm(torch.nn.Module):
    """A model's final norm evaluated in float32: a float32 copy of it, applied to the upcast hidden state, so its
    output is not rounded to the model's dtype (:func:`float32_head`)."""

    def __init__(self, norm: torch.nn.Module) -> None:
        super().__init__()
        self.norm = copy.deepcopy(norm).float()

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.norm(hidden.float())


def float32_head(lm: Any, model: str) -> None:
    """Make the causal LM ``lm`` (loaded below float32) compute its last two steps in float32, in place: the decoder's
    final ``norm`` becomes a :class:`Float32Norm` and the output head (tied to the input embedding in SmolLM2) a
    float32 copy, frozen. Logits are then free of the model dtype's rounding: bf16 logits of magnitude 10-30 carry a
    ulp of 0.06-0.125, and a re-rounded final norm and head make half of the KL noise floor a bf16 trust region sees
    (docs/algorithms.md §2.4). On CPU it is no slower (a bf16 GEMM with 49152 outputs is slow there); it costs an
    fp32 copy of the head (113 MB for SmolLM2). ``LLMTeamError`` naming ``upcast`` for a model without a Linear head
    and a final norm."""
    head = lm.get_output_embeddings()
    decoder = lm.get_decoder()
    norm = getattr(decoder, "norm", None)
    if not isinstance(head, torch.nn.Linear) or not isinstance(norm, torch.nn.Module):
        raise LLMTeamError(
            f"upcast: model {model!r} has no Linear output head and final `norm` to compute in float32 "
            "(set upcast='none')"
        )
    fp32 = torch.nn.Linear(head.in_features, head.out_features, bias=head.bias is not None, device="meta")
    fp32.weight = torch.nn.Parameter(head.weight.detach().float(), requires_grad=False)  # untied: its own copy
    if head.bias is not None:
        fp32.bias = torch.nn.Parameter(head.bias.detach().float(), requires_grad=False)
    lm.set_output_embeddings(fp32)
    decoder.norm = Float32Norm(norm).requires_grad_(False)


def float32_residual(lm: Any, model: str) -> None:
    """Keep the residual stream of the decoder ``lm.get_decoder()`` (a Llama-like one: ``embed_tokens``, ``layers``)
    in float32, by forward hooks: the token embeddings are upcast, and every Linear of the layers casts its input to
    its weight's dtype and returns its output upcast. Weights and matmuls stay in the model's dtype; the residual adds,
    the norms, rotary embeddings, attention and the KV cache are float32. SmolLM2's residual stream has an rms of 44
    and 0.1% of its entries above 474 (max 4704), where bf16 rounds to steps of 2 (32): re-rounding it after every
    layer made two thirds of the KL noise floor left after :func:`float32_head`.

    The upcast matmul outputs matter most: peft adds a LoRA adapter's output to its base layer's output and casts the
    sum back to the base's dtype, and a base output already rounded to bf16 swallows any adapter contribution under
    half its ulp. On SmolLM2 the first Adam step of lr 1e-3 then moved the bf16 policy by a KL of 2.1e-2 nats per
    token where float32 measures 5.9e-2 (5.6e-2 with these hooks; docs/algorithms.md §2.4): small updates did not
    reach the bf16 policy. ``LLMTeamError`` naming
    ``upcast`` for another decoder layout."""
    decoder = lm.get_decoder()
    embed, layers = getattr(decoder, "embed_tokens", None), getattr(decoder, "layers", None)
    if not isinstance(embed, torch.nn.Module) or not isinstance(layers, torch.nn.Module):
        raise LLMTeamError(
            f"upcast='residual': model {model!r} has no Llama-like decoder (embed_tokens, layers); set upcast='head'"
        )

    def to_weight_dtype(module: Any, args: tuple[Any, ...]) -> tuple[Any, ...]:
        return (args[0].to(module.weight.dtype), *args[1:])

    def to_float(_module: Any, _args: Any, out: torch.Tensor) -> torch.Tensor:
        return out.float()

    dtype = embed.weight.dtype
    embed.register_forward_hook(to_float)
    for linear in layers.modules():
        if isinstance(linear, torch.nn.Linear) and linear.weight.dtype == dtype:
            linear.register_forward_pre_hook(to_weight_dtype)
            linear.register_forward_hook(to_float)


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


__all__ = [
    "Float32Norm",
    "TINY",
    "float32_head",
    "float32_residual",
    "load_base",
    "load_tokenizer",
    "save_adapter",
    "upcast",
    "with_adapters",
]
