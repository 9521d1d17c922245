"""A person conducts: a recording session that reads like a conversation (``orchestra record --conductor human``).

One episode at a time (the rollout engine serves an ``interactive`` conductor in a single env): the task, then each
worker's message as it arrives with who said it under which instruction, then the legal actions with a one-line
description each. The expert answers with

- a number or a label (``solver:solve``, ``submit``): one of the team's declared actions;
- ``WORKER: TEXT`` (``solver: multiply first, then subtract``): an instruction in the expert's own words, sent to
  that LLM worker in place of the template (:class:`envs.team_env.Instruct`; the trajectory keeps the text and the
  nearest declared instruction, the discrete action a learner trains on);
- ``?`` for help, ``q`` to stop (every completed episode is already on disk; ``--resume`` continues).

After each episode it shows the verifier's verdict, the score, the reward vector and a running tally.
Input is read from a text stream (stdin by default), so the session is scriptable and testable.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping
from typing import Any, TextIO

import numpy as np

from envs.config import REWARD_COMPONENTS, TeamEnvConfig
from envs.team_env import Instruct, instruction_problem
from policies.base import PolicyError
from trajectories import Episode

HELP = """\
How to answer:
  a number          one of the actions listed (1, 2, ...)
  a label           the same by name: solver:solve, calculator:check, submit
  WORKER: TEXT      your own instruction to an LLM worker, e.g.  solver: multiply first, then subtract
                    (the worker reads your text; the trajectory keeps it and the nearest declared
                    instruction, which is the discrete action behaviour cloning learns)
  ?                 this help
  q                 stop the session: completed episodes are kept; --resume continues
After 'submit' the verifier scores the latest candidate answer and the episode ends.
"""


class QuitSession(Exception):
    """The expert stopped the session (``q``); what was completed is on disk."""


class HumanConductor:
    """An expert at a terminal. One instance serves a whole session (it keeps the tally)."""

    interactive = True  # the rollout engine serves it one episode at a time

    def __init__(self, config: TeamEnvConfig, stdin: TextIO | None = None, stdout: TextIO | None = None) -> None:
        self.config, self.name = config, "human"
        self._in = stdin if stdin is not None else sys.stdin
        self._out = stdout if stdout is not None else sys.stdout
        self._shown = 0  # transcript entries of the current episode already on screen
        self._task_shown: str | None = None
        self.episodes = 0
        self.successes = 0
        self.returns: list[float] = []
        self.done_before, self.total = 0, 0  # the recording's plan (:meth:`plan`): shown as "episode 3 of 10"

    def plan(self, done: int, total: int) -> None:
        """The recording has ``total`` episodes planned, ``done`` of them recorded earlier (``--resume``)."""
        self.done_before, self.total = done, total

    def reset(self, seed: int | None = None) -> None:
        self._shown = 0
        self._task_shown = None

    # -- screen ------------------------------------------------------------------------------------
    def _w(self, text: str) -> None:
        self._out.write(text)

    def describe(self, action: int) -> str:
        """One line on what an action does."""
        worker, instruction = self.config.decode_action(action)
        if worker is None:
            return "end the episode: the verifier scores the latest candidate answer"
        spec = next(w for w in self.config.workers if w.name == worker)
        text = " ".join(self.config.instructions[str(instruction)].split())
        text = text if len(text) <= 78 else text[:75] + "..."
        return f"(tool) {text}" if spec.kind == "tool" else text

    def _show(self, state: Mapping[str, Any] | None, legal: list[int]) -> None:
        w = self._w
        if state is not None:
            task = state["task"]
            if self._task_shown != task["id"]:
                self._task_shown = task["id"]
                n = self.done_before + self.episodes + 1
                of = f" of {self.total}" if self.total else ""
                w(f"\n=== episode {n}{of} · task {task['id']} ({task.get('family', '?')}) ===\n")
                w(task["prompt"].strip() + "\n")
            for m in state["transcript"][self._shown :]:
                said = f' "{m["instruction_text"]}"' if m.get("instruction_text") else ""
                tag = f" [{m['verdict']}]" if m.get("verdict") else ""
                w(f"\n--- {m['worker']} ({m['instruction']}{said}){tag}\n{m['text'].strip()}\n")
            self._shown = len(state["transcript"])
            candidate = state.get("flags", {}).get("has_candidate")
            w(
                f"\nturn {state['turn']} of {state['max_turns']} · "
                f"{'a candidate answer is on the table' if candidate else 'no candidate answer yet'}\n"
            )
        width = max(len(self.config.action_label(a)) for a in legal)
        for i, a in enumerate(legal, start=1):
            label = self.config.action_label(a)
            note = self.describe(a)
            if label == "submit" and state is not None and not state.get("flags", {}).get("has_candidate"):
                note = "give up: no candidate answer yet (scored as a failure)"
            w(f"  {i}) {label.ljust(width)}  {note}\n")
        w("  or WORKER: TEXT for your own instruction · ? help · q quit\n> ")
        self._out.flush()

    def episode_end(self, episode: Episode) -> None:
        """The outcome of the episode just played, and the session so far."""
        self.episodes += 1
        self.successes += int(episode.success)
        self.returns.append(episode.return_)
        named = dict.fromkeys(REWARD_COMPONENTS, 0.0)
        for st in episode.steps:
            for k, v in st.reward.named.items():
                named[k] = named.get(k, 0.0) + v
        how = "submitted" if episode.terminated else "ended"
        verdict = "CORRECT" if episode.success else "not correct"
        w = self._w
        w(f"\n>>> {how}: {verdict} · score {episode.score:g} · {episode.metadata.get('verdict_reason', '')}\n")
        w(
            "    reward vector: "
            + ", ".join(f"{k} {v:+.3g}" for k, v in named.items() if v)
            + f" → return {episode.return_:+.3f}\n"
        )
        mean = float(np.mean(self.returns))
        w(
            f"    session: {self.episodes} episode(s), {self.successes} correct "
            f"({100 * self.successes / self.episodes:.0f}%), mean return {mean:+.3f}\n"
        )
        self._out.flush()

    # -- input ---------------------------------------------------------------------------------------
    def _parse(self, choice: str, legal: list[int]) -> int | Instruct | str:
        """An action, an instruction, or the message saying why ``choice`` is neither."""
        labels = {self.config.action_label(a): a for a in legal}
        squeezed = re.sub(r"\s*:\s*", ":", choice)
        if choice.isdigit():
            if 1 <= int(choice) <= len(legal):
                return legal[int(choice) - 1]
            return f"'{choice}' is not an action number (1 to {len(legal)})"
        if squeezed in labels:
            return labels[squeezed]
        worker, sep, text = choice.partition(":")
        worker, text = worker.strip(), text.strip()
        if not sep or not worker:
            return f"'{choice}' is not a legal action, a label or WORKER: TEXT"
        mask = np.zeros(self.config.num_actions, dtype=np.int8)
        mask[legal] = 1
        problem = instruction_problem(self.config, mask, worker, text)
        if problem is not None:
            return problem
        if text in dict((w.name, w.instructions) for w in self.config.workers)[worker]:
            return f"{worker}:{text} is not legal now"
        return Instruct(worker, text)

    def act(self, obs: np.ndarray, action_mask: np.ndarray, state: Mapping[str, Any] | None = None) -> int | Instruct:
        legal = [int(a) for a in np.flatnonzero(action_mask)]
        if not legal:
            raise PolicyError("no legal action: the env offered an all-zero action mask")
        self._show(state, legal)
        for _ in range(50):
            line = self._in.readline()
            if not line:
                raise PolicyError("human conductor: input closed before a choice was made")
            choice = line.strip()
            if choice in ("q", "quit", "exit"):
                raise QuitSession("stopped by the expert")
            if choice in ("?", "help", "h"):
                self._w(HELP)
            elif choice:
                got = self._parse(choice, legal)
                if not isinstance(got, str):
                    return got
                self._w(f"{got}; ? for help.\n")
            self._w("> ")
            self._out.flush()
        raise PolicyError("human conductor: 50 unusable answers in a row")
