"""The HTTP backend at scale: a worker's LoRA adapter addressed by name (the request's ``model``), adapter versions
published to a running server, and a concurrency bound that holds across threads.

The request format runs against a REAL ``llama_cpp.server`` serving two model aliases (its multi-model config: the
alias is the request's model, as an adapter's name is on vLLM ``--enable-lora``). llama.cpp's server has no runtime
LoRA endpoint, so publishing runs against a local server that implements vLLM's (``/v1/load_lora_adapter``,
``/v1/unload_lora_adapter``, 400 on a duplicate load, 404 for a model that is not loaded); the real vLLM path is
``benchmarks/gpu/vllm_lora.py``, for a GPU machine.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from envs.tasks.registry import get_family
from orchestra.backends import BackendError, CachedBackend, ResponseCache, smollm2_gguf_path
from orchestra.backends.http import OpenAIHTTPBackend
from orchestra.runtime.team_file import load_team
from orchestra.runtime.workers import build_workers
from tests.test_backends_http import chat, free_port, reply, serving
from tests.vllm_like import send


# ------------------------------------------------------------------- a real llama.cpp server, two aliases
@pytest.fixture(scope="module")
def aliased_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    gguf = str(smollm2_gguf_path())
    models = [
        {"model": gguf, "model_alias": alias, "n_ctx": 1024, "verbose": False} for alias in ("smollm2", "solver-v1")
    ]
    config = tmp_path_factory.mktemp("server") / "config.json"
    config.write_text(json.dumps({"host": "127.0.0.1", "port": port, "models": models}))
    with serving(["--config_file", str(config)], port) as url:
        yield url


@pytest.mark.slow
def test_a_workers_adapter_is_the_requests_model_on_a_real_server(aliased_server: str, tmp_path: Path) -> None:
    served = {m["id"] for m in httpx.get(f"{aliased_server}/v1/models").json()["data"]}
    assert served == {"smollm2", "solver-v1"}
    backend = OpenAIHTTPBackend(aliased_server, model="smollm2", timeout_s=120, adapters={"solver": "solver-v1"})
    base = chat("What is 2 + 3?", max_tokens=6)
    tuned = chat("What is 2 + 3?", max_tokens=6)
    tuned.context["adapter"] = "solver"
    assert backend.payload(base)["model"] == "smollm2" and backend.payload(tuned)["model"] == "solver-v1"
    a, b = backend.generate([base, tuned])
    assert a.metadata["server_model"] == "smollm2" and a.model_id == "http:smollm2"
    assert b.metadata["server_model"] == "solver-v1" and b.model_id == "http:smollm2+lora:solver-v1"
    assert b.text and b.logprobs and all(lp <= 0 for lp in b.logprobs)

    # the same through a team file: a worker's `adapter:` reaches the request, the cache keeps the two apart
    raw = load_team("arithmetic").raw
    team_yaml = tmp_path / "team.yaml"
    raw = json.loads(json.dumps(raw))
    raw["embedder"] = "hash"
    raw["backends"] = {
        "srv": {
            "type": "http",
            "base_url": aliased_server,
            "model": "smollm2",
            "timeout_s": 120,
            "adapters": {"solver": "solver-v1"},
        }
    }
    for w in raw["workers"]:
        if w.get("kind", "llm") == "llm":
            w["backend"] = "srv"
            w.setdefault("generation", {}).update(temperature=0.0, max_tokens=8)  # greedy: cacheable
            if w["name"] == "solver":
                w["adapter"] = "solver"
    import yaml

    team_yaml.write_text(yaml.safe_dump(raw, sort_keys=False))
    team = load_team(str(team_yaml))
    cache = tmp_path / "cache.sqlite"
    workers = build_workers(team, get_family(team.family).tools(), cache_path=cache, use_cache=True)
    solver, critic = workers["solver"], workers["critic"]
    assert solver.adapter == "solver" and critic.adapter is None
    assert solver.model_id == "http:smollm2+lora:solver" and critic.model_id == "http:smollm2"
    chat_ = [{"role": "user", "content": "What is 2 + 3?"}]
    req_s = solver.request(chat_, None, [], 0)  # type: ignore[arg-type]
    req_c = critic.request(chat_, None, [], 0)  # type: ignore[arg-type]
    assert req_s.context["adapter"] == "solver" and "adapter" not in req_c.context
    out_s = solver.backend.generate([req_s])[0]
    out_c = critic.backend.generate([req_c])[0]
    assert out_s.metadata["server_model"] == "solver-v1" and out_c.metadata["server_model"] == "smollm2"
    assert isinstance(solver.backend, CachedBackend)
    again = solver.backend.generate([req_s])[0]
    assert again.cached and again.metadata["server_model"] == "solver-v1"  # cached under the adapter, not the base
    assert len(ResponseCache(cache)) == 2


def test_adapter_on_a_tool_worker_is_refused(tmp_path: Path) -> None:
    import yaml

    raw = json.loads(json.dumps(load_team("arithmetic").raw))
    for w in raw["workers"]:
        if w.get("kind") == "tool":
            w["adapter"] = "x"
            name = w["name"]
            break
    p = tmp_path / "bad.yaml"
    p.write_text(yaml.safe_dump(raw, sort_keys=False))
    with pytest.raises(ValueError, match=r"workers\[\d+\]\.adapter.*only an llm worker"):
        load_team(str(p))
    assert name


# ------------------------------------------------------------------------------ concurrency bound
class Slow:
    """Answers every chat after ``delay_s``, counting requests in flight."""

    def __init__(self, delay_s: float) -> None:
        self.inflight = self.peak = self.total = 0
        lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["Content-Length"]))
                with lock:
                    outer.inflight += 1
                    outer.total += 1
                    outer.peak = max(outer.peak, outer.inflight)
                time.sleep(delay_s)
                with lock:
                    outer.inflight -= 1
                send(self, 200, reply("ok"))

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_the_concurrency_bound_holds_across_threads() -> None:
    srv = Slow(0.15)
    try:
        backend = OpenAIHTTPBackend(srv.url, model="m", max_concurrency=3)
        results: list[int] = []
        threads = [
            threading.Thread(target=lambda: results.append(len(backend.generate([chat(f"q{i}") for i in range(6)]))))
            for _ in range(3)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert results == [6, 6, 6] and srv.total == 18
        assert srv.peak == 3  # many in flight, never more than the bound (3 callers × 6 requests each)
    finally:
        srv.close()


# ------------------------------------------------------------------------------ publishing adapters
class RuntimeLoRA:
    """vLLM's runtime LoRA endpoints as vLLM answers them: load (400 if the name is loaded), unload (400 if not),
    and chat completions only for the base model or a loaded adapter (404 otherwise)."""

    def __init__(self, base: str = "base", runtime: bool = True) -> None:
        self.loaded: dict[str, str] = {}
        self.log: list[tuple[str, dict[str, Any]]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.log.append((self.path, body))
                status, out = outer.answer(self.path, body, base, runtime)
                send(self, status, out)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def answer(self, path: str, body: dict[str, Any], base: str, runtime: bool) -> tuple[int, Any]:
        if path == "/v1/chat/completions":
            if body["model"] != base and body["model"] not in self.loaded:
                return 404, {"error": {"message": f"The model `{body['model']}` does not exist."}}
            return 200, {**reply(f"from {body['model']}"), "model": body["model"]}
        if not runtime:
            return 404, {"detail": "Not Found"}
        name = body["lora_name"]
        if path == "/v1/load_lora_adapter":
            if name in self.loaded:
                return 400, {"error": {"message": f"The lora adapter '{name}' has already been loaded."}}
            self.loaded[name] = body["lora_path"]
            return 200, f"Success: LoRA adapter '{name}' added successfully."
        if path == "/v1/unload_lora_adapter":
            if name not in self.loaded:
                return 400, {"error": {"message": f"The lora adapter '{name}' cannot be found."}}
            del self.loaded[name]
            return 200, f"Success: LoRA adapter '{name}' removed successfully."
        return 404, {"detail": "Not Found"}

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _adapter(folder: Path, weights: bytes) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "adapter_config.json").write_text(json.dumps({"r": 4, "peft_type": "LORA"}))
    (folder / "adapter_model.safetensors").write_bytes(weights)
    return folder


def test_publishing_adapter_versions_routes_later_requests(tmp_path: Path) -> None:
    srv = RuntimeLoRA()
    try:
        backend = OpenAIHTTPBackend(srv.url, model="base", max_retries=0)
        req = chat("hi")
        req.context["adapter"] = "solver"
        before = backend.model_id
        v1 = backend.publish_adapter("solver", _adapter(tmp_path / "u1", b"weights-1"))
        assert v1.startswith("solver@") and list(srv.loaded) == [v1]
        assert backend.generate([req])[0].metadata["server_model"] == v1
        assert backend.model_id != before  # cache keys move with the published versions
        assert backend.publish_adapter("solver", tmp_path / "u1") == v1  # same bytes (a resumed run): no new load
        assert sum(p == "/v1/load_lora_adapter" for p, _ in srv.log) == 1
        v2 = backend.publish_adapter("solver", _adapter(tmp_path / "u2", b"weights-2"))
        assert v2 != v1 and list(srv.loaded) == [v2]  # the old version unloaded
        assert backend.generate([req])[0].metadata["server_model"] == v2
        # a second process (a resumed run) publishing bytes the server already holds: vLLM's 400 counts as done
        other = OpenAIHTTPBackend(srv.url, model="base", max_retries=0)
        assert other.publish_adapter("solver", tmp_path / "u2") == v2 and list(srv.loaded) == [v2]
        with pytest.raises(BackendError, match="not a peft adapter"):
            backend.publish_adapter("solver", tmp_path / "missing")
    finally:
        srv.close()


def test_publishing_to_a_server_without_the_runtime_endpoint_says_how_to_enable_it(tmp_path: Path) -> None:
    srv = RuntimeLoRA(runtime=False)
    try:
        backend = OpenAIHTTPBackend(srv.url, model="base", max_retries=0)
        with pytest.raises(BackendError, match="--enable-lora.*VLLM_ALLOW_RUNTIME_LORA_UPDATING=True"):
            backend.publish_adapter("solver", _adapter(tmp_path / "a", b"w"))
        req = chat("hi")
        req.context["adapter"] = "solver"
        assert backend.payload(req)["model"] == "solver"  # nothing published: the adapter's own name
    finally:
        srv.close()


@pytest.mark.slow
def test_the_priced_teams_larger_model_over_http_plays_and_is_charged_its_price(
    aliased_server: str, tmp_path: Path
) -> None:
    """docs/examples/arithmetic_priced_http.yaml, its `big` backend pointed at a real llama.cpp server (SmolLM2 under
    the alias `solver-v1` standing in for the larger model): the analyst's turns go to that server, the python tool
    runs its programs, and every analyst turn is charged the analyst's declared price."""
    import yaml

    from orchestra.runtime.conductors import conductor_factory
    from orchestra.runtime.rollout import RolloutEngine, plan_jobs

    raw = yaml.safe_load((Path(__file__).parent.parent / "docs/examples/arithmetic_priced_http.yaml").read_text())
    raw["backends"]["big"].update(base_url=aliased_server, model="solver-v1")
    raw["embedder"] = "hash"
    team_yaml = tmp_path / "team.yaml"
    team_yaml.write_text(yaml.safe_dump(raw, sort_keys=False))
    team = load_team(str(team_yaml))
    family = get_family(team.family)
    workers = build_workers(team, family.tools(), use_cache=False)
    analyst = next(w for w in team.env.workers if w.name == "analyst")
    engine = RolloutEngine(
        team, family, workers, conductor_factory("analyst", team), conductor_name="analyst", progress=False
    )
    eps = engine.run(plan_jobs(family.generate("validation", 3, seed=0), 0, "http-priced"))
    assert len(eps) == 3 and all(e.error is None for e in eps)
    for e in eps:
        first, run = e.steps[0], e.steps[1]
        assert first.message is not None and first.message.worker == "analyst"
        assert first.message.model_id == "http:solver-v1"  # served by the stand-in for the larger model
        tokens = first.message.completion_tokens
        assert first.reward.named["price"] == pytest.approx(-analyst.price(tokens))
        assert run.message is not None and run.message.worker == "python"
        assert e.price == pytest.approx(analyst.price(tokens) + 0.05)  # the analyst's turn and one sandboxed run
