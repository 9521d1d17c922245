"""An LLM names the next speaker: AutoGen GroupChat's "auto" speaker selection, as a conductor.

The model sees the task, the transcript and the list of legal moves ("solver:solve", …, "submit")
and answers with one of them. Its reply is matched leniently (the first legal label, then the first
worker name mentioned); an unparseable reply falls back to the first legal action and is counted in
``parse_failures`` — never guessed silently.

With ``write_instructions`` (the ``llm_instruct`` conductor) it may instead address an LLM worker in its own words,
``solver: add the two prices first``, as learned conductors in the literature emit a worker id plus a
natural-language subtask: the reply becomes an :class:`envs.team_env.Instruct`, recorded like a human expert's
(the text, and the nearest declared instruction as the discrete action). ``written`` counts those replies.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from envs.config import TeamEnvConfig
from envs.team_env import Instruct, instruction_problem
from orchestra.backends.base import Backend, ChatMessage, GenerationParams, GenerationRequest
from policies.base import PolicyError, first_legal

SYSTEM_PROMPT = (
    "You coordinate a team. You pick who acts next, or submit the team's answer when it is ready. "
    "Reply with exactly one move from the list, nothing else."
)
WRITING_PROMPT = (
    "You coordinate a team. You pick who acts next and tell them what to do, or submit the team's answer when it is "
    "ready. Reply with one move from the list, or with a worker's name, a colon and a short instruction in your own "
    "words (for example 'solver: add the two prices first, then subtract the discount'). Nothing else."
)


class LLMConductor:
    def __init__(
        self,
        config: TeamEnvConfig,
        backend: Backend,
        params: GenerationParams | None = None,
        max_message_chars: int = 400,
        write_instructions: bool = False,
    ) -> None:
        self.write_instructions = write_instructions
        self.config, self.backend = config, backend
        self.name = "llm_instruct" if write_instructions else "llm"
        self.params = params or GenerationParams(
            max_tokens=40 if write_instructions else 12, temperature=0.0, stop=("\n",)
        )
        self.max_message_chars = max_message_chars
        self.parse_failures = 0
        self.decisions = 0
        self.written = 0  # replies that were an instruction in the model's own words

    def reset(self, seed: int | None = None) -> None:
        pass

    def counters(self) -> dict[str, int]:
        """How its replies went, for the run's metrics: a reply no move could be read from took the first legal
        action (a model that cannot follow the move format shows up here, not as a silent choice)."""
        return {
            "conductor/decisions": self.decisions,
            "conductor/unparsed_replies": self.parse_failures,
            "conductor/own_instructions": self.written,
        }

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
        if self.write_instructions:
            llm = [w.name for w in self.config.workers if w.kind == "llm"]
            lines.append("Or write your own instruction to one of: " + ", ".join(llm) + " (as 'name: instruction').")
        lines.append("Next move:")
        system = WRITING_PROMPT if self.write_instructions else SYSTEM_PROMPT
        return (ChatMessage("system", system), ChatMessage("user", "\n".join(lines)))  # type: ignore[return-value]

    def parse_instruction(self, text: str, legal: list[int]) -> Instruct | None:
        """``worker: free text`` addressed to an LLM worker that may act now, unless the text is a declared move."""
        m = re.match(r"\s*[\[\"'`*]*([A-Za-z_][\w-]*)[\]\"'`*]*\s*:\s*(.+)", text)
        if m is None:
            return None
        worker, said = m.group(1), m.group(2).strip().strip("\"'`*").strip()
        spec = next((w for w in self.config.workers if w.name.lower() == worker.lower()), None)
        mask = np.zeros(self.config.num_actions, dtype=np.int8)
        mask[legal] = 1
        if spec is None or instruction_problem(self.config, mask, spec.name, said) is not None:
            return None
        if said.lower().rstrip(".") in (ins.lower() for ins in spec.instructions):
            return None  # "solver: solve" is the declared move, not an instruction of its own
        return Instruct(spec.name, said)

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

    def act(self, obs: np.ndarray, action_mask: np.ndarray, state: Mapping[str, Any] | None = None) -> int | Instruct:
        if state is None:
            raise PolicyError("llm conductor needs the structured state (infos['conductor']['state'])")
        legal = [int(a) for a in np.flatnonzero(action_mask)]
        completion = self.backend.generate(
            [GenerationRequest(messages=tuple(self.prompt(state, legal)), params=self.params)]
        )[0]
        self.decisions += 1
        if self.write_instructions:
            own = self.parse_instruction(completion.text, legal)
            if own is not None:
                self.written += 1
                return own
        a = self.parse(completion.text, legal)
        if a is None:
            self.parse_failures += 1
            return first_legal(action_mask)
        return a
