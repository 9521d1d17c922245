"""A fault-injecting HTTP proxy for an OpenAI-compatible server: test a recording against a flaky serving stack.

Put it between the HTTP backend and a real server (``llama_cpp.server``, vLLM, ...). Each POST draws, with a
seeded generator, whether to pass the request on or to answer with one fault:

====================  ===================================================================  ======================
kind                  what the client gets                                                  the backend's ``cause``
====================  ===================================================================  ======================
``http_500/502/503``  that status, a short text body                                        ``http_<code>``
``http_429``          429 with ``Retry-After: 0``                                            ``http_429``
``timeout``           nothing for ``hang_s`` seconds, then the connection closes             ``timeout``
``reset``             the connection closed at once with a TCP reset (SO_LINGER 0)           ``connection``
``truncated``         a 200 whose body stops half-way (shorter than its Content-Length)      ``connection``
``cut_json``          a 200 whose complete body is JSON cut half-way                         ``non_json``
``non_json``          a 200 HTML error page                                                  ``non_json``
``bad_schema``        a 200 JSON object that breaks the chat-completions schema              ``malformed_reply``
====================  ===================================================================  ======================

Faulted requests never reach the upstream server. The proxy also keeps the ledger a soak needs: per *logical*
request (the request body, which a retry resends unchanged) the outcome of every attempt in order of arrival; a run
of failed attempts as long as the client's attempts (``give_up_after``) is an *unrecoverable* fault, recorded with
its last kind, so a test can check that the errored episodes match what was injected. A forwarded reply the client
no longer waits for (it timed out on its own, on a loaded machine) counts as the timeout the client met.
"""

from __future__ import annotations

import hashlib
import json
import select
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import numpy as np

FAULT_KINDS: tuple[str, ...] = (
    "http_500",
    "http_502",
    "http_503",
    "http_429",
    "timeout",
    "reset",
    "truncated",
    "cut_json",
    "non_json",
    "bad_schema",
)
# the cause the HTTP backend reports when this fault is the last one it met
CAUSE_OF: Mapping[str, str] = {
    "http_500": "http_500",
    "http_502": "http_502",
    "http_503": "http_503",
    "http_429": "http_429",
    "timeout": "timeout",
    "reset": "connection",
    "truncated": "connection",
    "cut_json": "non_json",
    "non_json": "non_json",
    "bad_schema": "malformed_reply",
}
_CANNED = json.dumps(
    {
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Answer: 4"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 9, "completion_tokens": 3},
    }
).encode()


@dataclass
class FaultLedger:
    """What the proxy did: requests seen, faults injected by kind, and, per logical request (its body), the
    attempts as the client met them, in order of arrival: an injected fault's kind, ``"ok"`` for a forwarded reply
    delivered, ``"late"`` for one the client had stopped waiting for (a real timeout, on a loaded machine)."""

    give_up_after: int = 4
    requests: int = 0
    forwarded: int = 0
    late_replies: int = 0  # forwarded replies the client no longer waited for (it timed out on its own)
    injected: Counter[str] = field(default_factory=Counter)
    upstream_errors: int = 0  # the upstream itself failed or answered non-200 (relayed as it came, or as 502)
    upstream_samples: list[str] = field(default_factory=list)  # the first few of those, for a diagnosis
    attempts: dict[str, list[list[str]]] = field(default_factory=dict)  # body hash -> [[outcome], ...]

    @property
    def faults(self) -> int:
        return sum(self.injected.values())

    @property
    def unrecoverable(self) -> Counter[str]:
        """Runs of ``give_up_after`` failed attempts of one logical request (the client gives up), by the kind of
        the last one; a late reply counts as the timeout the client met."""
        out: Counter[str] = Counter()
        for events in self.attempts.values():
            run = 0
            for (outcome,) in events:
                if outcome in ("ok", "pending"):
                    run = 0
                    continue
                run += 1
                if run == self.give_up_after:
                    out[_kind_met(outcome)] += 1
                    run = 0  # the client gave up; a replayed episode starts a new run
        return out

    def unrecoverable_causes(self) -> Counter[str]:
        """The unrecoverable faults by the cause the client reports for them."""
        out: Counter[str] = Counter()
        for kind, n in self.unrecoverable.items():
            out[CAUSE_OF.get(kind, kind)] += n
        return out

    @property
    def pending(self) -> int:
        """Forwarded requests whose upstream reply has not come back yet (their outcome is still unknown)."""
        return sum(1 for events in self.attempts.values() for (outcome,) in events if outcome == "pending")


def _kind_met(outcome: str) -> str:
    """The fault kind a failed attempt amounts to, for the client: a late reply is the timeout it met; an upstream
    non-200 relayed as it came is that HTTP status."""
    if outcome == "late":
        return "timeout"
    if outcome.startswith("upstream_"):
        return "http_" + outcome.removeprefix("upstream_")
    return outcome


class FaultProxy:
    """``with FaultProxy(upstream, rate=0.5, give_up_after=4) as proxy:`` → point the backend at ``proxy.url``.

    ``rate``: probability that a request is faulted; ``weights``: relative frequency of each kind (default: all
    equal except ``timeout``, a third as often: it costs ``hang_s`` of wall time); ``give_up_after``: the client's
    attempts per request (``max_retries + 1``), for the unrecoverable ledger; ``hang_s`` must exceed the client's
    timeout."""

    def __init__(
        self,
        upstream: str,
        rate: float = 0.5,
        seed: int = 0,
        give_up_after: int = 4,
        weights: Mapping[str, float] | None = None,
        hang_s: float = 3.0,
        upstream_timeout_s: float = 300.0,
    ) -> None:
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"rate: expected a probability in [0, 1], got {rate}")
        w = {k: (1.0 / 3.0 if k == "timeout" else 1.0) for k in FAULT_KINDS}
        if weights is not None:
            unknown = sorted(set(weights) - set(FAULT_KINDS))
            if unknown:
                raise ValueError(f"weights: unknown fault kind(s) {unknown}; known: {list(FAULT_KINDS)}")
            w = {k: float(weights.get(k, 0.0)) for k in FAULT_KINDS}
        total = sum(w.values())
        if total <= 0:
            raise ValueError("weights: at least one fault kind needs a positive weight")
        self.kinds = list(FAULT_KINDS)
        self.p = np.array([w[k] / total for k in self.kinds])
        self.upstream = upstream.rstrip("/")
        self.rate, self.hang_s = rate, hang_s
        self.ledger = FaultLedger(give_up_after=give_up_after)
        self._rng = np.random.default_rng(seed)
        self._lock = threading.Lock()
        self._client = httpx.Client(timeout=httpx.Timeout(upstream_timeout_s))
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> FaultProxy:
        self._thread.start()
        return self

    def drain(self, timeout_s: float = 120.0) -> bool:
        """Wait until every forwarded request has its outcome (a client that gave up on one leaves it in flight
        upstream: it becomes ``late`` when the reply comes back). Read the ledger after this, and before the upstream
        stops. False if some are still pending after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self._lock:
                if self.ledger.pending == 0:
                    return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._client.close()

    def _draw(self, body: bytes) -> tuple[str | None, list[str]]:
        """The fault for this request (None = pass it on) and its slot in the ledger's attempts."""
        key = hashlib.sha256(body).hexdigest()
        with self._lock:
            self.ledger.requests += 1
            kind = (
                self.kinds[int(self._rng.choice(len(self.kinds), p=self.p))] if self._rng.random() < self.rate else None
            )
            slot = [kind or "pending"]
            self.ledger.attempts.setdefault(key, []).append(slot)
            if kind is None:
                self.ledger.forwarded += 1
            else:
                self.ledger.injected[kind] += 1
            return kind, slot

    def _upstream_error(self, what: str) -> None:
        with self._lock:
            self.ledger.upstream_errors += 1
            if len(self.ledger.upstream_samples) < 5:
                self.ledger.upstream_samples.append(what)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _send(
                self, status: int, data: bytes, headers: Mapping[str, str] | None = None, length: int = -1
            ) -> None:
                self.send_response(status)
                if self.close_connection:  # tell the client not to reuse it: a retry sent on a socket the proxy is
                    self.send_header("Connection", "close")  # closing fails before the proxy sees it (unledgered)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data) if length < 0 else length))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)
                self.wfile.flush()

            def do_GET(self) -> None:
                r = proxy._client.get(proxy.upstream + self.path)
                self._send(r.status_code, r.content)

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                kind, slot = proxy._draw(body)
                if kind is None:
                    try:
                        r = proxy._client.post(
                            proxy.upstream + self.path, content=body, headers={"Content-Type": "application/json"}
                        )
                    except httpx.HTTPError as e:
                        proxy._upstream_error(f"{type(e).__name__}: {e}")
                        # relayed as a 502, a failed attempt the client retries like any 5xx (not an injected
                        # fault, but it counts in the run: upstream_errors says how many there were)
                        r = httpx.Response(502, content=f"upstream failed: {e}".encode())
                    if r.status_code != 200:
                        proxy._upstream_error(f"HTTP {r.status_code}: {r.text[:300]}")
                    try:
                        if _peer_closed(self.connection):
                            raise ConnectionAbortedError
                        self._send(r.status_code, r.content)
                        slot[0] = "ok" if r.status_code == 200 else f"upstream_{r.status_code}"
                    except OSError:  # the client timed out and closed the connection: it met a timeout
                        slot[0] = "late"
                        with proxy._lock:
                            proxy.ledger.late_replies += 1
                    return
                self.close_connection = True
                if kind.startswith("http_"):
                    code = int(kind.split("_")[1])
                    self._send(code, b"injected fault", {"Retry-After": "0"} if code == 429 else None)
                elif kind == "timeout":
                    time.sleep(proxy.hang_s)
                elif kind == "reset":
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                elif kind == "truncated":
                    self._send(200, _CANNED[: len(_CANNED) // 2], length=len(_CANNED))
                elif kind == "cut_json":
                    self._send(200, _CANNED[: len(_CANNED) // 2])
                elif kind == "non_json":
                    self._send(200, b"<html><body><h1>502 Bad Gateway</h1></body></html>")
                else:  # bad_schema
                    self._send(200, json.dumps({"choices": [{"message": {"content": 42}}], "usage": {}}).encode())

        return Handler


def _peer_closed(sock: socket.socket) -> bool:
    """Whether the client has closed its end (it stopped waiting): readable with nothing to read."""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
        return bool(readable) and sock.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True


__all__ = ["CAUSE_OF", "FAULT_KINDS", "FaultLedger", "FaultProxy"]
