"""The telephone chain as a :class:`~orchestra.teamtr.trainer.TrainableTeam` (imports transformers and peft).

Layout: every batch row is one episode; every agent emits ONE token per episode, so T = 1 and agent i's own-token
mask is all ones. GRPO groups are the episodes that share a key (the key is the chain's "prompt"; keys are drawn
uniformly, so a batch of B holds V groups of about B/V episodes: GRPO with random group sizes, no duplicate prompts
to schedule).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from orchestra.teamtr.chain import (
    ChainBatch,
    ChainConfig,
    ChainTeam,
    agent_logits,
    agent_logprobs,
    exact_success,
    policy_matrices,
    sample_rollouts,
    team_success,
)


@dataclass(frozen=True)
class ChainRollout:
    """A :class:`~orchestra.teamtr.chain.ChainBatch` in the trainer's layout (``RolloutBatch``), T = 1."""

    chain: ChainBatch

    @property
    def behaviour_logprobs(self) -> Tensor:
        return self.chain.logprobs.unsqueeze(-1)  # (n, B, 1)

    @property
    def mask(self) -> Tensor:
        return torch.ones_like(self.chain.messages, dtype=torch.bool).unsqueeze(-1)  # (n, B, 1)

    @property
    def rewards(self) -> Tensor:
        return self.chain.rewards  # (B,)

    @property
    def group_ids(self) -> Tensor:
        return self.chain.keys  # (B,) GRPO group = the key

    @property
    def batch_size(self) -> int:
        return self.chain.batch_size

    @property
    def num_tokens(self) -> int:
        return int(self.chain.messages.numel())  # n message tokens per episode

    def select(self, rows: Tensor) -> ChainRollout:
        c = self.chain
        return ChainRollout(
            ChainBatch(
                keys=c.keys[rows],
                input_ids=c.input_ids[:, rows],
                messages=c.messages[:, rows],
                logprobs=c.logprobs[:, rows],
                rewards=c.rewards[rows],
            )
        )


class ChainTrainable:
    """Adapter: a :class:`~orchestra.teamtr.chain.ChainTeam` satisfies ``TrainableTeam[ChainRollout]``."""

    def __init__(self, team: ChainTeam) -> None:
        self.team = team
        # the policies as built (a resumed run builds the team as before): the ``reference`` null of coalition_value
        self.reference = policy_matrices(team)

    def coalition_value(self, present: frozenset[int], null: str) -> float:
        """Exact J with only ``present`` acting (``CoalitionTeam``): an absent agent's policy matrix is replaced by
        the identity (``drop``: the next agent reads the message before it), the uniform matrix (``uniform``), or
        its policy when this adapter was built (``reference``)."""
        v = self.team.vocab_size
        mats = policy_matrices(self.team)
        nulls = {"drop": np.eye(v), "uniform": np.full((v, v), 1.0 / v)}
        if null not in (*nulls, "reference"):
            raise ValueError(f"unknown credit null {null!r}; expected drop, uniform or reference")
        out = [
            m if i in present else (self.reference[i] if null == "reference" else nulls[null])
            for i, m in enumerate(mats)
        ]
        return exact_success(out)

    @property
    def config(self) -> ChainConfig:
        """The chain's config (``ConfiguredTeam``): written into run directories and checked on resume."""
        return self.team.cfg

    @property
    def agent_names(self) -> tuple[str, ...]:
        return self.team.adapter_names

    @property
    def has_logits(self) -> bool:
        return True

    @property
    def reduced_precision(self) -> bool:
        return False  # float32 models

    def sample(self, batch_size: int, generator: torch.Generator) -> ChainRollout:
        return ChainRollout(sample_rollouts(self.team, batch_size, generator))

    def logprobs(self, agent: int, batch: ChainRollout) -> Tensor:
        return agent_logprobs(self.team, agent, batch.chain).unsqueeze(-1)  # (B, 1)

    def logits(self, agent: int, batch: ChainRollout) -> Tensor:
        return agent_logits(self.team, agent, batch.chain).unsqueeze(1)  # (B, 1, V)

    def parameters(self, agent: int) -> list[torch.nn.Parameter]:
        return list(self.team.adapter_parameters(agent).values())

    def state(self, agent: int) -> dict[str, Tensor]:
        return self.team.adapter_state(agent)

    def load_state(self, agent: int, state: dict[str, Tensor]) -> None:
        self.team.load_adapter_state(agent, state)

    def exact_success(self) -> float | None:
        return team_success(self.team)
