"""A SQLite response cache, so re-running recorded work is free.

Greedy (temperature-0) requests are cached: their output is a function of (model, prompt, parameters),
so a hit returns exactly what generation would have produced. A sampled request is cached only where
the backend draws it from its own seed and the request's and says so (``seeded_sampling``: llama.cpp
draws from ``np.random.default_rng([backend seed, request seed])`` with fixed weights); then the sample
is a function of (model, prompt, parameters with the seed, backend seed), the key holds all four, and a
hit is exactly the sample the backend would draw. The transformers backend does not declare it: its
LoRA adapters change during fine-tuning under the same name. Each turn of an episode carries its own seed
(``orchestra.runtime.rollout.turn_seed``), so asking a worker again still draws afresh. Samples from a
server (HTTP) are never cached: its seed handling is not ours to vouch for.

Storage is one table in a SQLite file in WAL mode (https://www.sqlite.org/wal.html): readers never
block each other nor the writer, so several rollout workers (threads or processes) may share a file.

A cache travels as xz-compressed JSONL shards (:func:`export_responses`, :func:`import_responses`; ``orchestra cache
export | import``): one stored reply per line, exactly as stored, so importing a shard makes a fresh clone replay
those requests as the machine that exported them generated them. ``docs/results/responses/`` holds the shards of
the phase-1 run of docs/results/conductor-summary.md.
"""

from __future__ import annotations

import hashlib
import json
import lzma
import random
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from orchestra.backends.base import Backend, Completion, Failure, GenerationRequest, Usage, generate_settled

_BUSY_TIMEOUT_S = 30.0  # how long a connection waits for another's lock
SCHEMA_VERSION = 1  # bump when the key recipe or the stored completion format changes

_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    key TEXT PRIMARY KEY,
    model_id TEXT NOT NULL,
    completion TEXT NOT NULL,
    created REAL NOT NULL
)
"""


def request_key(model_id: str, request: GenerationRequest, namespace: str = "") -> str:
    """sha256 of the canonical JSON of (model, messages, parameters, adapter[, namespace]).

    Canonical = sorted keys, no whitespace, UTF-8; the key recipe version is part of the hash so an
    old file can never answer under a new recipe. The adapter is part of the key because one base
    model with two LoRA adapters is two policies. ``namespace`` separates decoding plans of one model
    whose outputs may round differently (the batched llama.cpp path: ``cache_namespace``); the empty
    namespace leaves the key as it always was.
    """
    payload: dict[str, Any] = {
        "v": SCHEMA_VERSION,
        "model_id": model_id,
        "messages": [[m.role, m.content] for m in request.messages],
        "params": request.params.to_dict(),
        "adapter": request.context.get("adapter"),
    }
    if namespace:
        payload["namespace"] = namespace
    blob = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def completion_to_dict(c: Completion) -> dict[str, Any]:
    return {
        "text": c.text,
        "token_ids": list(c.token_ids),
        "logprobs": list(c.logprobs),  # json writes repr(float): round-trips exactly
        "finish_reason": c.finish_reason,
        "usage": [c.usage.prompt_tokens, c.usage.completion_tokens],
        "model_id": c.model_id,
        "metadata": dict(c.metadata),
    }


def completion_from_dict(d: dict[str, Any]) -> Completion:
    return Completion(
        text=d["text"],
        token_ids=tuple(d["token_ids"]),
        logprobs=tuple(d["logprobs"]),
        finish_reason=d["finish_reason"],
        usage=Usage(*d["usage"]),
        model_id=d["model_id"],
        metadata=d["metadata"],
    )


class ResponseCache:
    """SQLite key → completion store. One connection per thread (sqlite3 connections are not shared)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()
        self._conns: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        self._setup(self._conn())

    @staticmethod
    def _setup(conn: sqlite3.Connection, wait_s: float = _BUSY_TIMEOUT_S) -> None:
        """WAL mode and the table, retried while another process does the same to a fresh file.

        Two connections that both escalate their lock to switch a new file to WAL deadlock; SQLite answers one of
        them "database is locked" at once instead of calling its busy handler (https://www.sqlite.org/c3ref/busy_handler.html),
        so the connect timeout alone does not cover it: that one rolls back and tries again until ``wait_s``.
        """
        deadline = time.monotonic() + wait_s
        rng = random.Random()
        while True:
            try:
                if str(conn.execute("PRAGMA journal_mode").fetchone()[0]).lower() != "wal":
                    conn.execute("PRAGMA journal_mode=WAL")
                conn.execute(_SCHEMA)
                conn.commit()
                return
            except sqlite3.OperationalError as e:
                if ("locked" not in str(e) and "busy" not in str(e)) or time.monotonic() > deadline:
                    raise
                conn.rollback()
                time.sleep(rng.uniform(0.01, 0.1))

    def __repr__(self) -> str:
        return f"ResponseCache({str(self.path)!r})"

    def _conn(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            # timeout: wait for a concurrent writer's lock instead of failing ("database is locked").
            conn = sqlite3.connect(self.path, timeout=_BUSY_TIMEOUT_S, check_same_thread=False)
            conn.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: durable across app crashes
            self._local.conn = conn
            with self._lock:
                self._conns.append(conn)
        return conn

    def get(self, key: str) -> Completion | None:
        row = self._conn().execute("SELECT completion FROM responses WHERE key = ?", (key,)).fetchone()
        return None if row is None else completion_from_dict(json.loads(row[0]))

    def put(self, key: str, completion: Completion) -> None:
        conn = self._conn()
        blob = json.dumps(completion_to_dict(completion), ensure_ascii=False)
        conn.execute(
            "INSERT OR REPLACE INTO responses (key, model_id, completion, created) VALUES (?, ?, ?, ?)",
            (key, completion.model_id, blob, time.time()),
        )
        conn.commit()

    def __len__(self) -> int:
        return int(self._conn().execute("SELECT COUNT(*) FROM responses").fetchone()[0])

    def rows(self) -> Iterator[tuple[str, str, str, float]]:
        """Every stored (key, model_id, completion JSON, created), oldest first."""
        yield from self._conn().execute(
            "SELECT key, model_id, completion, created FROM responses ORDER BY created, key"
        )

    def put_raw(self, rows: Sequence[tuple[str, str, str, float]]) -> int:
        """Store rows as :meth:`rows` gives them, keeping what is already there; the number added."""
        conn = self._conn()
        before = conn.total_changes
        conn.executemany(
            "INSERT OR IGNORE INTO responses (key, model_id, completion, created) VALUES (?, ?, ?, ?)", rows
        )
        conn.commit()
        return conn.total_changes - before

    def close(self) -> None:
        with self._lock:
            for conn in self._conns:
                conn.close()
            self._conns.clear()
        self._local = threading.local()


def is_cacheable(request: GenerationRequest, seeded_sampling: bool = False) -> bool:
    """Greedy LLM requests, and sampled ones from a backend with ``seeded_sampling``. Tool requests carry
    a task the key does not cover: never cached."""
    if "tool" in request.context:
        return False
    return request.params.temperature == 0.0 or seeded_sampling


class CachedBackend:
    """Wrap a backend: cacheable requests (:func:`is_cacheable`) are looked up first; all misses go to ``inner`` in ONE
    batched call (so batching is preserved), and their completions are stored. Hits come back with
    ``cached=True``. Completions that finished with ``"error"`` are not stored.

    Counters: ``hits``/``misses`` count cacheable requests; ``bypassed`` counts the others.
    """

    def __init__(self, inner: Backend, cache: ResponseCache) -> None:
        self.inner = inner
        self.cache = cache
        self.namespace = str(getattr(inner, "cache_namespace", ""))
        self.seeded_sampling = bool(getattr(inner, "seeded_sampling", False))
        # a sample depends on the backend's seed too: it is part of a sampled request's key
        self.sampled_namespace = f"{self.namespace}|backend-seed={getattr(inner, 'seed', 0)}"
        self.hits = 0
        self.misses = 0
        self.bypassed = 0
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"CachedBackend({self.inner!r}, {self.cache!r})"

    @property
    def model_id(self) -> str:
        """The inner backend's, read at each request: an HTTP backend's changes when it publishes an adapter version,
        so a reply cached under one version never answers for another."""
        return str(self.inner.model_id)

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        out = self.generate_settled(requests, settle=False)
        return [c for c in out if isinstance(c, Completion)]

    def generate_settled(
        self, requests: Sequence[GenerationRequest], settle: bool = True
    ) -> list[Completion | Failure]:
        """As :meth:`generate`, but a request the inner backend fails comes back as its :class:`Failure`
        (and is not stored) while the others are answered and stored. ``settle=False`` lets the inner
        backend's exception propagate (that is :meth:`generate`)."""
        out: list[Completion | Failure | None] = [None] * len(requests)
        keys: list[str | None] = [None] * len(requests)
        todo: list[int] = []  # indices sent to the inner backend
        first_of_key: dict[str, int] = {}  # identical greedy requests in one call are generated once
        dup_of: dict[int, int] = {}
        hits = misses = bypassed = 0
        for i, request in enumerate(requests):
            if not is_cacheable(request, self.seeded_sampling):
                bypassed += 1
                todo.append(i)
                continue
            ns = self.namespace if request.params.temperature == 0.0 else self.sampled_namespace
            key = keys[i] = request_key(self.model_id, request, ns)
            hit = self.cache.get(key)
            if hit is not None:
                hits += 1
                out[i] = replace(hit, cached=True)
                continue
            misses += 1
            if key in first_of_key:
                dup_of[i] = first_of_key[key]
                continue
            first_of_key[key] = i
            todo.append(i)
        if todo:
            batch = [requests[i] for i in todo]
            fresh = generate_settled(self.inner, batch) if settle else list(self.inner.generate(batch))
            for i, completion in zip(todo, fresh, strict=True):
                out[i] = completion
                stored_key = keys[i]
                if (
                    stored_key is not None
                    and isinstance(completion, Completion)
                    and completion.finish_reason != "error"
                ):
                    self.cache.put(stored_key, completion)
        for i, j in dup_of.items():
            out[i] = out[j]
        with self._lock:
            self.hits += hits
            self.misses += misses
            self.bypassed += bypassed
        assert all(c is not None for c in out)
        return [c for c in out if c is not None]


class ShardError(ValueError):
    """A response shard that cannot be read; the message names the file and line."""


def shard_keys(path: str | Path) -> set[str]:
    """The keys a shard holds."""
    return {key for key, *_ in read_shard(path)}


def read_shard(path: str | Path) -> Iterator[tuple[str, str, str, float]]:
    """The rows of an ``.jsonl.xz`` shard, each checked (a damaged line is a :class:`ShardError` naming it)."""
    path = Path(path)
    try:
        with lzma.open(path, "rt", encoding="utf-8") as f:
            for n, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    d = json.loads(line)
                    key, model_id, created = d["key"], d["model_id"], float(d["created"])
                    completion = json.dumps(d["completion"], ensure_ascii=False)
                    completion_from_dict(d["completion"])  # the stored format: text, token ids, ... all present
                    if not (isinstance(key, str) and len(key) == 64 and isinstance(model_id, str)):
                        raise ValueError("key must be a sha256 hex string and model_id a string")
                except (ValueError, KeyError, TypeError) as e:
                    raise ShardError(f"{path}:{n}: not a response record ({type(e).__name__}: {e})") from None
                yield key, model_id, completion, created
    except (lzma.LZMAError, EOFError, UnicodeDecodeError) as e:
        raise ShardError(f"{path}: not an xz-compressed JSONL response shard ({e})") from None


def export_responses(cache: ResponseCache, out: str | Path, exclude: Sequence[str | Path] = ()) -> int:
    """Write every stored reply that no shard in ``exclude`` holds to ``out`` (``.jsonl.xz``, written whole to a
    temporary file, then renamed); the number written."""
    out = Path(out)
    if not out.name.endswith(".jsonl.xz"):
        raise ShardError(f"{out}: a response shard is named *.jsonl.xz")
    skip: set[str] = set()
    for p in exclude:
        skip |= shard_keys(p)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    n = 0
    with lzma.open(tmp, "wt", encoding="utf-8", preset=9) as f:
        for key, model_id, completion, created in cache.rows():
            if key in skip:
                continue
            row = {"key": key, "model_id": model_id, "created": created, "completion": json.loads(completion)}
            f.write(json.dumps(row, ensure_ascii=False, sort_keys=True) + "\n")
            n += 1
    tmp.replace(out)
    return n


def import_responses(cache: ResponseCache, paths: Sequence[str | Path]) -> tuple[int, int]:
    """Add the replies of shards to ``cache`` (a reply already stored is kept): (added, read). Every shard is read
    and checked before anything is stored, so a damaged one adds nothing."""
    rows = [row for p in paths for row in read_shard(p)]
    return cache.put_raw(rows), len(rows)
