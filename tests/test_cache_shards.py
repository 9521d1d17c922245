"""Response shards: a cache exported to xz JSONL and imported elsewhere answers the same requests with the same
completions (text, token ids, log-probs bit for bit); ``--exclude`` ships only what is new; a damaged shard is one
error line naming its file and line, and adds nothing."""

from __future__ import annotations

import lzma
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestra.backends.base import ChatMessage, Completion, GenerationParams, GenerationRequest, Usage
from orchestra.backends.cache import (
    CachedBackend,
    ResponseCache,
    ShardError,
    export_responses,
    import_responses,
    request_key,
)


class Counting:
    model_id = "m"

    def __init__(self) -> None:
        self.calls = 0

    def generate(self, requests: list[GenerationRequest]) -> list[Completion]:
        self.calls += len(requests)
        return [
            Completion(
                f"reply {r.messages[0].content}", (1, 2), (-0.1234567891234, float("-inf")), "stop", Usage(3, 2), "m"
            )
            for r in requests
        ]


def req(text: str) -> GenerationRequest:
    return GenerationRequest(messages=(ChatMessage("user", text),), params=GenerationParams(max_tokens=4))


def fill(path: Path, texts: list[str]) -> ResponseCache:
    cache = ResponseCache(path)
    CachedBackend(Counting(), cache).generate([req(t) for t in texts])  # type: ignore[arg-type]
    return cache


def test_an_imported_shard_replays_exactly_what_was_generated(tmp_path: Path) -> None:
    src = fill(tmp_path / "a.sqlite", ["x", "y", "z"])
    assert export_responses(src, tmp_path / "s1.jsonl.xz") == 3
    dst = ResponseCache(tmp_path / "b.sqlite")
    assert import_responses(dst, [tmp_path / "s1.jsonl.xz"]) == (3, 3)
    assert import_responses(dst, [tmp_path / "s1.jsonl.xz"]) == (0, 3)  # idempotent
    inner = Counting()
    replay = CachedBackend(inner, dst).generate([req("x"), req("y"), req("z")])  # type: ignore[arg-type]
    assert inner.calls == 0  # every request answered from the imported replies
    for r, c in zip(["x", "y", "z"], replay, strict=True):
        k = request_key("m", req(r))
        original = src.get(k)
        assert original is not None and c.text == original.text == f"reply {r}"
        assert c.token_ids == original.token_ids and c.logprobs == original.logprobs  # -inf included


def test_exclude_ships_only_the_new_replies(tmp_path: Path) -> None:
    src = fill(tmp_path / "a.sqlite", ["x", "y"])
    export_responses(src, tmp_path / "s1.jsonl.xz")
    fill(tmp_path / "a.sqlite", ["z"])
    assert export_responses(src, tmp_path / "s2.jsonl.xz", exclude=[tmp_path / "s1.jsonl.xz"]) == 1
    dst = ResponseCache(tmp_path / "b.sqlite")
    assert import_responses(dst, [tmp_path / "s1.jsonl.xz", tmp_path / "s2.jsonl.xz"]) == (3, 3)


@pytest.mark.parametrize(
    ("content", "where"),
    [
        (b'{"key": "k"}\n', ":1: not a response record"),
        (b"not json\n", ":1: not a response record"),
    ],
)
def test_a_damaged_shard_is_one_line_naming_file_and_line_and_adds_nothing(
    tmp_path: Path, content: bytes, where: str
) -> None:
    good = fill(tmp_path / "a.sqlite", ["x"])
    export_responses(good, tmp_path / "good.jsonl.xz")
    bad = tmp_path / "bad.jsonl.xz"
    bad.write_bytes(lzma.compress(content))
    dst = ResponseCache(tmp_path / "b.sqlite")
    with pytest.raises(ShardError, match=f"bad.jsonl.xz{where}"):
        import_responses(dst, [tmp_path / "good.jsonl.xz", bad])
    assert len(dst) == 0
    (tmp_path / "plain.jsonl.xz").write_text("not xz")
    with pytest.raises(ShardError, match="not an xz-compressed JSONL response shard"):
        import_responses(dst, [tmp_path / "plain.jsonl.xz"])


@pytest.mark.slow
def test_the_cache_command(tmp_path: Path) -> None:
    fill(tmp_path / "a.sqlite", ["x", "y"])
    run = lambda *a: subprocess.run(  # noqa: E731
        [sys.executable, "-m", "orchestra", "cache", *a], capture_output=True, text=True, env=dict(os.environ)
    )
    r = run("export", "--cache", str(tmp_path / "a.sqlite"), "--out", str(tmp_path / "s.jsonl.xz"))
    assert r.returncode == 0 and "wrote 2 replies of 2" in r.stdout
    r = run("import", str(tmp_path / "s.jsonl.xz"), "--cache", str(tmp_path / "b.sqlite"))
    assert r.returncode == 0 and "imported 2 new replies (0 already cached)" in r.stdout
    r = run("stats", "--cache", str(tmp_path / "b.sqlite"))
    assert "2 replies" in r.stdout and "m" in r.stdout
    (tmp_path / "bad.jsonl.xz").write_bytes(lzma.compress(b"[1]\n"))
    r = run("import", str(tmp_path / "bad.jsonl.xz"), "--cache", str(tmp_path / "b.sqlite"))
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "bad.jsonl.xz:1" in r.stderr
