"""A person records expert demonstrations at a terminal: ``orchestra record --conductor human`` in a pseudo-terminal
(pexpect), with the real arithmetic team (SmolLM2 through llama.cpp, the calculator, MiniLM), through two episodes
with an instruction in the expert's own words, a submit, help, quitting and ``--resume``. Asserts what the screen
showed and what the trajectory file, ``orchestra trajectories show`` and ``orchestra dataset build`` hold."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pexpect
import pytest

from trajectories import read_trajectories

pytestmark = pytest.mark.slow

OWN = "multiply first, then subtract"
PROMPT = "\r\n> "  # the session's prompt for an answer, at the start of a line


def spawn(tmp_path: Path, *extra: str) -> tuple[pexpect.spawn, list[str]]:
    env = {**os.environ, "ORCHESTRA_CACHE_DIR": str(tmp_path / "cache"), "COLUMNS": "160"}
    child = pexpect.spawn(
        sys.executable,
        ["-m", "orchestra", "record", "--team", "arithmetic", "--conductor", "human", "--episodes", "2"]
        + ["--seed", "0", "--out", str(tmp_path / "human.jsonl"), *extra],
        env=env,
        encoding="utf-8",
        timeout=600,
        dimensions=(50, 160),
    )
    screen: list[str] = []

    class Tee:
        def write(self, s: str) -> None:
            screen.append(s)

        def flush(self) -> None:
            pass

    child.logfile_read = Tee()
    return child, screen


def answer(child: pexpect.spawn, line: str) -> None:
    child.expect_exact(PROMPT)
    child.sendline(line)


def orchestra(*args: str) -> str:
    r = subprocess.run([sys.executable, "-m", "orchestra", *args], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_an_expert_records_two_episodes_in_a_terminal(tmp_path: Path) -> None:
    child, screen = spawn(tmp_path)
    answer(child, f"solver: {OWN}")  # episode 1: the solver in the expert's own words
    answer(child, "calculator:check")
    answer(child, "submit")
    child.expect_exact("=== episode 2")
    answer(child, "?")
    answer(child, "q")  # stop after one completed episode
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    first = "".join(screen).replace("\r\n", "\n")

    # one episode at a time: the first task, the solver's message under the expert's words, the calculator's verdict,
    # the outcome and the tally, and only then the second task
    tasks = [line for line in first.split("\n") if line.startswith("=== episode")]
    assert len(tasks) == 2 and tasks[0].startswith("=== episode 1 of 2 · task arithmetic-")
    assert tasks[1].startswith("=== episode 2 of 2 · task arithmetic-")
    assert f'--- solver (solve "{OWN}")' in first
    assert "--- calculator (check) [" in first
    assert "  1) solver:solve " in first and "(tool) Check the latest answer." in first
    assert "give up: no candidate answer yet" in first and "the verifier scores the latest candidate answer" in first
    outcome = first.index(">>> submitted: ")
    assert first.index(tasks[0]) < outcome < first.index("session: 1 episode(s)") < first.index(tasks[1])
    assert "reward vector: turn_cost -2" in first
    assert "How to answer:" in first and "WORKER: TEXT" in first
    assert "session stopped: 1 completed episode(s) kept" in first
    # a quiet screen: no library progress bars or model logs; they are in the run's log
    for noise in ("Loading weights", "it/s]", "llama_", "Warning"):
        assert noise not in first, noise
    assert (tmp_path / "human_run" / "session.log").exists()
    kept = read_trajectories(tmp_path / "human.jsonl").episodes
    assert len(kept) == 1

    # --resume continues with the second task; a number picks a declared action
    child, screen = spawn(tmp_path, "--resume")
    answer(child, "1")
    answer(child, "submit")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    second = "".join(screen).replace("\r\n", "\n")
    assert tasks[1] in second and tasks[0] not in second
    assert "--- solver (solve)\n" in second and "session: 1 episode(s)" in second
    assert "recorded 1 episodes (1 already there)" in second

    eps = read_trajectories(tmp_path / "human.jsonl").episodes
    assert [e.conductor.name for e in eps] == ["human", "human"] and len({e.task.id for e in eps}) == 2
    own = eps[0].steps[0].action
    assert (own.text, own.worker, own.instruction) == (OWN, "solver", "solve") and own.similarity is not None
    said = eps[0].steps[0].message
    assert said is not None and said.worker == "solver" and said.token_ids  # the real model answered
    assert eps[0].metadata["final_state"]["transcript"][0]["instruction_text"] == OWN
    assert [s.action.label for s in eps[0].steps] == ["solver:solve", "calculator:check", "submit"]
    assert all(s.action.text is None for s in eps[1].steps)

    shown = orchestra("trajectories", "show", str(tmp_path / "human.jsonl"), "--index", "0")
    assert f'own instruction: "{OWN}" (mapped to solver:solve, action 0' in shown
    built = orchestra(
        "dataset",
        "build",
        "--team",
        "arithmetic",
        "--input",
        str(tmp_path / "human.jsonl"),
        "--out",
        str(tmp_path / "human.npz"),
    )
    assert "instructions in the conductor's own words: 1" in built
    assert f'"{OWN}" → solver:solve (action 0' in built
