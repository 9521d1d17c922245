"""Shared pytest fixtures."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestra.backends import llamacpp_probe
from orchestra.backends.llamacpp_probe import ProbeResult
from orchestra.backends.models import smollm2_gguf_path

# The llama.cpp crash probe (orchestra/backends/llamacpp_probe.py), run once before any test: a child process loads the
# embedded SmolLM2 and decodes a few tokens. If it dies, tests/test_llamacpp_build.py's probe check fails with its one
# line, and every llama.cpp test fails at once with the same line, instead of a segfault ending the whole run: the
# backend's first load of a model asks the probe (its verdict is kept in this process), and so do the tests that start
# a llama_cpp.server.
PROBE_KEY = pytest.StashKey[ProbeResult | None]()


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[PROBE_KEY] = llamacpp_probe.check(smollm2_gguf_path(), force=True)


@pytest.fixture(scope="session")
def llamacpp_probe_result(request: pytest.FixtureRequest) -> ProbeResult | None:
    """The session's probe result (None when ORCHESTRA_LLAMACPP_PROBE=off)."""
    return request.config.stash.get(PROBE_KEY, None)


@pytest.fixture(scope="module")
def one_thread() -> Iterator[None]:
    """Tiny models are dispatch-bound: one torch thread is far faster on a busy CPU (restored afterwards).
    Use with ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# The duo team (phase-2 LLM tests): two LLM workers and a tool on the arithmetic family. Unlike the built-in team,
# the critic may speak before a candidate answer exists: a random tiny model never writes one, and every test batch
# must hold both workers' turns.
DUO_YAML = """\
name: duo
family: arithmetic
max_turns: 4
embedder: hash
backends:
  smollm2: {type: llamacpp, model: smollm2}
instructions:
  solve: "Solve this problem. Finish with a line 'Answer: <number>'."
  check: "Check the latest answer."
  revise: "Redo the calculation. Finish with a line 'Answer: <number>'."
workers:
  - {name: solver, kind: llm, backend: smollm2, instructions: [solve, revise], sees: all,
     generation: {max_tokens: 8, temperature: 0.0, stop: ["\\n\\n\\n"]}}
  - {name: calculator, kind: tool, tool: calculator, instructions: [check], answer_verdicts: [pass, fail]}
  - {name: critic, kind: llm, backend: smollm2, instructions: [check], proposes_answer: false,
     generation: {max_tokens: 8, temperature: 0.0}}
conductors:
  pipeline: {steps: ["solver:solve", "calculator:check", "critic:check", "solver:revise"]}
"""


@pytest.fixture(scope="module")
def duo_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("team") / "duo.yaml"
    path.write_text(DUO_YAML, encoding="utf-8")
    return path
