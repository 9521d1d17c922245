"""TeamEnv: a PettingZoo AEC env where a conductor schedules workers on a shared transcript.

====================  =================================================================================================
Env id                ``orchestra_team_v1`` (:data:`ENV_ID`; ``TeamEnv.metadata["name"]``)
API                   PettingZoo AEC; ``possible_agents = ["conductor", *workers]``; cooperative, not parallelizable
Agents                the conductor, then one agent per worker of the team file (LLM workers and tools)
Conductor action      ``Discrete(W * K + 1)``: worker w with instruction k is ``w * K + k``, the last id submits; or an
                      :class:`Instruct` (a worker plus an instruction in the conductor's own words), which is the
                      discrete action of the nearest declared instruction (:meth:`TeamEnv.map_instruction`) with the
                      text sent in place of the template
Action mask           ``observe("conductor")["action_mask"]`` (int8): the worker takes the instruction, its
                      precondition holds (``requires``: a candidate answer / any message), turns are left; submit
                      needs a candidate (or the team's ``give_up``)
Conductor observation ``{"observation": float32[D], "action_mask": int8[W * K + 1]}``; the D features (structural, then
                      sentence embeddings) are laid out in :mod:`envs.observation`
Worker observation    ``{"chat": [...]}``: role prompt, the conductor's instruction, the task, the part of the transcript
                      its visibility allows (``sees``: all, own, last, task, or a list of workers)
Worker action         its message: a str, or ``{"text", "tokens", "verdict"}`` (a tool's pass / fail / n/a)
Rewards               a named vector per step (:mod:`envs.config`): success (verifier score at submit), turn_cost (−1
                      per worker turn), token_cost (−tokens / 100), progress (±1 on a tool's pass / fail of the
                      current candidate), format (−1 for an LLM answer with nothing to extract), price (−the worker's
                      declared price for the turn); every agent receives the scalar ``TeamEnvConfig.scalarise`` of
                      it, the vector is in ``infos[agent]["reward_vector"]``
Termination           submit: the verifier scores the candidate (submitting with none, under ``give_up``, is a failure)
Truncation            the turn budget (``max_turns`` worker turns) is spent and no candidate exists; with a candidate,
                      submit is then the only legal action
Version history       v0: first release. v1: instruction preconditions (``requires``) and ``give_up`` change which
                      actions are legal in the same state (the observation layout and the rewards are unchanged), so
                      masks recorded under v0 differ. v1 also gained the ``price`` reward component (each worker's
                      declared price for its turn) and worker demonstrations (``examples``): a team that declares
                      neither plays exactly as before (its vector's ``price`` is 0)
====================  =================================================================================================

The env holds no LLM (docs/architecture.md §2): the rollout engine generates each worker's text and passes it in as
that worker's action, so one env serves recording, evaluation, online training and TeamTR.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from gymnasium import spaces
from pettingzoo import AECEnv
from pettingzoo.utils import AgentSelector

from envs.config import REWARD_COMPONENTS, TeamEnvConfig, WorkerSpec
from envs.observation import ObservationEncoder, derive_flags
from envs.spaces import ChatSpace, MessageSpace
from envs.tasks.base import Split, Task, TaskFamily, Verdict

CONDUCTOR = "conductor"
ENV_ID = "orchestra_team_v1"  # bump on a change to the spaces, the rewards, the masks or the episode ends (table above)


class IllegalActionError(ValueError):
    """The conductor chose an action its mask forbids (or a worker acted out of turn)."""


@dataclass(frozen=True)
class Instruct:
    """A conductor action in its own words: ``worker`` receives ``text`` instead of a declared instruction's template.

    ``env.step(Instruct("solver", "multiply first, then subtract"))`` is legal when some declared instruction of that
    LLM worker is legal now; the env treats it as the discrete action of the nearest legal declared instruction
    (:meth:`TeamEnv.map_instruction`), so masks, rewards and the observation layout stay those of the discrete
    space that learners use, while the worker reads the text. Tools take no free-text instruction.
    """

    worker: str
    text: str


@dataclass(frozen=True)
class MappedInstruction:
    """Where an :class:`Instruct` lands in the discrete action space."""

    action: int  # the discrete action id (worker, nearest legal declared instruction)
    instruction: str  # the declared instruction's name
    similarity: float  # cosine similarity of the text and that instruction's template under the team's encoder


def instruction_problem(config: TeamEnvConfig, mask: np.ndarray, worker: str, text: str) -> str | None:
    """Why ``Instruct(worker, text)`` cannot be taken under ``mask`` (an unknown worker, a tool, an empty text, no legal
    instruction for the worker now), or None. The env, the human session and the LLM conductor share this check."""
    spec = next((w for w in config.workers if w.name == worker), None)
    if spec is None:
        return f"unknown worker {worker!r} (workers: {', '.join(config.worker_names)})"
    if spec.kind != "llm":
        return f"{worker} is a tool: it takes no free-text instruction"
    if not any(mask[config.action_id(worker, ins)] for ins in spec.instructions):
        ok = [config.action_label(int(a)) for a in np.flatnonzero(mask)]
        return f"{worker} cannot be given a turn now (legal: {ok})"
    if not text.strip():
        return f"{worker}: the instruction text is empty"
    return None


class TeamEnv(AECEnv):
    metadata = {"name": ENV_ID, "render_modes": ["human", "ansi"], "is_parallelizable": False}

    def __init__(
        self,
        config: TeamEnvConfig,
        family: TaskFamily,
        *,
        split: Split = "train",
        tasks: Sequence[Task] | None = None,
        difficulty: int | None = None,
        render_mode: str | None = None,
        encoder: ObservationEncoder | None = None,
    ) -> None:
        super().__init__()
        self.config = config
        self.family = family
        self.split = split
        self.difficulty = difficulty
        self._task_pool = list(tasks) if tasks is not None else None
        self.render_mode = render_mode
        self.encoder = encoder if encoder is not None else ObservationEncoder(config)
        self.possible_agents = [CONDUCTOR, *config.worker_names]
        self._workers: dict[str, WorkerSpec] = {w.name: w for w in config.workers}
        n_obs = self.encoder.size
        self._conductor_obs_space = spaces.Dict(
            {
                "observation": spaces.Box(-np.inf, np.inf, shape=(n_obs,), dtype=np.float32),
                "action_mask": spaces.Box(0, 1, shape=(config.num_actions,), dtype=np.int8),
            }
        )
        self._conductor_act_space = spaces.Discrete(config.num_actions)
        # a Dict so that PettingZoo's dtype checks (which read only the "observation" key) pass
        self._worker_obs_space = spaces.Dict({"chat": ChatSpace()})
        self._worker_act_space = MessageSpace()
        self.task: Task | None = None
        self.transcript: list[dict[str, Any]] = []
        self.turn = 0
        self.pending: tuple[str, str] | None = None  # (worker, instruction) awaiting a message
        self.pending_text: str | None = None  # the conductor's own instruction text for the pending turn (Instruct)
        self.final_verdict: Verdict | None = None
        self.step_reward_vector: dict[str, float] = dict.fromkeys(REWARD_COMPONENTS, 0.0)
        self._obs_cache: np.ndarray | None = None

    # -- spaces -----------------------------------------------------------------------------------
    def observation_space(self, agent: str) -> spaces.Space[Any]:
        return self._conductor_obs_space if agent == CONDUCTOR else self._worker_obs_space

    def action_space(self, agent: str) -> spaces.Space[Any]:
        return self._conductor_act_space if agent == CONDUCTOR else self._worker_act_space

    # -- episode control --------------------------------------------------------------------------
    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> None:
        options = options or {}
        if "task" in options:
            self.task = options["task"]
        else:
            self.task = self._draw_task(0 if seed is None else seed)
        if seed is not None:
            for space in (self._conductor_act_space, self._worker_act_space, self._worker_obs_space):
                space.seed(seed)
        self.agents = list(self.possible_agents)
        self.rewards = dict.fromkeys(self.agents, 0.0)
        self._cumulative_rewards = dict.fromkeys(self.agents, 0.0)
        self.terminations = dict.fromkeys(self.agents, False)
        self.truncations = dict.fromkeys(self.agents, False)
        self.transcript = []
        self.turn = 0
        self.pending = None
        self.pending_text = None
        self.final_verdict = None
        self.step_reward_vector = dict.fromkeys(REWARD_COMPONENTS, 0.0)
        self._obs_cache = None
        self._selector = AgentSelector([CONDUCTOR])
        self.agent_selection = CONDUCTOR
        self.infos: dict[str, dict[str, Any]] = {a: {} for a in self.agents}
        self._refresh_infos()

    def _draw_task(self, seed: int) -> Task:
        if self._task_pool:
            return self._task_pool[seed % len(self._task_pool)]
        return self.family.generate(self.split, 1, seed, self.difficulty)[0]

    # -- structured state -------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The structured state (JSON): what rule-based conductors read and trajectories record."""
        assert self.task is not None, "call reset() first"
        t = self.task
        state: dict[str, Any] = {
            "task": {
                "id": t.id,
                "family": t.family,
                "split": t.split,
                "prompt": t.prompt,  # the state holds the prompt, never the answer or solution-derived metadata
            },
            "turn": self.turn,
            "max_turns": self.config.max_turns,
            "transcript": copy.deepcopy(self.transcript),
        }
        state["flags"] = derive_flags(state)
        return state

    def _has_candidate(self) -> bool:
        return bool(derive_flags({"transcript": self.transcript})["has_candidate"])

    def action_mask(self) -> np.ndarray:
        mask = np.zeros(self.config.num_actions, dtype=np.int8)
        if self.agents and self.agent_selection == CONDUCTOR and self.pending is None:
            met = {"candidate": self._has_candidate(), "message": bool(self.transcript)}
            if self.turn < self.config.max_turns:  # budget spent: submitting is all that is left
                for w in self.config.workers:
                    requires = dict(w.requires)
                    for ins in w.instructions:
                        if ins not in requires or met[requires[ins]]:
                            mask[self.config.action_id(w.name, ins)] = 1
            if met["candidate"] or self.config.give_up:
                mask[self.config.submit_action] = 1
        return mask

    def _conductor_vector(self) -> np.ndarray:
        if self._obs_cache is None:
            self._obs_cache = self.encoder.encode(self.state_dict())
        return self._obs_cache

    def observe(self, agent: str) -> Any:
        if agent == CONDUCTOR:
            return {"observation": self._conductor_vector().copy(), "action_mask": self.action_mask()}
        return {"chat": self.worker_chat(agent)}

    def visible_messages(self, agent: str) -> list[dict[str, Any]]:
        w = self._workers[agent]
        if w.sees == "all":
            return list(self.transcript)
        if w.sees == "own":
            return [m for m in self.transcript if m["worker"] == agent]
        if w.sees == "last":
            return self.transcript[-1:]
        if w.sees == "task":
            return []
        return [m for m in self.transcript if m["worker"] in w.sees]

    def worker_chat(self, agent: str) -> list[dict[str, str]]:
        """The chat ``agent`` would answer now: role prompt, then instruction, task and visible messages."""
        assert self.task is not None, "call reset() first"
        w = self._workers[agent]
        mine = self.pending is not None and self.pending[0] == agent
        instruction = self.pending[1] if self.pending is not None and mine else w.instructions[0]
        text = self.pending_text if mine and self.pending_text is not None else self.config.instructions[instruction]
        limit = self.config.max_message_chars
        # instruction first: a small model tends to echo a trailing instruction instead of following it
        parts = [text, f"Task:\n{self.task.prompt}"]
        visible = self.visible_messages(agent)
        if visible:
            lines = [f"[{m['worker']}] {m['text'][:limit].strip()}" for m in visible]
            parts.append("Messages so far:\n" + "\n\n".join(lines))
        chat = []
        if w.role_prompt:
            chat.append({"role": "system", "content": w.role_prompt})
        first = self.config.instructions[w.instructions[0]]
        for task, reply in w.examples:  # demonstrations: answered turns laid out like the real one
            chat.append({"role": "user", "content": f"{first}\n\nTask:\n{task}"})
            chat.append({"role": "assistant", "content": reply})
        chat.append({"role": "user", "content": "\n\n".join(parts)})
        return chat

    # -- instructions in the conductor's own words ---------------------------------------------------
    def map_instruction(self, worker: str, text: str) -> MappedInstruction:
        """The discrete action an :class:`Instruct` stands for now: ``worker`` with the legal declared instruction
        whose template is nearest to ``text`` (cosine similarity under the team's sentence encoder; a team without
        one, ``embedder: none``, uses the hash encoder; ties go to the first declared). :class:`IllegalActionError`
        names what is wrong: an unknown worker, a tool, an empty text, or no legal instruction for the worker now."""
        mask = self.action_mask()
        problem = instruction_problem(self.config, mask, worker, text)
        if problem is not None:
            raise IllegalActionError(problem)
        legal = [ins for ins in self._workers[worker].instructions if mask[self.config.action_id(worker, ins)]]
        from envs.embeddings import get_embedder  # only an Instruct needs it

        embedder = self.encoder.embedder if self.encoder.embedder.name != "none" else get_embedder("hash")
        vecs = embedder.embed([text.strip(), *(self.config.instructions[ins] for ins in legal)])
        sims = vecs[1:] @ vecs[0]
        best = int(np.argmax(sims))
        return MappedInstruction(self.config.action_id(worker, legal[best]), legal[best], round(float(sims[best]), 6))

    # -- stepping ---------------------------------------------------------------------------------
    def step(self, action: Any) -> None:
        agent = self.agent_selection
        if self.terminations[agent] or self.truncations[agent]:
            self._was_dead_step(action)
            return
        self._cumulative_rewards[agent] = 0.0
        vec = dict.fromkeys(REWARD_COMPONENTS, 0.0)
        if agent == CONDUCTOR and isinstance(action, Instruct):
            mapped = self.map_instruction(action.worker, action.text)
            self._conductor_step(mapped.action, vec)
            self.pending_text = action.text.strip()
        elif agent == CONDUCTOR:
            self._conductor_step(int(action), vec)
        else:
            self._worker_step(agent, action, vec)
        scalar = self.config.scalarise(vec)
        self.step_reward_vector = vec
        self.rewards = dict.fromkeys(self.agents, scalar)
        self._obs_cache = None
        self._refresh_infos()
        self._accumulate_rewards()
        if self.render_mode == "human":
            print(self.render())

    def _conductor_step(self, action: int, vec: dict[str, float]) -> None:
        mask = self.action_mask()
        if not 0 <= action < self.config.num_actions:
            raise IllegalActionError(f"conductor action {action} out of range [0, {self.config.num_actions})")
        if not mask[action]:
            legal = [self.config.action_label(int(a)) for a in np.flatnonzero(mask)]
            raise IllegalActionError(
                f"conductor action {action} ({self.config.action_label(action)}) is masked; legal: {legal}"
            )
        if action == self.config.submit_action:
            assert self.task is not None
            index = derive_flags({"transcript": self.transcript})["candidate_index"]
            if index is None:  # giving up (the team allows it): nothing to verify, a failure
                self.final_verdict = Verdict(0.0, "gave up: submitted without a candidate answer")
            else:
                self.final_verdict = self.family.verify(self.task, self.transcript[index]["text"])
            vec["success"] = float(self.final_verdict.score)
            self.terminations = dict.fromkeys(self.agents, True)
            return
        worker, instruction = self.config.decode_action(action)
        assert worker is not None and instruction is not None
        self.pending = (worker, instruction)
        vec["turn_cost"] = -1.0
        self.agent_selection = worker

    def _worker_step(self, agent: str, action: Any, vec: dict[str, float]) -> None:
        if self.pending is None or self.pending[0] != agent:
            raise IllegalActionError(f"{agent} acted but the conductor did not pick it")
        if isinstance(action, Mapping):
            text, tokens, verdict = str(action["text"]), int(action.get("tokens", 0)), action.get("verdict")
        elif isinstance(action, str):
            text, tokens, verdict = action, len(action.split()), None
        else:
            raise IllegalActionError(f"{agent}: a worker's action is its message (str or mapping), got {type(action)}")
        w = self._workers[agent]
        if w.kind == "tool" and verdict is None:
            verdict = "n/a"
        if verdict not in (None, "pass", "fail", "n/a"):
            raise IllegalActionError(f"{agent}: verdict must be pass, fail or n/a, got {verdict!r}")
        answer = None
        if w.proposes_answer and (w.kind == "llm" or verdict in w.answer_verdicts):
            assert self.task is not None
            answer = self.family.verify(self.task, text).extracted
        entry: dict[str, Any] = {
            "worker": agent,
            "instruction": self.pending[1],
            "text": text,
            "verdict": verdict,
            "answer": answer,
            "tokens": tokens,
            "proposes_answer": w.proposes_answer,
        }
        if self.pending_text is not None:  # the conductor's own words (the declared name above is the nearest one)
            entry["instruction_text"] = self.pending_text
        self.transcript.append(entry)
        vec["token_cost"] = -tokens / 100.0
        vec["price"] = -w.price(tokens)
        if verdict in ("pass", "fail") and self._has_candidate():
            vec["progress"] = 1.0 if verdict == "pass" else -1.0
        if w.proposes_answer and w.kind == "llm" and answer is None:
            vec["format"] = -1.0
        self.pending = None
        self.pending_text = None
        self.turn += 1
        self.agent_selection = CONDUCTOR
        if self.turn >= self.config.max_turns and not self._has_candidate():
            # the budget is spent and there is nothing to submit; with a candidate the conductor
            # gets one last decision, in which submit is the only legal action
            self.truncations = dict.fromkeys(self.agents, True)

    def _refresh_infos(self) -> None:
        for a in self.agents:
            self.infos[a] = {"reward_vector": dict(self.step_reward_vector)}
        if CONDUCTOR in self.infos and self.task is not None:
            self.infos[CONDUCTOR]["state"] = self.state_dict()
            self.infos[CONDUCTOR]["action_mask"] = self.action_mask()

    def render(self) -> str | None:
        if self.render_mode is None or self.task is None:
            return None
        lines = [f"task {self.task.id}: {self.task.prompt}", f"turn {self.turn}/{self.config.max_turns}"]
        for m in self.transcript:
            tag = f" [{m['verdict']}]" if m["verdict"] else ""
            said = f" {m['instruction_text']!r}" if m.get("instruction_text") else ""
            lines.append(f"  {m['worker']} ({m['instruction']}{said}){tag}: {m['text'][:200]!r}")
        if self.final_verdict is not None:
            lines.append(f"submitted: score {self.final_verdict.score} ({self.final_verdict.reason})")
        return "\n".join(lines)

    def close(self) -> None:
        pass
