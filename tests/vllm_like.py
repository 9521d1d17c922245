"""A local OpenAI-compatible server that speaks vLLM's dialect over a torch model, for the CPU tests of phase-2 sampling
on a server (``LLMTeamConfig.sampler_url``).

What it shares with vLLM (``vllm serve --enable-lora`` with ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``): token-id
prompts on ``/v1/completions`` and ``"token_id:N"`` tokens under ``return_tokens_as_token_ids``; the base model or a
loaded LoRA adapter as the request's ``model`` (404 for any other); ``/v1/load_lora_adapter`` (400 for a name already
loaded) and ``/v1/unload_lora_adapter`` (400 for a name not loaded). What it is not: vLLM's kernels, scheduler or
sampler; its log-probs are those of the sampling distribution (vLLM's ``--logprobs-mode processed_logprobs``). The
real server is exercised by ``benchmarks/gpu/vllm_lora.py`` on a GPU machine.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from orchestra.backends.base import ChatMessage, GenerationParams, GenerationRequest
from orchestra.backends.hf import TransformersBackend


def send(handler: BaseHTTPRequestHandler, status: int, out: Any) -> None:
    """Answer with ``out``: a JSON body, or a string sent as it is (vLLM's load/unload replies are plain text)."""
    data = out.encode() if isinstance(out, str) else json.dumps(out).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


class VLLMLike:
    def __init__(self, backend: TransformersBackend, base_name: str) -> None:
        self.backend, self.base_name = backend, base_name
        self.loaded: dict[str, str] = {}
        self.log: list[tuple[str, dict[str, Any]]] = []
        self.completions = 0
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with outer._lock:
                    outer.log.append((self.path, body))
                    status, out = outer.answer(self.path, body)
                send(self, status, out)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def _adapter(self, model: str) -> tuple[bool, str | None]:
        if model == self.base_name:
            return True, None
        return model in self.loaded, model

    @staticmethod
    def _params(body: dict[str, Any]) -> GenerationParams:
        return GenerationParams(
            max_tokens=int(body["max_tokens"]),
            temperature=float(body["temperature"]),
            top_p=float(body.get("top_p", 1.0)),
            stop=tuple(body.get("stop") or ()),
            seed=body.get("seed"),
        )

    def answer(self, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        if path in ("/v1/completions", "/v1/chat/completions"):
            ok, adapter = self._adapter(body["model"])
            if not ok:
                return 404, {"error": {"message": f"The model `{body['model']}` does not exist.", "code": 404}}
            if path == "/v1/completions":
                self.completions += 1
                g = self.backend.generate_ids([body["prompt"]], [self._params(body)], adapter=adapter)[0]
                choice = {
                    "index": 0,
                    "text": g.text or "",
                    "finish_reason": g.finish_reason,
                    "logprobs": {"tokens": [f"token_id:{t}" for t in g.token_ids], "token_logprobs": list(g.logprobs)},
                }
                usage = {"prompt_tokens": len(body["prompt"]), "completion_tokens": len(g.token_ids)}
                return 200, {"model": body["model"], "choices": [choice], "usage": usage}
            messages = tuple(ChatMessage(m["role"], m["content"]) for m in body["messages"])
            req = GenerationRequest(messages=messages, params=self._params(body))
            if adapter is not None:
                req.context["adapter"] = adapter
            c = self.backend.generate([req])[0]
            content = [{"token": f"token_id:{t}", "logprob": lp} for t, lp in zip(c.token_ids, c.logprobs, strict=True)]
            choice = {
                "index": 0,
                "message": {"role": "assistant", "content": c.text},
                "finish_reason": c.finish_reason,
                "logprobs": {"content": content},
            }
            usage = {"prompt_tokens": c.usage.prompt_tokens, "completion_tokens": c.usage.completion_tokens}
            return 200, {"model": body["model"], "choices": [choice], "usage": usage}
        name = body.get("lora_name", "")
        if path == "/v1/load_lora_adapter":
            if name in self.loaded:
                return 400, {"error": {"message": f"The lora adapter '{name}' has already been loaded."}}
            self.backend.load_adapter(name, body["lora_path"])
            self.loaded[name] = body["lora_path"]
            return 200, f"Success: LoRA adapter '{name}' added successfully."
        if path == "/v1/unload_lora_adapter":
            if name not in self.loaded:
                return 400, {"error": {"message": f"The lora adapter '{name}' cannot be found."}}
            self.backend.model.delete_adapter(name)
            del self.loaded[name]
            return 200, f"Success: LoRA adapter '{name}' removed successfully."
        return 404, {"detail": "Not Found"}

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
