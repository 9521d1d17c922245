"""The conductor's observation: a fixed-size float32 vector computed from the structured state.

The encoder reads only the structured state (JSON) that the env exposes and the trajectory store
records, never the env's internals, so offline datasets can be rebuilt with a changed encoder without
re-recording (docs/architecture.md §4). The state is a function of the prompt, the transcript and
the tools' outputs: no answer, no solution-derived metadata, no generation level (tested by the leak
test, tests/test_leak.py).

Layout (``ObservationEncoder.feature_names()`` gives every name; W workers, K instructions, E = 384):

====================  =====  =====================================================================
block                 size   meaning
====================  =====  =====================================================================
turn_frac             1      worker turns used / max_turns
turns_left_frac       1      1 - turn_frac
has_candidate         1      some answer-proposing message exists
candidate_changed     1      the latest message changed the candidate answer
verdict_pass/fail/na  3      one-hot of the latest tool verdict (all 0 when no tool spoke yet)
verdict_current       1      the latest tool verdict was given on the current candidate
format_fail           1      the latest answer-proposing LLM message had no extractable answer
distinct_answers      1      number of distinct extracted answers / max_turns
answers_agree         1      the last two extracted answers are equal
last_len              1      completion tokens of the latest message / 128 (clipped to 1)
last_worker_*         W+1    one-hot of the latest speaker (last slot: nobody yet)
last_instr_*          K+1    one-hot of the latest instruction (last slot: none yet)
turns_*               W      turns taken by each worker / max_turns
fails_*               W      FAIL verdicts each tool worker gave / max_turns (0 for LLM workers)
prompt_len            1      characters of the task prompt / 1000 (clipped to 1)
prompt_alpha_frac     1      share of letters among the prompt's non-space characters
prompt_digit_frac     1      share of digits among them
prompt_symbol_frac    1      share of other symbols (operators, brackets, punctuation)
emb_task_*            E      sentence embedding of the task prompt
emb_msg{j}_*          E      embedding of the j-th latest message (j = 1..recent_messages)
====================  =====  =====================================================================
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from envs.config import TeamEnvConfig
from envs.embeddings import Embedder, get_embedder


def derive_flags(state: Mapping[str, Any]) -> dict[str, Any]:
    """Facts rule-based conductors and the encoder read off the transcript (no ground truth)."""
    transcript: Sequence[Mapping[str, Any]] = state["transcript"]
    cand_idx = None
    for i, m in enumerate(transcript):
        if m.get("proposes_answer") and m.get("answer") is not None:
            cand_idx = i
    last_verdict = None
    verdict_idx = None
    for i, m in enumerate(transcript):
        if m.get("verdict") is not None:
            last_verdict, verdict_idx = m["verdict"], i
    answers = [m["answer"] for m in transcript if m.get("proposes_answer") and m.get("answer") is not None]
    last = transcript[-1] if transcript else None
    last_llm_prop = next(
        (m for m in reversed(transcript) if m.get("proposes_answer") and m.get("verdict") is None), None
    )
    return {
        "candidate_index": cand_idx,
        "candidate": transcript[cand_idx]["answer"] if cand_idx is not None else None,
        "has_candidate": cand_idx is not None,
        "candidate_changed": bool(
            last is not None and cand_idx == len(transcript) - 1 and (len(answers) < 2 or answers[-1] != answers[-2])
        ),
        "last_verdict": last_verdict,
        # a verdict speaks about the candidate standing when the tool ran (which may be its own)
        "verdict_on_current": verdict_idx is not None and cand_idx is not None and verdict_idx >= cand_idx,
        "format_fail": bool(last_llm_prop is not None and last_llm_prop.get("answer") is None),
        "distinct_answers": len(set(answers)),
        "answers_agree": len(answers) >= 2 and answers[-1] == answers[-2],
        "last_worker": last["worker"] if last is not None else None,
        "last_instruction": last.get("instruction") if last is not None else None,
        "turns_by_worker": {
            w: sum(1 for m in transcript if m["worker"] == w) for w in {m["worker"] for m in transcript}
        },
    }


class ObservationEncoder:
    """Structured state → float32 vector of a documented, fixed layout (per team config)."""

    def __init__(self, config: TeamEnvConfig, embedder: Embedder | None = None) -> None:
        self.config = config
        self.embedder = embedder if embedder is not None else get_embedder(config.embedder)
        self._names = self._build_names()

    def _build_names(self) -> list[str]:
        c = self.config
        names = [
            "turn_frac",
            "turns_left_frac",
            "has_candidate",
            "candidate_changed",
            "verdict_pass",
            "verdict_fail",
            "verdict_na",
            "verdict_current",
            "format_fail",
            "distinct_answers",
            "answers_agree",
            "last_len",
        ]
        names += [f"last_worker_{w}" for w in c.worker_names] + ["last_worker_none"]
        names += [f"last_instr_{k}" for k in c.instruction_names] + ["last_instr_none"]
        names += [f"turns_{w}" for w in c.worker_names]
        names += [f"fails_{w}" for w in c.worker_names]
        names += ["prompt_len", "prompt_alpha_frac", "prompt_digit_frac", "prompt_symbol_frac"]
        d = self.embedder.dim
        names += [f"emb_task_{i}" for i in range(d)]
        for j in range(1, c.recent_messages + 1):
            names += [f"emb_msg{j}_{i}" for i in range(d)]
        return names

    def feature_names(self) -> list[str]:
        return list(self._names)

    def legal_mask(self, observations: np.ndarray) -> np.ndarray:
        """The env's action mask recovered from observation vectors, shape (B, num_actions) int8.

        The mask is a function of the state (worker actions while turns are left, those with a
        precondition once it holds: some worker has spoken, a candidate exists; submit once a
        candidate exists, or always where the team lets the conductor give up), and all these facts
        are features, so a learned policy evaluated on logged next-observations (FQE targets,
        d3rlpy) can respect it without the env.
        """
        obs = np.atleast_2d(np.asarray(observations, dtype=np.float32))
        c = self.config
        turns_left = obs[:, self._names.index("turns_left_frac")] > 1e-6
        has_cand = obs[:, self._names.index("has_candidate")] > 0.5
        met = {"candidate": has_cand, "message": obs[:, self._names.index("turns_left_frac")] < 1.0 - 1e-6}
        mask = np.zeros((obs.shape[0], c.num_actions), dtype=np.int8)
        mask[:, : c.submit_action] = turns_left[:, None]
        for a in range(c.submit_action):  # only the (worker, instruction) pairs the team declares
            worker, instruction = c.decode_action(a)
            spec = next(w for w in c.workers if w.name == worker)
            if instruction not in spec.instructions:
                mask[:, a] = 0
            elif instruction in dict(spec.requires):
                mask[:, a] *= met[dict(spec.requires)[instruction]]
        mask[:, c.submit_action] = has_cand | c.give_up
        return mask

    @property
    def size(self) -> int:
        return len(self._names)

    def encode(self, state: Mapping[str, Any]) -> np.ndarray:
        return self.encode_many([state])[0]

    def encode_many(self, states: Sequence[Mapping[str, Any]]) -> np.ndarray:
        """Encode a batch of states (embeddings computed in one call)."""
        c = self.config
        n = len(states)
        out = np.zeros((n, self.size), dtype=np.float32)
        texts: list[str] = []
        for s in states:
            transcript = s["transcript"]
            texts.append(s["task"]["prompt"])
            for j in range(1, c.recent_messages + 1):
                texts.append(transcript[-j]["text"] if len(transcript) >= j else "")
        emb = self.embedder.embed(texts) if n else np.zeros((0, self.embedder.dim), np.float32)
        per_state = 1 + c.recent_messages
        for row, s in enumerate(states):
            out[row, : self.size - per_state * self.embedder.dim] = self._structural(s)
            out[row, self.size - per_state * self.embedder.dim :] = emb[row * per_state : (row + 1) * per_state].ravel()
        return out

    def _structural(self, state: Mapping[str, Any]) -> np.ndarray:
        c = self.config
        f = derive_flags(state)
        transcript = state["transcript"]
        max_turns = max(int(state["max_turns"]), 1)
        turn_frac = min(int(state["turn"]) / max_turns, 1.0)
        verdict = f["last_verdict"]
        last = transcript[-1] if transcript else None
        v: list[float] = [
            turn_frac,
            1.0 - turn_frac,
            float(f["has_candidate"]),
            float(f["candidate_changed"]),
            float(verdict == "pass"),
            float(verdict == "fail"),
            float(verdict == "n/a"),
            float(f["verdict_on_current"]),
            float(f["format_fail"]),
            f["distinct_answers"] / max_turns,
            float(f["answers_agree"]),
            min(float(last.get("tokens", 0)) / 128.0, 1.0) if last is not None else 0.0,
        ]
        v += [float(f["last_worker"] == w) for w in c.worker_names] + [float(last is None)]
        v += [float(f["last_instruction"] == k) for k in c.instruction_names] + [float(last is None)]
        v += [f["turns_by_worker"].get(w, 0) / max_turns for w in c.worker_names]
        v += [
            sum(1 for m in transcript if m["worker"] == w and m.get("verdict") == "fail") / max_turns
            for w in c.worker_names
        ]
        v += prompt_surface(state["task"]["prompt"])
        return np.asarray(v, dtype=np.float32)


def prompt_surface(prompt: str) -> list[float]:
    """What the prompt looks like, without reading it: a bare formula is mostly digits and symbols,
    a word problem or a puzzle mostly letters. Cheap, readable in distilled rules, family-agnostic."""
    chars = [ch for ch in prompt if not ch.isspace()]
    n = max(len(chars), 1)
    alpha = sum(ch.isalpha() for ch in chars) / n
    digit = sum(ch.isdigit() for ch in chars) / n
    return [min(len(prompt) / 1000.0, 1.0), alpha, digit, 1.0 - alpha - digit if chars else 0.0]
