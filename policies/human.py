"""A person conducts: at each turn they see the transcript and the legal actions and pick one.

Used to record expert trajectories (``orchestra record --conductor human``). Input is read from a
text stream (stdin by default), so the conductor is scriptable and testable.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any, TextIO

import numpy as np

from envs.config import TeamEnvConfig
from policies.base import PolicyError


class HumanConductor:
    def __init__(self, config: TeamEnvConfig, stdin: TextIO | None = None, stdout: TextIO | None = None) -> None:
        self.config, self.name = config, "human"
        self._in = stdin if stdin is not None else sys.stdin
        self._out = stdout if stdout is not None else sys.stdout

    def reset(self, seed: int | None = None) -> None:
        pass

    def _show(self, state: Mapping[str, Any] | None, legal: list[int]) -> None:
        w = self._out.write
        if state is not None:
            w(f"\n=== task {state['task']['id']} (turn {state['turn']}/{state['max_turns']}) ===\n")
            w(state["task"]["prompt"] + "\n")
            for m in state["transcript"]:
                tag = f" [{m['verdict']}]" if m.get("verdict") else ""
                w(f"--- {m['worker']} ({m['instruction']}){tag}\n{m['text'].strip()}\n")
        w("legal actions:\n")
        for i, a in enumerate(legal):
            w(f"  {i}) {self.config.action_label(a)}\n")
        w("your choice (number or label): ")
        self._out.flush()

    def act(self, obs: np.ndarray, action_mask: np.ndarray, state: Mapping[str, Any] | None = None) -> int:
        legal = [int(a) for a in np.flatnonzero(action_mask)]
        labels = {self.config.action_label(a): a for a in legal}
        for _ in range(20):
            self._show(state, legal)
            line = self._in.readline()
            if not line:
                raise PolicyError("human conductor: input closed before a choice was made")
            choice = line.strip()
            if choice.isdigit() and int(choice) < len(legal):
                return legal[int(choice)]
            if choice in labels:
                return labels[choice]
            self._out.write(f"'{choice}' is not one of the legal actions; try again.\n")
        raise PolicyError("human conductor: 20 invalid choices in a row")
