"""One LoRA adapter per agent on one frozen base: the multi-adapter ``PeftModel`` both teams build (the telephone
chain's :mod:`~orchestra.teamtr.chain` and the LLM team's :mod:`~orchestra.teamtr.llm_models`). Imports peft."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

from peft import LoraConfig, PeftModel, get_peft_model


def multi_adapter_model(
    base: Any, names: Sequence[str], *, r: int, alpha: int, dropout: float, targets: Sequence[str]
) -> PeftModel:
    """``get_peft_model`` for the first adapter name, ``add_adapter`` for the rest; the base is frozen by peft.
    Adapter initialisation draws from torch's global RNG: seed it (or fork it) around the call."""

    def lora() -> LoraConfig:
        return LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=list(targets), bias="none")

    with warnings.catch_warnings():
        # peft 0.21 calls transformers' deprecated `is_gradient_checkpointing`; harmless, and not ours to fix
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        model = get_peft_model(base, lora(), adapter_name=names[0])
        for name in names[1:]:
            model.add_adapter(name, lora())
    assert isinstance(model, PeftModel)
    return model


__all__ = ["multi_adapter_model"]
