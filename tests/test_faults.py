"""Faults end an episode, not a run: a backend failure after its own retries (or an exception inside a backend)
ends that one episode as *errored*, on record with its cause; the run goes on, summaries count errors apart from
task failures, datasets leave them out, and an episode-level retry policy can replay them.

Real parts: the rollout engine, the arithmetic env and its calculator, the trajectory store, the dataset builder,
the HTTP backend against a local HTTP server, llama.cpp (SmolLM2) and a transformers model built from a config.
The faulty LLM worker is a scripted backend wrapped to fail on chosen tasks."""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Callable, Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from envs.tasks.registry import get_family
from orchestra.backends import (
    BackendError,
    ChatMessage,
    Completion,
    Failure,
    GenerationParams,
    GenerationRequest,
    generate_settled,
)
from orchestra.backends.http import OpenAIHTTPBackend
from orchestra.report.evaluation import paired_row, summarize
from orchestra.runtime.conductors import conductor_factory
from orchestra.runtime.rollout import RolloutEngine, plan_jobs
from orchestra.runtime.team_file import TeamSpec
from orchestra.runtime.workers import Worker
from policies.learning.dataset import DatasetFilter, build_dataset
from trajectories import Episode, EpisodeError, SchemaError, TrajectoryWriter, read_trajectories
from trajectories import summarize as traj_summarize

from .scripted import arithmetic_team, scripted_workers


def chat(text: str, **params: Any) -> GenerationRequest:
    return GenerationRequest(messages=(ChatMessage("user", text),), params=GenerationParams(**params))


# ------------------------------------------------------------------------------------------ engine level
class FaultyBackend:
    """Wraps a backend; a request of a task in ``fail`` fails (``BackendError`` with ``cause``, or a plain exception
    when ``cause`` is None) for its first ``times`` attempts, then is served. Settles per request."""

    def __init__(self, inner: Any, fail: set[str], cause: str | None = "http_503", times: int = 10**9) -> None:
        self.inner, self.fail, self.cause, self.times = inner, fail, cause, times
        self.model_id = inner.model_id
        self.seen: dict[str, int] = {}

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        out = self.generate_settled(requests)
        for c in out:
            if isinstance(c, Failure):
                raise BackendError(c.message, cause=c.cause)
        return [c for c in out if isinstance(c, Completion)]

    def generate_settled(self, requests: Sequence[GenerationRequest]) -> list[Completion | Failure]:
        out: list[Completion | Failure] = []
        for r in requests:
            tid = r.context["task"].id
            if tid in self.fail:
                self.seen[tid] = self.seen.get(tid, 0) + 1
                if self.seen[tid] <= self.times:
                    out.append(Failure(self.cause or "backend_exception", f"injected fault on {tid}"))
                    continue
            out.extend(self.inner.generate([r]))
        return out


def faulty_workers(team: TeamSpec, fail: set[str], **kw: Any) -> dict[str, Worker]:
    workers = scripted_workers(team)
    backend = FaultyBackend(workers["solver"].backend, fail, **kw)
    for name, w in workers.items():
        if w.kind == "llm":
            workers[name] = dataclasses.replace(w, backend=backend)
    return workers


def run(team: TeamSpec, workers: dict[str, Worker], path: Path, n: int = 8, retries: int = 0) -> RolloutEngine:
    family = get_family(team.family)
    engine = RolloutEngine(
        team,
        family,
        workers,
        conductor_factory("pipeline", team, 0),
        conductor_name="pipeline",
        num_envs=4,
        progress=False,
        episode_retries=retries,
    )
    with TrajectoryWriter(path, resume=path.exists()) as w:  # as `orchestra record --resume`: skip what is done
        engine.run([j for j in plan_jobs(family.generate("test", n, 3), 3, "f") if j.episode_id not in w.done_ids], w)
    return engine


def transcript(e: Episode) -> list[Any]:
    return [(s.action.id, s.message.text if s.message else None) for s in e.steps]


def test_a_fault_ends_its_episode_not_the_run(tmp_path: Path) -> None:
    team = arithmetic_team()
    run(team, scripted_workers(team), tmp_path / "clean.jsonl")
    clean = read_trajectories(tmp_path / "clean.jsonl")
    tasks = [e.task.id for e in clean.episodes]
    bad = {tasks[1], tasks[5]}
    engine = run(team, faulty_workers(team, bad), tmp_path / "faulty.jsonl")
    report = read_trajectories(tmp_path / "faulty.jsonl")
    assert report.ok and len(report.episodes) == 8  # every planned episode, once
    by_id = {e.episode_id: e for e in report.episodes}
    for ref in clean.episodes:
        got = by_id[ref.episode_id]
        if ref.task.id in bad:
            assert got.error is not None and got.error.cause == "http_503" and got.error.worker is not None
            assert not got.success and got.error.attempts == 1 and "injected fault" in got.error.message
            assert transcript(got) == transcript(ref)[: len(got.steps)]  # what came before the fault, unchanged
        else:  # the other envs of the same batches are untouched by their neighbours' faults
            assert got.error is None and transcript(got) == transcript(ref) and got.success == ref.success
    assert engine.stats.errors == {"http_503": 2} and engine.stats.turn_faults == 2
    assert engine.stats.as_metrics()["faults/errored_episodes"] == 2
    # summaries count faults apart from task failures
    s = traj_summarize(report.episodes)
    assert s["count"] == 6 and s["errors"] == {"count": 2, "by_cause": {"http_503": 2}}
    ok = [e for e in clean.episodes if e.task.id not in bad]
    assert s["success_rate"] == pytest.approx(sum(e.success for e in ok) / 6)
    (row,) = summarize(report.episodes, n_resamples=50)
    assert row.episodes == 6 and row.errored == 2
    # a paired comparison drops the faulted pairs instead of scoring them as failures
    pr = paired_row(report.episodes, clean.episodes, n_resamples=50)
    assert pr.n_pairs == 6
    # datasets leave errored episodes out unless asked
    assert {i.episode_id for i in build_dataset([tmp_path / "faulty.jsonl"], team.env, _encoder(team)).episodes} == {
        e.episode_id for e in report.episodes if e.error is None
    }
    with_errors = build_dataset(
        [tmp_path / "faulty.jsonl"], team.env, _encoder(team), filters=DatasetFilter(include_errors=True)
    )
    assert len(with_errors.episodes) == 6 + sum(1 for e in report.episodes if e.error is not None and e.steps)
    # a resumed recording treats errored episodes as done: nothing duplicated
    run(team, scripted_workers(team), tmp_path / "faulty.jsonl")
    again = read_trajectories(tmp_path / "faulty.jsonl")
    assert again.ok and len(again.episodes) == 8


def _encoder(team: TeamSpec) -> Any:
    from envs.team_env import TeamEnv

    return TeamEnv(team.env, get_family(team.family)).encoder


def test_plain_exceptions_inside_a_backend_are_faults_too(tmp_path: Path) -> None:
    team = arithmetic_team()
    family = get_family(team.family)
    tid = family.generate("test", 8, 3)[2].id
    engine = run(team, faulty_workers(team, {tid}, cause=None), tmp_path / "x.jsonl")
    errs = [e for e in read_trajectories(tmp_path / "x.jsonl").episodes if e.error is not None]
    assert [e.task.id for e in errs] == [tid] and errs[0].error is not None
    assert errs[0].error.cause == "backend_exception" and engine.stats.errors == {"backend_exception": 1}


def test_phase_two_refuses_to_learn_from_a_faulted_episode(tmp_path: Path) -> None:
    """Phase 2 (orchestra/teamtr/llm.py) runs its batches through require_no_faults: a fault stops the stage."""
    from orchestra.runtime.rollout import require_no_faults

    team = arithmetic_team()
    tid = get_family(team.family).generate("test", 8, 3)[4].id
    run(team, faulty_workers(team, {tid}), tmp_path / "x.jsonl")
    eps = read_trajectories(tmp_path / "x.jsonl").episodes
    with pytest.raises(BackendError, match="1 episode.*of a training batch.*http_503") as err:
        require_no_faults(eps, "a training batch")
    assert err.value.cause == "http_503"
    clean = [e for e in eps if e.error is None]
    assert require_no_faults(clean, "a training batch") is clean


def test_episode_retries_replay_a_faulted_episode_from_its_start(tmp_path: Path) -> None:
    team = arithmetic_team()
    run(team, scripted_workers(team), tmp_path / "clean.jsonl")
    clean = {e.episode_id: e for e in read_trajectories(tmp_path / "clean.jsonl").episodes}
    tasks = sorted({e.task.id for e in clean.values()})
    bad = {tasks[0], tasks[3], tasks[6]}
    # a transient fault (the first attempt only) with one retry: every episode as if nothing happened
    engine = run(team, faulty_workers(team, bad, times=1), tmp_path / "r1.jsonl", retries=1)
    got = {e.episode_id: e for e in read_trajectories(tmp_path / "r1.jsonl").episodes}
    assert all(e.error is None for e in got.values())
    assert {k: transcript(e) for k, e in got.items()} == {k: transcript(e) for k, e in clean.items()}
    assert engine.stats.episode_retries == 3 and engine.stats.turn_faults == 3 and engine.stats.errors == {}
    # a persistent fault: retried, then recorded with the number of attempts
    engine = run(team, faulty_workers(team, bad), tmp_path / "r2.jsonl", retries=2)
    errs = [e for e in read_trajectories(tmp_path / "r2.jsonl").episodes if e.error is not None]
    assert len(errs) == 3 and all(e.error is not None and e.error.attempts == 3 for e in errs)
    assert engine.stats.episode_retries == 6 and engine.stats.turn_faults == 9
    with pytest.raises(ValueError, match="episode_retries"):
        run(team, scripted_workers(team), tmp_path / "r3.jsonl", retries=-1)


def test_a_batch_that_raises_is_settled_one_request_at_a_time() -> None:
    """A backend without generate_settled: a failed batch is retried request by request."""

    class Picky:
        model_id = "picky"

        def __init__(self) -> None:
            self.calls: list[int] = []

        def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
            self.calls.append(len(requests))
            if any("bad" in r.messages[0].content for r in requests):
                raise RuntimeError("boom\nsecond line")
            return [Completion("ok", (), (), "stop", _usage(), "picky") for _ in requests]

    b = Picky()
    out = generate_settled(b, [chat("a"), chat("bad"), chat("c")])
    assert [type(x).__name__ for x in out] == ["Completion", "Failure", "Completion"] and b.calls == [3, 1, 1, 1]
    f = out[1]
    assert isinstance(f, Failure) and f.cause == "backend_exception" and f.message == "RuntimeError: boom"


def _usage() -> Any:
    from orchestra.backends import Usage

    return Usage(1, 1)


# ------------------------------------------------------------------------------------------ schema
def test_errored_episode_record_round_trips_and_cannot_be_a_success(tmp_path: Path) -> None:
    team = arithmetic_team()
    every = {t.id for t in get_family("arithmetic").generate("test", 2, 3)}
    run(team, faulty_workers(team, every), tmp_path / "e.jsonl", n=2)
    ep = read_trajectories(tmp_path / "e.jsonl").episodes[0]
    assert ep.error is not None and ep.errored
    d = json.loads(json.dumps(ep.to_dict()))
    assert Episode.from_dict(d) == ep and d["error"]["cause"] == "http_503"
    with pytest.raises(SchemaError, match="success"):
        Episode.from_dict({**d, "success": True})
    with pytest.raises(SchemaError, match=r"error\.attempts"):
        Episode.from_dict({**d, "error": {**d["error"], "attempts": 0}})
    with pytest.raises(SchemaError, match=r"error\.colour"):
        Episode.from_dict({**d, "error": {**d["error"], "colour": 1}})
    ok = Episode.from_dict({**d, "error": None, "success": True})
    assert "error" not in ok.to_dict()  # an ordinary episode's JSON has no error key (files as before)
    assert EpisodeError("timeout", "x").attempts == 1


# ------------------------------------------------------------------------------------------ HTTP backend
class Scripted:
    """A local HTTP server answering from a list of (status, body) replies, in order (the last one repeats)."""

    def __init__(self, replies: Callable[[dict[str, Any]], tuple[int, Any]]) -> None:
        self.seen: list[dict[str, Any]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.seen.append(body)
                status, reply = replies(body)
                data = reply.encode() if isinstance(reply, str) else json.dumps(reply).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def server() -> Iterator[Callable[..., Scripted]]:
    made: list[Scripted] = []

    def make(replies: Callable[[dict[str, Any]], tuple[int, Any]]) -> Scripted:
        made.append(Scripted(replies))
        return made[-1]

    yield make
    for s in made:
        s.close()


def good(text: str = "ok") -> dict[str, Any]:
    return {
        "choices": [{"message": {"role": "assistant", "content": text}, "finish_reason": "stop", "logprobs": None}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1},
    }


def sequence(*replies: tuple[int, Any]) -> Callable[[dict[str, Any]], tuple[int, Any]]:
    left = list(replies)
    return lambda body: left.pop(0) if len(left) > 1 else left[0]


@pytest.mark.parametrize(
    ("bad", "cause"),
    [
        ((200, "<html>502 Bad Gateway</html>"), "non_json"),
        ((200, '{"choices": [{"message": {"content": "cut'), "non_json"),
        ((200, {"choices": []}), "malformed_reply"),
        ((200, {"choices": [{"message": {"content": 3}, "finish_reason": "stop"}], "usage": {}}), "malformed_reply"),
        ((503, "busy"), "http_503"),
        ((429, {"error": "slow down"}), "http_429"),
    ],
)
def test_http_malformed_and_non_json_200_replies_are_retried(
    server: Callable[..., Scripted], bad: tuple[int, Any], cause: str
) -> None:
    srv = server(sequence(bad, bad, (200, good("fine"))))
    (c,) = OpenAIHTTPBackend(srv.url, model="m", max_retries=2, backoff_s=0.0).generate([chat("hi")])
    assert c.text == "fine" and len(srv.seen) == 3
    srv2 = server(sequence(bad))
    with pytest.raises(BackendError) as err:
        OpenAIHTTPBackend(srv2.url, model="m", max_retries=1, backoff_s=0.0).generate([chat("hi")])
    assert err.value.cause == cause and len(srv2.seen) == 2 and "after 2 attempts" in str(err.value)


def test_http_client_errors_are_not_retried_and_timeouts_are_named(server: Callable[..., Scripted]) -> None:
    srv = server(sequence((400, {"error": "context too long"})))
    with pytest.raises(BackendError) as err:
        OpenAIHTTPBackend(srv.url, model="m", max_retries=3, backoff_s=0.0).generate([chat("hi")])
    assert err.value.cause == "http_400" and len(srv.seen) == 1
    import socket

    with socket.socket() as s:  # listening but never answering: a read timeout
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        silent = OpenAIHTTPBackend(f"http://127.0.0.1:{s.getsockname()[1]}", model="m", timeout_s=0.2, max_retries=1)
        with pytest.raises(BackendError) as err:
            silent.generate([chat("hi")])
        assert err.value.cause == "timeout"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: connection refused
        refused = OpenAIHTTPBackend(f"http://127.0.0.1:{port}", model="m", max_retries=0)
        with pytest.raises(BackendError) as err:
            refused.generate([chat("hi")])
        assert err.value.cause == "connection"


def test_http_settles_each_request_of_a_batch(server: Callable[..., Scripted]) -> None:
    srv = server(lambda body: (500, "no") if body["messages"][0]["content"] == "bad" else (200, good("yes")))
    b = OpenAIHTTPBackend(srv.url, model="m", max_retries=1, backoff_s=0.0)
    out = b.generate_settled([chat("a"), chat("bad"), chat("c")])
    assert isinstance(out[0], Completion) and isinstance(out[2], Completion) and out[0].text == "yes"
    assert isinstance(out[1], Failure) and out[1].cause == "http_500"
    assert len(srv.seen) == 4  # the good ones once, the bad one twice: nothing re-sent because of a neighbour
    with pytest.raises(BackendError, match="HTTP 500"):
        b.generate([chat("a"), chat("bad")])


def test_the_response_cache_settles_and_never_stores_a_failure(server: Callable[..., Scripted], tmp_path: Path) -> None:
    from orchestra.backends import CachedBackend, ResponseCache

    calls = {"bad": 0}

    def reply(body: dict[str, Any]) -> tuple[int, Any]:
        if body["messages"][0]["content"] == "bad":
            calls["bad"] += 1
            return (503, "down") if calls["bad"] == 1 else (200, good("late"))
        return (200, good("yes"))

    srv = server(reply)
    cached = CachedBackend(OpenAIHTTPBackend(srv.url, model="m", max_retries=0), ResponseCache(tmp_path / "c.sqlite"))
    first = cached.generate_settled([chat("a"), chat("bad")])
    assert isinstance(first[0], Completion) and isinstance(first[1], Failure)
    second = cached.generate_settled([chat("a"), chat("bad")])
    assert isinstance(second[0], Completion) and second[0].cached  # stored
    assert isinstance(second[1], Completion) and second[1].text == "late" and not second[1].cached  # not stored


# ------------------------------------------------------------------------------------------ real in-process backends
@pytest.mark.slow
def test_llamacpp_a_prompt_too_long_fails_alone() -> None:
    from orchestra.backends.llamacpp import LlamaCppBackend

    b = LlamaCppBackend("smollm2", n_ctx=96, batch_size=2, prefix_cache=0)
    out = generate_settled(b, [chat("Say hi.", max_tokens=4), chat("word " * 200, max_tokens=4)])
    assert isinstance(out[0], Completion) and out[0].usage.completion_tokens > 0
    assert isinstance(out[1], Failure) and out[1].cause == "context_overflow" and "n_ctx=96" in out[1].message


def test_transformers_an_exception_inside_the_model_fails_alone() -> None:
    """A token id beyond the model's vocabulary makes the embedding lookup raise inside torch."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    from orchestra.backends.hf import TransformersBackend

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=16,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=128,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=0,
    )
    words = ["<pad>", "<eos>", "<unk>", "user", "assistant", ":"] + [f"w{i}" for i in range(40)]
    tk = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")
    tok.chat_template = "{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} {% endfor %}assistant :"
    b = TransformersBackend.from_model(LlamaForCausalLM(cfg).eval(), tok, "tiny", max_batch_size=4)
    out = generate_settled(b, [chat("w1 w2", max_tokens=3), chat("w39", max_tokens=3), chat("w3", max_tokens=3)])
    assert isinstance(out[0], Completion) and isinstance(out[2], Completion)
    assert isinstance(out[1], Failure) and out[1].cause == "backend_exception" and "IndexError" in out[1].message


def test_the_proxy_ledger_counts_failed_runs_as_the_client_met_them() -> None:
    from collections import Counter

    from orchestra.backends.fault_proxy import FaultLedger

    led = FaultLedger(give_up_after=2)
    led.attempts = {
        "a": [["http_500"], ["late"]],  # a fault, then a reply the client had stopped waiting for: gives up
        "b": [["http_500"], ["ok"], ["non_json"], ["reset"]],  # recovers once, then gives up on a reset
        "c": [["late"], ["ok"]],
        "d": [["bad_schema"], ["bad_schema"], ["bad_schema"]],  # gives up once; the replay's first attempt failed
    }
    assert led.unrecoverable == Counter({"timeout": 1, "reset": 1, "bad_schema": 1})
    assert led.unrecoverable_causes() == Counter({"timeout": 1, "connection": 1, "malformed_reply": 1})
    led.attempts["e"] = [["upstream_503"], ["non_json"]]  # an upstream 503 relayed as it came fails the attempt too
    assert led.unrecoverable_causes()["http_503"] == 0 and led.unrecoverable_causes()["non_json"] == 1
    led.attempts["f"] = [["non_json"], ["upstream_503"]]
    assert led.unrecoverable_causes()["http_503"] == 1


def test_the_proxy_waits_for_replies_the_client_gave_up_on(server: Callable[..., Scripted]) -> None:
    """A client that times out leaves its request in flight upstream; until the reply comes back the attempt's
    outcome is unknown, and a ledger read then would miss a failed attempt (and an unrecoverable run)."""
    import time

    import httpx

    from orchestra.backends.fault_proxy import FaultProxy

    def slow_then_busy(body: dict[str, Any]) -> tuple[int, Any]:
        if body["n"] == 0:
            time.sleep(1.0)
            return 200, good()
        return 503, "busy"

    srv = server(slow_then_busy)
    with FaultProxy(srv.url, rate=0.0, give_up_after=2) as px:
        with pytest.raises(httpx.TimeoutException):
            httpx.post(px.url + "/v1/chat/completions", json={"n": 0}, timeout=0.2)
        assert px.ledger.pending == 1  # still upstream
        assert px.drain(timeout_s=10)
        assert httpx.post(px.url + "/v1/chat/completions", json={"n": 1}, timeout=5).status_code == 503
        assert px.drain(timeout_s=10)
        outcomes = sorted(o for events in px.ledger.attempts.values() for (o,) in events)
    assert outcomes == ["late", "upstream_503"] and px.ledger.upstream_errors == 1 and px.ledger.faults == 0


# ------------------------------------------------------------------------------------------ the soak, short
@pytest.mark.slow
def test_fault_soak_short(tmp_path: Path) -> None:
    """`benchmarks/faults.py` on a real llama.cpp server behind the fault proxy, short: half the requests faulted,
    one retry per request so that faults often exhaust it. No crash, every planned episode once, and the errored
    episodes equal the unrecoverable faults the proxy injected, cause by cause."""
    from benchmarks.faults import run as soak

    f = soak(episodes=16, rate=0.5, max_retries=1, max_tokens=6, num_envs=4, seed=1, out=tmp_path, progress=False)
    assert f["crashes"] == 0, f["crash"]
    assert f["lost"] == 0 and f["duplicated"] == 0 and f["damaged_lines"] == 0 and f["episodes_recorded"] == 16
    assert f["faults_injected"] >= 10 and f["unrecoverable"] >= 1 and f["upstream_errors"] == 0
    assert f["errors_match_unrecoverable"], (f["errored_by_cause"], f["unrecoverable_by_cause"])
    assert f["errored_episodes"] < 16  # and some episodes got through
