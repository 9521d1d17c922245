"""OpenAI-compatible HTTP backend: a REAL llama.cpp server (llama-cpp-python's ``llama_cpp.server``)
plus tiny local servers for the failure modes (refused, silent, junk, flaky, key capture).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from orchestra.backends import (
    BackendError,
    ChatMessage,
    GenerationParams,
    GenerationRequest,
    llamacpp_probe,
    smollm2_gguf_path,
)
from orchestra.backends.http import OpenAIHTTPBackend


def chat(text: str, **params: Any) -> GenerationRequest:
    return GenerationRequest(messages=(ChatMessage("user", text),), params=GenerationParams(**params))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ------------------------------------------------------------------------------ a real llama.cpp server
@contextlib.contextmanager
def serving(args: list[str], port: int) -> Iterator[str]:
    """``python -m llama_cpp.server ARGS`` on ``port`` until it answers /v1/models; its URL; stopped on the way out.
    Not started where the crash probe failed: the test fails with its message."""
    llamacpp_probe.require(smollm2_gguf_path())
    proc = subprocess.Popen(
        [sys.executable, "-m", "llama_cpp.server", *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                err = proc.stderr.read().decode(errors="replace")[-2000:] if proc.stderr else ""
                pytest.fail(f"llama_cpp.server exited with {proc.returncode}: {err}")
            try:
                if httpx.get(f"{url}/v1/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail("llama_cpp.server did not answer /v1/models within 120 s")
            time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def llama_server() -> Iterator[str]:
    port = free_port()
    args = ["--model", str(smollm2_gguf_path()), "--host", "127.0.0.1", "--port", str(port), "--n_ctx", "1024"]
    with serving([*args, "--verbose", "False"], port) as url:
        yield url


@pytest.mark.slow
def test_real_server_chat_completion(llama_server: str) -> None:
    backend = OpenAIHTTPBackend(llama_server, model="smollm2", timeout_s=60, max_retries=1)
    reqs = [chat("What is 2 + 3?", max_tokens=12), chat("Say hello.", max_tokens=6), chat("Count: 1, 2,", max_tokens=4)]
    out = backend.generate(reqs)  # sent concurrently; order preserved
    for c in out:
        assert c.text and c.finish_reason in ("stop", "length") and c.model_id == "http:smollm2"
        assert c.logprobs and all(lp <= 0.0 for lp in c.logprobs)
        assert c.usage.prompt_tokens > 0 and c.usage.completion_tokens > 0
        # llama-cpp-python's server gives token strings, not ids: documented empty tuple + note
        assert c.token_ids == () and "unavailable" in c.metadata["token_ids"]
        assert len(c.metadata["tokens"]) == len(c.logprobs)
    assert "5" in out[0].text
    assert out[1].finish_reason == "length" or len(out[1].logprobs) <= 6
    stopped = backend.generate([chat("What is 2 + 3?", max_tokens=12, stop=("=",))])[0]
    assert "=" not in stopped.text and stopped.finish_reason == "stop"
    backend.close()


# ----------------------------------------------------------------------------- failure modes
def test_refused_connection_fails_after_bounded_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    port = free_port()  # bound then closed: nothing listens there
    backend = OpenAIHTTPBackend(f"http://127.0.0.1:{port}", model="m", max_retries=2, backoff_s=0.05, timeout_s=2)
    sleeps: list[float] = []
    monkeypatch.setattr("orchestra.backends.http.time.sleep", sleeps.append)
    with pytest.raises(BackendError, match=r"failed after 3 attempts.*Connect"):
        backend.generate([chat("hi")])
    assert sleeps == [0.05, 0.1]  # exponential backoff between the 3 attempts, then it gave up


@pytest.fixture
def silent_server() -> Iterator[int]:
    """Accepts connections and never answers."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    conns: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        srv.settimeout(0.1)
        while not stop.is_set():
            try:
                conns.append(srv.accept()[0])
            except OSError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield int(srv.getsockname()[1])
    stop.set()
    t.join()
    for c in conns:
        c.close()
    srv.close()


def test_timeout_fails_within_timeout_times_attempts(silent_server: int, monkeypatch: pytest.MonkeyPatch) -> None:
    backend = OpenAIHTTPBackend(
        f"http://127.0.0.1:{silent_server}", model="m", timeout_s=0.3, max_retries=1, backoff_s=0.05
    )
    sleeps: list[float] = []
    monkeypatch.setattr("orchestra.backends.http.time.sleep", sleeps.append)
    with pytest.raises(BackendError, match=r"failed after 2 attempts.*Timeout"):
        backend.generate([chat("hi")])
    assert sleeps == [0.05]  # both attempts timed out (the server never answers), one backoff between


class Scripted:
    """A local HTTP server answering from a script of (status, body) replies; records requests."""

    def __init__(self, replies: list[tuple[int, Any]] | Callable[[dict[str, Any]], tuple[int, Any]]) -> None:
        self.replies = replies
        self.seen: list[tuple[dict[str, str], dict[str, Any]]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.seen.append((dict(self.headers), body))
                if callable(outer.replies):
                    status, reply = outer.replies(body)
                else:
                    status, reply = outer.replies.pop(0) if len(outer.replies) > 1 else outer.replies[0]
                data = reply.encode() if isinstance(reply, str) else json.dumps(reply).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:  # keep pytest output clean
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def reply(text: str = "ok", logprobs: Any = None, finish: str = "stop") -> dict[str, Any]:
    return {
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": finish,
                "logprobs": logprobs,
            }
        ],
        "usage": {"prompt_tokens": 7, "completion_tokens": 2},
    }


@pytest.fixture
def scripted() -> Iterator[Callable[..., Scripted]]:
    made: list[Scripted] = []

    def make(replies: Any) -> Scripted:
        made.append(Scripted(replies))
        return made[-1]

    yield make
    for s in made:
        s.close()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"nothing": 1}, "'choices' is missing"),
        ({"choices": []}, "'choices' is empty"),
        (
            {"choices": [{"message": {"content": 5}, "finish_reason": "stop"}], "usage": {}},
            "'choices[0].message.content' has type int",
        ),
        ({"choices": [{"message": {"content": "x"}, "finish_reason": "stop"}]}, "'usage' is missing"),
        ({**reply(), "usage": {"prompt_tokens": "7", "completion_tokens": 1}}, "'usage.prompt_tokens' has type str"),
        (reply(logprobs={"content": [{"token": "a", "logprob": "high"}]}), "'choices[0].logprobs.content[0].logprob'"),
        ("this is {not json", "not JSON"),
    ],
)
def test_malformed_reply_names_the_field(scripted: Callable[..., Scripted], body: Any, field: str) -> None:
    srv = scripted([(200, body)])
    backend = OpenAIHTTPBackend(srv.url, model="m", max_retries=0)
    with pytest.raises(BackendError, match=field.replace("[", r"\[").replace("]", r"\]")):
        backend.generate([chat("hi")])
    assert len(srv.seen) == 1  # max_retries=0: one attempt (with retries a malformed reply is retried: test_faults)


def test_api_key_sent_as_bearer_and_never_shown(
    scripted: Callable[..., Scripted], monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = "sk-test-0123456789abcdef"
    monkeypatch.setenv("ORCH_TEST_KEY", secret)
    # the server echoes the Authorization header back in an error body: the error must not show it
    srv: Scripted = scripted(lambda body: (400, {"error": "bad request", "echo": srv.seen[-1][0].get("Authorization")}))
    backend = OpenAIHTTPBackend(srv.url, model="m", api_key_env="ORCH_TEST_KEY", max_retries=0)
    with pytest.raises(BackendError) as err:
        backend.generate([chat("hi")])
    assert srv.seen[0][0]["Authorization"] == f"Bearer {secret}"
    assert secret not in str(err.value) and "***" in str(err.value)
    assert secret not in repr(backend) and secret not in str(backend) and secret not in repr(vars(backend))
    assert "ORCH_TEST_KEY" in repr(backend)
    monkeypatch.delenv("ORCH_TEST_KEY")
    srv2 = scripted([(200, reply())])
    OpenAIHTTPBackend(srv2.url, model="m", api_key_env="ORCH_TEST_KEY").generate([chat("hi")])
    assert "Authorization" not in srv2.seen[0][0]  # no key in the environment: no header at all


def test_retries_5xx_and_429_then_succeeds(scripted: Callable[..., Scripted]) -> None:
    srv = scripted([(503, "busy"), (429, {"error": "slow down"}), (200, reply("fine"))])
    backend = OpenAIHTTPBackend(srv.url, model="m", max_retries=3, backoff_s=0.01)
    (c,) = backend.generate([chat("hi")])
    assert c.text == "fine" and len(srv.seen) == 3
    body = srv.seen[0][1]
    assert body["logprobs"] is True and body["model"] == "m" and body["messages"] == [{"role": "user", "content": "hi"}]
    bad = scripted([(400, {"error": "no such model"})])
    with pytest.raises(BackendError, match="HTTP 400"):
        OpenAIHTTPBackend(bad.url, model="m", max_retries=3, backoff_s=0.01).generate([chat("hi")])
    assert len(bad.seen) == 1  # a client error is not retried


def test_parses_logprobs_token_ids_and_finish(scripted: Callable[..., Scripted]) -> None:
    def echo(body: dict[str, Any]) -> tuple[int, Any]:
        text = body["messages"][-1]["content"]
        entries = [{"token": "token_id:11", "logprob": -0.5}, {"token": "token_id:12", "logprob": -0.25}]
        if text == "strings":
            entries = [{"token": "a", "logprob": -0.5}, {"token": "b", "logprob": -0.25}]
        if text == "ids":
            entries = [{"token": "a", "id": 3, "logprob": -0.5}, {"token": "b", "id": 4, "logprob": -0.25}]
        return 200, reply(text, logprobs={"content": entries}, finish="length" if text == "vllm" else "stop")

    srv = scripted(echo)
    backend = OpenAIHTTPBackend(srv.url, model="m", request_token_ids=True)
    a, b, c = backend.generate([chat("vllm"), chat("strings"), chat("ids")])
    assert (a.text, a.token_ids, a.logprobs, a.finish_reason) == ("vllm", (11, 12), (-0.5, -0.25), "length")
    assert b.token_ids == () and b.metadata["tokens"] == ("a", "b") and b.logprobs == (-0.5, -0.25)
    assert c.token_ids == (3, 4)
    assert all(body["return_tokens_as_token_ids"] is True for _, body in srv.seen)
    assert os.environ.get("OPENAI_API_KEY") or all("Authorization" not in h for h, _ in srv.seen)
