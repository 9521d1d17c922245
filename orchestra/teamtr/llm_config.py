"""The config of an LLM team for TeamTR (:class:`~orchestra.teamtr.llm.LLMTeam` is the team): every knob declared
once with a default and a one-line doc, validated on construction, written into run directories and checkpoints and
compared on resume; the CPU-sized preset of ``orchestra finetune``; the error a bad setting raises."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch

from envs.config import Embedder

DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
LORA_TARGETS: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class LLMTeamError(ValueError):
    """A bad LLM-team setting (unknown or tool worker, missing conductor checkpoint…); the message names it."""


@dataclass(frozen=True)
class TinyModelConfig:
    """Size of the ``model="tiny"`` base: a random-init Llama over the SmolLM2 tokenizer's vocabulary (no download)."""

    hidden_size: int = 32  # residual width
    intermediate_size: int = 64  # MLP width
    num_layers: int = 2  # decoder layers
    num_heads: int = 4  # attention heads (= key/value heads); must divide hidden_size
    max_position_embeddings: int = 2048  # context length (prompts + messages)
    initializer_range: float = 0.02  # init std (0.02: near-uniform next-token distributions)


@dataclass(frozen=True)
class LLMTeamConfig:
    """Every knob of an LLM team for TeamTR (written into run directories and checkpoints, compared on resume)."""

    team: str = "arithmetic"  # built-in team name or team YAML file
    family: str | None = None  # task family (None = the team's); tasks come from its train split
    difficulty: int | None = None  # one difficulty level of the family (None = mixed)
    conductor: str = "pipeline"  # the FIXED conductor: a rule-based name or LABEL:CHECKPOINT of a phase-1 one
    pipeline: tuple[str, ...] = ()  # override the team file's pipeline steps ("worker:instruction"); () = the file's
    # the observation's sentence encoder; None = none under a rule-based conductor (rules read the structured state,
    # never the vector: encoding it was a third of a tiny team's sampling time), the team file's under a learned one
    embedder: Embedder | None = None
    workers: tuple[str, ...] = ("solver",)  # trainable LLM workers (one LoRA adapter each), in agent order
    frozen_workers: Literal["base", "team"] = "base"  # other LLM workers: the base, adapters off | the team's backend
    model: str = "smollm2"  # base model: alias, .gguf file, HF folder, or "tiny" (random Llama, tests)
    worker_models: tuple[str, ...] = ()  # one model per trainable worker (needs shared_base=False); () = all `model`
    tiny: TinyModelConfig = field(default_factory=TinyModelConfig)  # size of the "tiny" base
    shared_base: bool = True  # one frozen base + one adapter per worker; False = one base per worker
    dtype: str = "float32"  # float32 (CPU) | bfloat16 (GPU) | float16
    device: str = "cpu"  # torch device of the models (cuda on a GPU)
    attn_implementation: str | None = None  # transformers attention kernel (None = its default, sdpa)
    # below float32, what else computes in float32 (weights and matmuls stay in `dtype`; llm_models.upcast): none |
    # head (the final norm and the output head) | residual (also the residual stream and every matmul's output)
    upcast: Literal["none", "head", "residual"] = "residual"
    lora_r: int = 8  # LoRA rank
    lora_alpha: int = 16  # LoRA scale numerator (scale = alpha / r)
    lora_dropout: float = 0.0  # 0 keeps train-mode and sampling log-probs identical
    lora_targets: tuple[str, ...] = LORA_TARGETS  # module names that get LoRA (SmolLM2 ties lm_head: not targeted)
    temperature: float = 1.0  # sampling temperature of trainable workers (> 0; the trained policy is softmax(z/T))
    top_p: float = 1.0  # nucleus mass of trainable workers (< 1 makes rollouts off-policy: see module docstring)
    max_tokens: int = 64  # new tokens per turn of a trainable worker (stop strings: the team file's)
    group_size: int = 4  # G: episodes per task in a batch (batch_size must be a multiple)
    reward: Literal["return", "success"] = "return"  # episode reward: the team return or the verifier's success
    has_logits: bool = False  # offer (B, T, V) logits: exact-vocabulary KL (memory-hungry at V = 49152); else k3
    forward_batch_size: int = 16  # turns per training forward pass (memory)
    share_prompts: bool = True  # training forwards run a prompt shared by several turns once (same numbers, less work)
    max_batch_size: int = 16  # rows per decoding forward pass
    num_envs: int = 16  # envs stepped at once by the rollout engine (worker requests batched across them)
    eval_tasks: int = 0  # held-out TEST-split tasks scored after every stage (exact_success); 0 = off
    eval_temperature: float = 0.0  # decoding of trainable workers in the held-out evaluation (0 = greedy)
    credit_episodes: int = (
        8  # credit (TeamTRConfig.credit): train-split episodes per coalition value (the same for all)
    )
    seed: int = 0  # LoRA (and tiny base) init, backend sampling salt, held-out tasks
    # sample on a vLLM server (--enable-lora, VLLM_ALLOW_RUNTIME_LORA_UPDATING=True) serving the same base model,
    # each worker's adapter published after every update; training stays in torch (teamtr/llm_sampler.py); None = torch
    sampler_url: str | None = None
    sampler_model: str | None = None  # the server's name of the base model (None = `model`)
    # where published adapters are written: a folder the server can read (None = a temporary folder on this host)
    sampler_adapter_dir: str | None = None
    sampler_concurrency: int = 16  # requests in flight to the server at most

    def __post_init__(self) -> None:
        if not self.workers or len(set(self.workers)) != len(self.workers):
            raise LLMTeamError(f"workers: name each trainable worker once, got {list(self.workers)}")
        if self.dtype not in DTYPES:
            raise LLMTeamError(f"dtype {self.dtype!r}: expected one of {sorted(DTYPES)}")
        if self.upcast not in ("none", "head", "residual"):
            raise LLMTeamError(f"upcast {self.upcast!r}: expected none, head or residual")
        if self.temperature <= 0 or not 0 < self.top_p <= 1:
            raise LLMTeamError(f"need temperature > 0 and 0 < top_p ≤ 1, got {self.temperature}, {self.top_p}")
        if self.credit_episodes < 1:
            raise LLMTeamError(f"credit_episodes must be ≥ 1, got {self.credit_episodes}")
        if self.max_tokens < 1 or self.group_size < 1 or self.forward_batch_size < 1 or self.eval_tasks < 0:
            raise LLMTeamError("need max_tokens ≥ 1, group_size ≥ 1, forward_batch_size ≥ 1, eval_tasks ≥ 0")
        if self.reward not in ("return", "success") or self.frozen_workers not in ("base", "team"):
            raise LLMTeamError(f"reward {self.reward!r} / frozen_workers {self.frozen_workers!r} not known")
        if self.worker_models and (self.shared_base or len(self.worker_models) != len(self.workers)):
            raise LLMTeamError("worker_models needs shared_base=False and one model per trainable worker")
        if self.sampler_url is not None and (not self.shared_base or self.sampler_concurrency < 1):
            raise LLMTeamError("sampler_url needs shared_base=True (one served base) and sampler_concurrency ≥ 1")

    def model_of(self, agent: int) -> str:
        """The base model spec of trainable worker ``agent``."""
        return self.worker_models[agent] if self.worker_models else self.model


# the CPU-sized team of `orchestra finetune` (its trainer: orchestra.teamtr.config.LLM_CPU_TRAINER)
LLM_CPU_TEAM = LLMTeamConfig(max_tokens=48)


__all__ = ["DTYPES", "LLM_CPU_TEAM", "LORA_TARGETS", "LLMTeamConfig", "LLMTeamError", "TinyModelConfig"]
