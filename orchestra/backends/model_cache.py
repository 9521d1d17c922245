"""The dequantised cache of a GGUF model: a Hugging Face folder built once, so a transformers load takes seconds.

transformers reads a ``.gguf`` by parsing it and dequantising every tensor to float32 on every load (10-30 s for
SmolLM2-135M on 2 cores). The first load of a GGUF here does that once and writes what it
produced as a plain Hugging Face folder; later loads read that folder (safetensors, memory-mapped):

    <root>/<key>/   config.json, generation_config.json, model.safetensors (float32), the tokenizer's files, meta.json
    root            $ORCHESTRA_MODEL_CACHE if set to a folder, else ~/.cache/orchestra/models
    key             sha256 of the GGUF's bytes (16 hex digits) + "-v" + FORMAT

The weights are the dequantised values exactly (float32), so loading the folder in float32 or bfloat16 gives the
tensors the GGUF load gives in that dtype, bit for bit (it too dequantises to float32, then casts), and the tokenizer is the one transformers converted from the GGUF, saved with
``save_pretrained`` (tests/test_model_cache.py checks both). transformers refuses ``save_pretrained`` on a model loaded
from a GGUF, so the state dict is written with ``safetensors.torch.save_model``, which drops the tied duplicate
(SmolLM2's ``lm_head.weight`` is ``model.embed_tokens.weight``); ``from_pretrained`` ties it again from the config.

Writing is atomic: the folder is built beside its target under a temporary name, ``meta.json`` (the file sizes, the
source, its sha256, the transformers version) is written last, and the folder is renamed into place; of two processes
building at once, the one that loses the rename uses the winner's folder. A folder whose ``meta.json`` is missing or
unreadable, or whose files are missing or of another size than recorded, is never repaired or deleted here: the load
fails with one line naming the folder and saying to delete it (the next load rebuilds it). ``ORCHESTRA_MODEL_CACHE=off``
loads straight from the GGUF, as before the cache existed. docs/performance.md, "Model load: the dequantised cache".
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from orchestra.backends.base import BackendError
from orchestra.backends.llamacpp_build import cache_root
from orchestra.backends.models import ModelSource

ENV = "ORCHESTRA_MODEL_CACHE"
# Bump when what a folder holds, or how it is written, changes: the old folders are then left unused.
FORMAT = 1
WEIGHTS = "model.safetensors"
META = "meta.json"
# Files every folder must hold besides META (the tokenizer writes a few more, recorded in META with the rest).
REQUIRED = ("config.json", "generation_config.json", WEIGHTS, "tokenizer_config.json")
STALE_TEMP_S = 3600  # a temporary build folder older than this was left by a crashed build, and is removed

_sha_memo: dict[tuple[str, int, int], str] = {}
_build_lock = threading.Lock()  # one build at a time in this process (other processes: the atomic rename)


def models_root() -> Path | None:
    """The folder holding the cache folders, or None when ``$ORCHESTRA_MODEL_CACHE`` is ``off``."""
    value = os.environ.get(ENV, "").strip()
    if value.lower() == "off":
        return None
    return Path(value).expanduser() if value else cache_root() / "models"


def file_sha256(path: Path) -> str:
    """sha256 of a file's bytes, computed once per (path, size, mtime) in this process (~0.1 s per 100 MB)."""
    st = path.stat()
    memo_key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if memo_key not in _sha_memo:
        h = hashlib.sha256()
        with path.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        _sha_memo[memo_key] = h.hexdigest()
    return _sha_memo[memo_key]


def cache_key(path: Path) -> str:
    return f"{file_sha256(path)[:16]}-v{FORMAT}"


def damaged(folder: Path, what: str) -> BackendError:
    return BackendError(
        f"model cache folder {str(folder)!r} is incomplete or damaged ({what}); delete it (rm -r '{folder}') and the "
        f"next load rebuilds it, or set {ENV}=off to load the GGUF directly",
        cause="model_cache",
    )


def check_folder(folder: Path, sha256: str) -> None:
    """Raise :func:`damaged` unless ``folder`` is a complete cache folder of the GGUF with this sha256."""
    try:
        meta = json.loads((folder / META).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise damaged(folder, f"{META} unreadable: {e.__class__.__name__}") from e
    files = meta.get("files") if isinstance(meta, dict) else None
    if not isinstance(files, dict) or meta.get("format") != FORMAT or meta.get("sha256") != sha256:
        raise damaged(folder, f"{META} does not describe format {FORMAT} of this GGUF")
    for name in sorted(set(files) | set(REQUIRED)):
        try:
            size = (folder / name).stat().st_size
        except OSError:
            raise damaged(folder, f"{name} missing") from None
        if size != files.get(name):
            raise damaged(folder, f"{name} has {size} bytes, {files.get(name)} recorded")


def cached_folder(source: ModelSource) -> Path | None:
    """The cache folder of a GGUF ``source``, built now if missing; None for an HF folder or with the cache off."""
    root = models_root()
    if source.kind != "gguf" or root is None:
        return None
    sha = file_sha256(source.path)
    folder = root / cache_key(source.path)
    if not folder.exists():
        with _build_lock:
            if not folder.exists():
                build(source, folder, sha)
    check_folder(folder, sha)
    return folder


def load_gguf(source: ModelSource) -> tuple[Any, Any]:
    """(tokenizer, float32 causal LM) as transformers reads them from the GGUF: what a cache folder holds.

    Progress bars are the caller's to silence (``orchestra.backends.hf.quiet_loading`` around :func:`from_pretrained`,
    as both load sites do): importing hf here would make the two modules import each other."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    tokenizer = AutoTokenizer.from_pretrained(source.folder, gguf_file=source.path.name)
    # dequantize=True: dense weights even where transformers could keep some architectures' blocks packed (its
    # GgufHfQuantizer, with the `kernels` package); SmolLM2's llama is unpacked whole on every load regardless
    lm = AutoModelForCausalLM.from_pretrained(
        source.folder,
        gguf_file=source.path.name,
        dtype=torch.float32,
        quantization_config=GgufConfig(dequantize=True),
    )
    return tokenizer, lm


def build(source: ModelSource, target: Path, sha256: str) -> None:
    """Dequantise the GGUF once (float32) and write its HF folder to ``target``, atomically (module docstring)."""
    import transformers
    from safetensors.torch import save_model

    print(f"building the dequantised cache of {source.name} in {target} (once)", file=sys.stderr, flush=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    for old in target.parent.glob(f".{target.name}.tmp-*"):
        with contextlib.suppress(OSError):  # another process may be removing it
            if time.time() - old.stat().st_mtime > STALE_TEMP_S:
                shutil.rmtree(old, ignore_errors=True)
    tokenizer, lm = load_gguf(source)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        config = copy.deepcopy(lm.config)
        with contextlib.suppress(AttributeError):  # the GGUF load's own GgufConfig: the folder is plain float32
            delattr(config, "quantization_config")
        config.save_pretrained(tmp)
        lm.generation_config.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        # save_model keeps one name of tensors that share storage (the tied lm_head), as from_pretrained expects
        save_model(lm, str(tmp / WEIGHTS), metadata={"format": "pt"})
        meta = {
            "format": FORMAT,
            "source": str(source.path),
            "sha256": sha256,
            "transformers": transformers.__version__,
            "dtype": "float32",
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "files": {p.name: p.stat().st_size for p in sorted(tmp.iterdir()) if p.is_file()},
        }
        (tmp / META).write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")
        for p in tmp.iterdir():  # mkdtemp and safetensors make them private; a shared cache folder is read by all
            p.chmod(0o644)
        tmp.chmod(0o755)
        try:
            tmp.rename(target)
        except OSError:
            if not target.is_dir():  # not a lost race: report it
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # gone after a successful rename; the loser's copy otherwise


def from_pretrained(cls: Any, source: ModelSource, **kwargs: Any) -> Any:
    """``cls.from_pretrained`` (``AutoTokenizer``, ``AutoModelForCausalLM``) of ``source``: from its cache folder for a
    GGUF (built on first use), else, or with ``ORCHESTRA_MODEL_CACHE=off``, from the GGUF or the HF folder itself."""
    folder = cached_folder(source)
    if folder is None:
        extra = {"gguf_file": source.path.name} if source.kind == "gguf" else {}
        return cls.from_pretrained(source.folder, **extra, **kwargs)
    from safetensors import SafetensorError

    try:
        return cls.from_pretrained(folder, **kwargs)
    except (OSError, ValueError, SafetensorError) as e:
        raise damaged(folder, f"transformers could not load it: {e}") from e
