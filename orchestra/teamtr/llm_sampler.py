"""Phase-2 sampling on a server while training runs in torch (``LLMTeamConfig.sampler_url``).

The server is an OpenAI-compatible one with runtime LoRA loading (vLLM started with ``--enable-lora`` and
``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``) serving the same base model. Trainable workers' turns are sampled there
from the exact prompt ids (:meth:`orchestra.backends.http.OpenAIHTTPBackend.generate_ids`); before every batch and
held-out evaluation each worker's current adapter is written under a name derived from its bytes and loaded into the
server (:meth:`~orchestra.backends.http.OpenAIHTTPBackend.publish_adapter`), so the server samples exactly the
adapters as they are after the last update.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from orchestra.backends.http import OpenAIHTTPBackend, adapter_digest


class ServerSampler:
    """The sampling server of one LLM team and the folder its published adapters are written to."""

    def __init__(self, url: str, model: str, adapter_dir: str | None, concurrency: int) -> None:
        self.http = OpenAIHTTPBackend(url, model=model, timeout_s=120.0, max_concurrency=concurrency)
        self.http.request_token_ids = True  # the frozen base workers' chat replies carry ids too (vLLM)
        self.adapter_dir = Path(adapter_dir or tempfile.mkdtemp(prefix="orchestra-adapters-"))
        self.adapter_dir.mkdir(parents=True, exist_ok=True)

    def publish(self, save_adapters: Callable[[Path], dict[str, Path]]) -> dict[str, str]:
        """Write every adapter (``save_adapters(folder)`` → {worker: peft folder}) to ``adapter_dir/WORKER@DIGEST``
        and load the versions the server does not hold; returns {worker: served name}."""
        staging = self.adapter_dir / ".staging"
        shutil.rmtree(staging, ignore_errors=True)
        out = {}
        for name, folder in save_adapters(staging).items():
            target = self.adapter_dir / f"{name}@{adapter_digest(str(folder))}"
            if target.is_dir():
                shutil.rmtree(folder)
            else:
                folder.replace(target)
            out[name] = self.http.publish_adapter(name, target)
        shutil.rmtree(staging, ignore_errors=True)
        return out


__all__ = ["ServerSampler"]
