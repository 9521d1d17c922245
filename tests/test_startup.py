"""Start-up cost: a recording whose team needs no sentence embeddings never imports sentence-transformers, and the
MiniLM encoder loads on its first use, not when an env or encoder is built."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

HEAVY = ("sentence_transformers", "transformers", "torch")


def _run(code: str) -> str:
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    return res.stdout.strip().splitlines()[-1]


@pytest.mark.slow
def test_record_without_embeddings_imports_no_sentence_encoder(tmp_path: Path) -> None:
    from orchestra.runtime.team_file import resolve_team_path

    raw = yaml.safe_load(resolve_team_path("arithmetic").read_text())
    raw["embedder"] = "hash"
    team = tmp_path / "hash.yaml"
    team.write_text(yaml.safe_dump(raw, sort_keys=False))
    out = tmp_path / "r.jsonl"
    code = (
        "import sys; from orchestra.cli import main; "
        f"rc = main(['record', '--team', {str(team)!r}, '--conductor', 'pipeline', '--episodes', '1', "
        f"'--out', {str(out)!r}, '--quiet', '--no-cache']); "
        f"print(rc, sorted(m for m in {HEAVY!r} if m in sys.modules))"
    )
    assert _run(code) == "0 []"
    assert out.stat().st_size > 0


def test_the_minilm_encoder_loads_on_first_use() -> None:
    code = (
        "import sys; from envs.embeddings import get_embedder; e = get_embedder('minilm'); "
        "before = 'sentence_transformers' in sys.modules; v = e.embed(['hello world']); "
        "print(before, 'sentence_transformers' in sys.modules, v.shape, round(float((v ** 2).sum()), 4))"
    )
    assert _run(code) == "False True (1, 384) 1.0"
