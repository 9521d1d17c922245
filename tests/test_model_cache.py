"""The dequantised cache of the embedded SmolLM2 GGUF (orchestra/backends/model_cache.py): built once in a folder of its
own, it loads the weights bit for bit and the tokenizer token for token as the GGUF does.

The GGUF is read once per module (10-30 s on 2 cores), by the real build of the cache folder; what that read gave is
the reference. It is the read a load with the cache off makes: the same ``from_pretrained(folder, gguf_file=...)``
calls, the model's with ``GgufConfig(dequantize=True)``, which for a llama GGUF changes nothing (transformers unpacks
every tensor on every load; checked below, with tensors dequantised by gguf-py itself). ``benchmarks/model_load.py``
compares a digest of every tensor of a cache-off load and a cached one. Every later test that would build again gets a
counting stand-in for ``load_gguf`` that returns the reference, so a rebuild shows and costs nothing.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from orchestra.backends import model_cache
from orchestra.backends.base import BackendError
from orchestra.backends.hf import quiet_loading
from orchestra.backends.models import ModelSource, resolve_model

pytestmark = pytest.mark.slow

TEXTS = ("Hello world!", "  2+2 = 4\n\nAnswer: 4", "ünïcødé 日本語 <|im_start|>user\nhi<|im_end|>", "")
CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "4"},
    {"role": "user", "content": "And 3+3?"},
]


@pytest.fixture(scope="module")
def source() -> ModelSource:
    return resolve_model("smollm2")


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="module")
def build(source: ModelSource, root: Path) -> tuple[Path, tuple[Any, Any]]:
    """The cache folder, built once for real through :func:`model_cache.cached_folder` (checked in the first test),
    and the (tokenizer, float32 model) the build read from the GGUF."""
    loaded: list[tuple[Any, Any]] = []

    def load_gguf(src: ModelSource) -> tuple[Any, Any]:
        loaded.append(real(src))
        return loaded[-1]

    real = model_cache.load_gguf
    with pytest.MonkeyPatch.context() as mp, quiet_loading():
        mp.setenv(model_cache.ENV, str(root))
        mp.setattr(model_cache, "load_gguf", load_gguf)
        folder = model_cache.cached_folder(source)
    assert folder is not None and len(loaded) == 1
    return folder, loaded[0]


@pytest.fixture(scope="module")
def built(build: tuple[Path, tuple[Any, Any]]) -> Path:
    return build[0]


@pytest.fixture(scope="module")
def reference(build: tuple[Path, tuple[Any, Any]]) -> tuple[Any, Any]:
    """(tokenizer, float32 model) as transformers reads them from the GGUF: the build's own read, which for this
    file is the read of a load with the cache off (test_the_reference_is_the_plain_gguf_load)."""
    return build[1]


@pytest.fixture
def cache_env(root: Path, reference: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The cache in the module's tmp folder; the build's GGUF read returns the reference. Yields the count of builds."""
    builds: list[int] = []

    def load_gguf(src: ModelSource) -> tuple[Any, Any]:
        builds.append(1)
        return reference

    monkeypatch.setenv(model_cache.ENV, str(root))
    monkeypatch.setattr(model_cache, "load_gguf", load_gguf)
    yield builds


def _load(source: ModelSource, dtype: torch.dtype) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return (
        model_cache.from_pretrained(AutoTokenizer, source),
        model_cache.from_pretrained(AutoModelForCausalLM, source, dtype=dtype),
    )


def test_folder_layout_and_key(source: ModelSource, root: Path, built: Path) -> None:
    sha = hashlib.sha256(source.path.read_bytes()).hexdigest()
    assert model_cache.file_sha256(source.path) == sha
    assert built == root / f"{sha[:16]}-v{model_cache.FORMAT}"
    meta = json.loads((built / "meta.json").read_text())
    assert meta["sha256"] == sha and meta["source"] == str(source.path) and meta["format"] == model_cache.FORMAT
    assert set(model_cache.REQUIRED) <= set(meta["files"]) == {p.name for p in built.iterdir()} - {"meta.json"}
    assert not list(root.glob(".*tmp-*"))  # the temporary build folder was renamed into place


def test_the_reference_is_the_plain_gguf_load(source: ModelSource, reference: tuple[Any, Any]) -> None:
    from gguf import GGUFReader
    from gguf.quants import dequantize
    from transformers.integrations.gguf.utils import is_gguf_arch_supported

    # dequantize=True only matters for the architectures transformers can keep packed; llama is read the legacy way
    assert not is_gguf_arch_supported("llama")
    _, ref = reference
    tensors = {t.name: t for t in GGUFReader(source.path).tensors}
    for gguf_name, name in [
        ("token_embd.weight", "model.embed_tokens.weight"),  # Q8_0, tied to lm_head
        ("blk.0.ffn_down.weight", "model.layers.0.mlp.down_proj.weight"),  # Q4_1
        ("blk.29.attn_v.weight", "model.layers.29.self_attn.v_proj.weight"),
        ("blk.7.attn_norm.weight", "model.layers.7.input_layernorm.weight"),  # F32
    ]:
        t = tensors[gguf_name]
        expected = torch.from_numpy(dequantize(t.data, t.tensor_type).copy())
        assert torch.equal(ref.state_dict()[name], expected.reshape(ref.state_dict()[name].shape)), name


def test_weights_bit_identical_and_tied(
    source: ModelSource, built: Path, reference: tuple[Any, Any], cache_env
) -> None:
    _, ref = reference
    _, lm = _load(source, torch.float32)
    assert cache_env == []  # the folder exists: no second build
    ref_sd, sd = ref.state_dict(), lm.state_dict()
    assert set(sd) == set(ref_sd)
    for name, tensor in ref_sd.items():
        assert sd[name].dtype == tensor.dtype and torch.equal(sd[name], tensor), name
    # the tied lm_head is one tensor again, not a copy
    assert lm.lm_head.weight.data_ptr() == lm.model.embed_tokens.weight.data_ptr()
    # the same config but for where it was read from, and the GGUF load's GgufConfig (the folder is not quantised)
    cfg, ref_cfg = lm.config.to_dict(), ref.config.to_dict()
    assert {k for k in cfg.keys() | ref_cfg.keys() if cfg.get(k) != ref_cfg.get(k)} <= {
        "_name_or_path",
        "quantization_config",
    }
    assert "quantization_config" not in json.loads((built / "config.json").read_text())
    assert lm.generation_config.to_dict() == ref.generation_config.to_dict()
    ids = torch.tensor([[1, 9690, 198, 2683, 314, 216, 34, 28, 34, 47, 2]])
    with torch.no_grad():
        assert torch.equal(lm(ids).logits, ref(ids).logits)


def test_bfloat16_is_the_rounded_float32(
    source: ModelSource, built: Path, reference: tuple[Any, Any], cache_env
) -> None:
    # The GGUF load dequantises to float32, then casts to the requested dtype: the same rounding as the cache load.
    _, ref = reference
    _, lm = _load(source, torch.bfloat16)
    sd = lm.state_dict()
    for name, tensor in ref.state_dict().items():
        assert torch.equal(sd[name], tensor.to(torch.bfloat16)), name


def test_tokenizer_identical(source: ModelSource, built: Path, reference: tuple[Any, Any], cache_env) -> None:
    from transformers import AutoTokenizer

    ref, _ = reference
    tok = model_cache.from_pretrained(AutoTokenizer, source)
    for text in TEXTS:
        for special in (True, False):
            assert (
                tok(text, add_special_tokens=special)["input_ids"] == ref(text, add_special_tokens=special)["input_ids"]
            ), text
    for gen in (True, False):
        a = tok.apply_chat_template(CONVERSATION, add_generation_prompt=gen, tokenize=False)
        assert a == ref.apply_chat_template(CONVERSATION, add_generation_prompt=gen, tokenize=False)
    for attr in ("eos_token_id", "pad_token_id", "bos_token_id", "unk_token_id", "padding_side", "all_special_ids"):
        assert getattr(tok, attr) == getattr(ref, attr), attr
    assert len(tok) == len(ref) and tok.get_vocab() == ref.get_vocab()


def test_backend_loads_from_the_cache(source: ModelSource, built: Path, cache_env) -> None:
    from orchestra.backends.hf import TransformersBackend

    backend = TransformersBackend("smollm2")
    assert cache_env == []
    assert backend.model_id == f"hf:{source.name}"  # recorded results keep the GGUF's name
    assert backend.eos_ids == frozenset({2}) and backend.pad_id == 2


def test_lost_race_uses_the_winners_folder(source: ModelSource, built: Path, cache_env) -> None:
    before = (built / "meta.json").read_text()
    model_cache.build(source, built, model_cache.file_sha256(source.path))  # another process renamed first
    assert cache_env == [1]
    assert (built / "meta.json").read_text() == before
    assert not list(built.parent.glob(".*tmp-*"))


@pytest.mark.parametrize(
    ("meta", "weights", "what"),
    [(False, b"", "meta.json unreadable"), (True, None, "model.safetensors missing"), (True, b"x" * 64, "recorded")],
)
def test_damaged_folder_gives_one_clear_line(
    source: ModelSource,
    built: Path,
    root: Path,
    cache_env,
    monkeypatch: pytest.MonkeyPatch,
    meta: bool,
    weights: bytes | None,
    what: str,
) -> None:
    from transformers import AutoTokenizer

    folder = root / f"damaged-{meta}-{weights is None}" / built.name  # a copy of the small files, then damaged
    folder.mkdir(parents=True)
    for p in built.iterdir():
        if p.name != "model.safetensors" and (meta or p.name != "meta.json"):
            shutil.copy(p, folder / p.name)
    if weights is not None:
        (folder / "model.safetensors").write_bytes(weights)
    monkeypatch.setenv(model_cache.ENV, str(folder.parent))
    with pytest.raises(BackendError) as err:
        model_cache.from_pretrained(AutoTokenizer, source)
    message = str(err.value)
    assert "\n" not in message and str(folder) in message and "delete it" in message and what in message, message
    assert cache_env == []  # never rebuilt over the user's folder


def test_off_and_hf_folders_bypass_the_cache(source: ModelSource, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[Any, dict[str, Any]]] = []

    class Loader:
        @staticmethod
        def from_pretrained(folder: Any, **kwargs: Any) -> str:
            calls.append((folder, kwargs))
            return "loaded"

    monkeypatch.setattr(model_cache, "load_gguf", lambda src: pytest.fail("built with the cache off"))
    for value in ("off", "OFF", " off "):
        monkeypatch.setenv(model_cache.ENV, value)
        assert model_cache.models_root() is None
        assert model_cache.from_pretrained(Loader, source, dtype="x") == "loaded"
        assert calls.pop() == (source.folder, {"gguf_file": source.name, "dtype": "x"})
    monkeypatch.delenv(model_cache.ENV)
    assert model_cache.models_root() == model_cache.cache_root() / "models"
    hf = ModelSource(kind="hf", path=Path("/nowhere/model"), name="model")
    assert model_cache.cached_folder(hf) is None
    model_cache.from_pretrained(Loader, hf)
    assert calls.pop() == (hf.path, {})
