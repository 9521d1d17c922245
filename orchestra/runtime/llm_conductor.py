"""An LLM names the next speaker: AutoGen GroupChat's "auto" speaker selection, as a conductor.

The model sees the task, the transcript and the list of legal moves ("solver:solve", …, "submit")
and answers with one of them. Its reply is matched leniently (the first legal label, then the first
worker name mentioned); an unparseable reply falls back to the first legal action and is counted in
``parse_failures`` — never guessed silently.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from envs.config import TeamEnvConfig
from orchestra.backends.base import Backend, ChatMessage, GenerationParams, GenerationRequest
from policies.base import PolicyError, first_legal

SYSTEM_PROMPT = (
    "You coordinate a team. You pick who acts next, or submit the team's answer when it is ready. "
    "Reply with exactly one move from the list, nothing else."
)


class LLMConductor:
    def __init__(
        self,
        config: TeamEnvConfig,
        backend: Backend,
        params: GenerationParams | None = None,
        max_message_chars: int = 400,
    ) -> None:
        self.config, self.backend, self.name = config, backend, "llm"
        self.params = params or GenerationParams(max_tokens=12, temperature=0.0, stop=("\n",))
        self.max_message_chars = max_message_chars
        self.parse_failures = 0
        self.decisions = 0

    def reset(self, seed: int | None = None) -> None:
        pass

    def prompt(self, state: Mapping[str, Any], legal: list[int]) -> list[ChatMessage]:
        lines = [f"Task: {state['task']['prompt']}", ""]
        if state["transcript"]:
            lines.append("Messages so far:")
            for m in state["transcript"]:
                tag = f" [{m['verdict']}]" if m.get("verdict") else ""
                lines.append(f"[{m['worker']}]{tag} {m['text'][: self.max_message_chars].strip()}")
            lines.append("")
        lines.append(f"Turns used: {state['turn']} of {state['max_turns']}.")
        lines.append("Moves: " + ", ".join(self.config.action_label(a) for a in legal))
        lines.append("Next move:")
        return (ChatMessage("system", SYSTEM_PROMPT), ChatMessage("user", "\n".join(lines)))  # type: ignore[return-value]

    def parse(self, text: str, legal: list[int]) -> int | None:
        low = text.lower()
        labels = {self.config.action_label(a).lower(): a for a in legal}
        hits = [(low.find(lab), a) for lab, a in labels.items() if lab in low]
        if hits:
            return min(hits)[1]
        for w in self.config.workers:  # a bare worker name → its first legal instruction
            if re.search(rf"\b{re.escape(w.name.lower())}\b", low):
                for a in legal:
                    if self.config.decode_action(a)[0] == w.name:
                        return a
        return None

    def act(self, obs: np.ndarray, action_mask: np.ndarray, state: Mapping[str, Any] | None = None) -> int:
        if state is None:
            raise PolicyError("llm conductor needs the structured state (infos['conductor']['state'])")
        legal = [int(a) for a in np.flatnonzero(action_mask)]
        completion = self.backend.generate(
            [GenerationRequest(messages=tuple(self.prompt(state, legal)), params=self.params)]
        )[0]
        self.decisions += 1
        a = self.parse(completion.text, legal)
        if a is None:
            self.parse_failures += 1
            return first_legal(action_mask)
        return a
