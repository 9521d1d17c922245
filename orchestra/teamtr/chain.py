"""Telephone-chain (Lewis signalling chain) testbed for TeamTR, with exact evaluation (docs/architecture.md §5).

The game: a key k ~ Uniform{0..V−1}. Agent 0 sees only k and emits one message symbol m_0 ∈ {0..V−1}; agent i sees
only m_{i−1} and emits m_i. The team succeeds iff m_{n−1} == k (reward 1, else 0).

Agents are tiny transformers causal LMs (a random-init ``LlamaForCausalLM``, never downloaded). The LM vocabulary is
the V message symbols (token id j = symbol j, so a sampled token id IS the message and nothing is ever re-tokenised)
plus one special, BOS = V. An agent's context is ``[BOS, input symbol]`` (T_ctx = 2) and its message is ONE token
sampled at temperature 1 from the next-token logits restricted to the V symbols (the BOS logit is dropped). Default
layout (docs/architecture.md §5): one frozen base shared by all agents with one peft LoRA adapter per agent (``agent_0``…); the
option ``shared_base=False`` gives every agent its own base (sizes may differ: heterogeneous teams).

Because an agent's input is one of V symbols, its policy is a V×V row-stochastic matrix P_i[x, y] = π_i(y | x),
computed EXACTLY by one batched forward over the V contexts (:func:`policy_matrix`). Then, 0-based agents throughout:

    J = tr(P_0 P_1 ⋯ P_{n−1}) / V                                    (team success)
    d_i(k, x) = (1/V) [P_0 ⋯ P_{i−1}]_{k,x},   d_0(k, x) = 1[x = k] / V   (agent i's joint (key, input) occupancy)

and the drift definitions (b) and (d) of the design note ``docs/telephone-chain.md`` §1 are pure functions of
team snapshots (:func:`drift_b`, :func:`drift_d`). Pure functions take and return numpy float64 arrays (anything
``np.asarray`` accepts, e.g. CPU torch tensors). Matrices: (V, V), rows = inputs, columns = messages.

These models are so small that a forward is dispatch-bound: on a busy CPU, ``torch.set_num_threads(1)`` is much
faster than the default (the caller's choice; this module never touches process-wide settings).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import torch
import torch.nn.functional as F
from peft import PeftModel
from torch import Tensor
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from orchestra.teamtr.config import derive_seed
from orchestra.teamtr.lora import multi_adapter_model
from orchestra.teamtr.protocols import base_parameters_of, load_snapshot, snapshot

Matrix = npt.NDArray[np.float64]
TrainIndex = Sequence[int] | Literal["fresh", "stale"]

LLAMA_LINEAR_MODULES: tuple[str, ...] = (
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
    "lm_head",
)

# ----------------------------------------------------------------------------------------------------------------
# configs


@dataclass(frozen=True)
class ChainModelConfig:
    """Size of one tiny random-init Llama base (no download ever)."""

    hidden_size: int = 32  # residual width
    intermediate_size: int = 64  # MLP width
    num_layers: int = 2  # decoder layers
    num_heads: int = 4  # attention heads (= key/value heads); must divide hidden_size
    attn_implementation: str = "sdpa"  # transformers attention kernel ("sdpa" | "eager")


@dataclass(frozen=True)
class ChainConfig:
    """Everything that defines a telephone-chain team; the same config and seed give bit-identical models on CPU."""

    n_agents: int = 4  # chain length n
    vocab_size: int = 8  # V message symbols (= keys)
    model: ChainModelConfig = field(default_factory=ChainModelConfig)  # the base (every base if not shared)
    shared_base: bool = True  # True: one frozen base + one LoRA adapter per agent; False: one base per agent
    agent_models: tuple[ChainModelConfig, ...] = ()  # per-agent bases (needs shared_base=False); () = all `model`
    lora_r: int = 8  # LoRA rank (≥ V−1 lets lm_head alone express any V×V policy)
    lora_alpha: int = 16  # LoRA scale numerator (scale = alpha / r)
    lora_dropout: float = 0.0  # 0 keeps train-mode and sampling log-probs identical
    lora_targets: tuple[str, ...] = (
        LLAMA_LINEAR_MODULES  # module names that get LoRA (lm_head is needed: see warm_start)
    )
    seed: int = 0  # base + adapter initialisation seed
    warm_pass: float = 0.85  # warm-start target per-hop pass probability p = π(x | x)
    warm_steps: int = 500  # warm start: max Adam steps per agent
    warm_lr: float = 1e-2  # warm start: Adam learning rate
    warm_kl_tol: float = 1e-4  # warm start: stop an agent once mean_x KL(target(·|x) ‖ π(·|x)) < this
    warm_pass_tol: float = 0.03  # warm start fails if an agent's measured pass ends farther than this from warm_pass
    device: str = "cpu"  # torch device of the models

    def __post_init__(self) -> None:
        if self.n_agents < 1 or self.vocab_size < 2:
            raise ValueError(f"need n_agents ≥ 1 and vocab_size ≥ 2, got {self.n_agents}, {self.vocab_size}")
        if not 0.0 < self.warm_pass < 1.0:
            raise ValueError(f"warm_pass must be in (0, 1), got {self.warm_pass}")
        if self.agent_models and (self.shared_base or len(self.agent_models) != self.n_agents):
            raise ValueError("agent_models needs shared_base=False and one ChainModelConfig per agent")
        for m in (self.model, *self.agent_models):
            if m.hidden_size % m.num_heads:
                raise ValueError(f"num_heads={m.num_heads} must divide hidden_size={m.hidden_size}")

    def base_config(self, agent: int) -> ChainModelConfig:
        """The base size of ``agent`` (the shared ``model`` unless ``agent_models`` is set)."""
        return self.agent_models[agent] if self.agent_models else self.model


# ----------------------------------------------------------------------------------------------------------------
# the team: models, adapters, parameter access


def _build_base(cfg: ChainConfig, mcfg: ChainModelConfig) -> LlamaForCausalLM:
    llama = LlamaConfig(
        vocab_size=cfg.vocab_size + 1,  # V symbols + BOS
        hidden_size=mcfg.hidden_size,
        intermediate_size=mcfg.intermediate_size,
        num_hidden_layers=mcfg.num_layers,
        num_attention_heads=mcfg.num_heads,
        num_key_value_heads=mcfg.num_heads,
        max_position_embeddings=8,  # contexts are 2 tokens long
        bos_token_id=cfg.vocab_size,
        eos_token_id=None,
        pad_token_id=None,
        tie_word_embeddings=False,  # lm_head is its own module, so LoRA can target it
    )
    model = AutoModelForCausalLM.from_config(llama, attn_implementation=mcfg.attn_implementation)
    assert isinstance(model, LlamaForCausalLM)
    return model


def _wrap(base: LlamaForCausalLM, cfg: ChainConfig, adapters: Sequence[str]) -> PeftModel:
    """peft multi-adapter model with the chain's LoRA settings (:func:`~orchestra.teamtr.lora.multi_adapter_model`)."""
    return multi_adapter_model(
        base, adapters, r=cfg.lora_r, alpha=cfg.lora_alpha, dropout=cfg.lora_dropout, targets=cfg.lora_targets
    )


class ChainTeam:
    """n LM agents of a telephone chain: models, adapter selection and parameter access.

    Shared base: ``models`` = [one PeftModel holding adapters ``agent_0``…``agent_{n−1}``]. Separate bases: one
    PeftModel per agent, each with its own adapter; agent i's base is seeded from (seed, i). Models stay in eval mode
    (Llama here has no dropout and ``lora_dropout`` defaults to 0, so gradients are unaffected). The base weights are
    frozen by peft; :meth:`select` makes the chosen adapter the active, trainable one (peft's ``set_adapter``).
    """

    def __init__(self, cfg: ChainConfig) -> None:
        self.cfg = cfg
        self.adapter_names: tuple[str, ...] = tuple(f"agent_{i}" for i in range(cfg.n_agents))
        self.models: list[PeftModel] = []
        with torch.random.fork_rng(devices=[]):  # deterministic init without disturbing the caller's RNG
            if cfg.shared_base:
                torch.manual_seed(cfg.seed)
                self.models.append(_wrap(_build_base(cfg, cfg.model), cfg, self.adapter_names))
            else:
                for i, name in enumerate(self.adapter_names):
                    torch.manual_seed(derive_seed(cfg.seed, i))
                    self.models.append(_wrap(_build_base(cfg, cfg.base_config(i)), cfg, [name]))
        for model in self.models:
            model.to(cfg.device).eval()
        # head-only LoRA: frozen final hidden states per base (V, d); clear it after writing base weights in place
        self.hidden_cache: dict[int, Tensor] = {}
        self._base_params: dict[int, list[torch.nn.Parameter]] = {}  # per base: its non-LoRA parameters
        self._adapter_params: dict[int, dict[str, torch.nn.Parameter]] = {}  # per agent: its LoRA parameters

    @property
    def n_agents(self) -> int:
        return self.cfg.n_agents

    @property
    def vocab_size(self) -> int:
        return self.cfg.vocab_size

    @property
    def bos_id(self) -> int:
        return self.cfg.vocab_size

    @property
    def device(self) -> torch.device:
        return torch.device(self.cfg.device)

    def _check(self, agent: int) -> None:
        if not 0 <= agent < self.n_agents:
            raise IndexError(f"agent {agent} out of range for a chain of {self.n_agents}")

    def model_of(self, agent: int) -> PeftModel:
        """The PeftModel that holds ``agent``'s adapter (the shared one, or the agent's own)."""
        self._check(agent)
        return self.models[0] if self.cfg.shared_base else self.models[agent]

    def select(self, agent: int) -> PeftModel:
        """Activate ``agent``'s adapter (trainable; the other adapters of that model frozen) and return its model."""
        model = self.model_of(agent)
        model.set_adapter(self.adapter_names[agent])
        return model

    def contexts(self, inputs: Tensor) -> Tensor:
        """Token ids of the agents' prompts ``[BOS, x]`` for input symbols ``inputs`` (B,) → (B, 2)."""
        bos = torch.full_like(inputs, self.bos_id)
        return torch.stack([bos, inputs], dim=1).to(self.device)

    def base_trainable(self, agent: int) -> bool:
        """True iff some base weight under ``agent``'s adapter requires grad (someone unfroze it): the head-only fast
        path of :func:`message_logits` is then skipped and its cache of frozen hidden states dropped."""
        key = 0 if self.cfg.shared_base else agent
        if key not in self._base_params:
            self._base_params[key] = [p for k, p in self.models[key].named_parameters() if "lora_" not in k]
        trainable = any(p.requires_grad for p in self._base_params[key])
        if trainable:
            self.hidden_cache.pop(key, None)
        return trainable

    def adapter_parameters(self, agent: int) -> dict[str, torch.nn.Parameter]:
        """``agent``'s LoRA parameters by name (what its optimizer should hold)."""
        if agent not in self._adapter_params:  # the Parameter objects never change (states are copied in place)
            tag = f".{self.adapter_names[agent]}."
            self._adapter_params[agent] = {k: p for k, p in self.model_of(agent).named_parameters() if tag in k}
        return dict(self._adapter_params[agent])

    def base_parameters(self) -> dict[str, Tensor]:
        """Every non-LoRA parameter of every base, by name (prefixed ``base{j}.`` with separate bases)."""
        return base_parameters_of(list(self.models), self.cfg.shared_base)

    def adapter_state(self, agent: int) -> dict[str, Tensor]:
        """Detached copies of ``agent``'s LoRA parameters (a snapshot to revert to, e.g. trust-region backtracking)."""
        return snapshot(self.adapter_parameters(agent))

    def load_adapter_state(self, agent: int, state: dict[str, Tensor]) -> None:
        """Copy a snapshot from :meth:`adapter_state` back into ``agent``'s LoRA parameters, in place."""
        load_snapshot(self.adapter_parameters(agent), state, f"agent {agent}")


# ----------------------------------------------------------------------------------------------------------------
# exact policies and LM log-probs


def message_logits(team: ChainTeam, agent: int, input_ids: Tensor) -> Tensor:
    """Next-token logits of ``agent`` on contexts ``input_ids`` (B, T_ctx), restricted to the V symbols → (B, V).

    With grad (wrap in ``torch.no_grad()`` for sampling); the special tokens' logits are dropped, i.e. masked out.
    When LoRA targets ``lm_head`` only (:func:`head_only`), the exact head-only path :func:`_head_logits` is taken.
    """
    if head_only(team.cfg) and input_ids.shape[-1] == 2 and not team.base_trainable(agent):
        return _head_logits(team, agent, input_ids)
    model = team.select(agent)
    logits = model(input_ids=input_ids.to(team.device), use_cache=False).logits  # (B, T_ctx, V+1)
    return logits[:, -1, : team.vocab_size]  # (B, V)


def head_only(cfg: ChainConfig) -> bool:
    """True iff LoRA adapts ``lm_head`` alone (without dropout): the frozen base's last hidden state then depends on
    the input symbol only, so it is computed once per base and reused (:func:`_head_logits`)."""
    return tuple(cfg.lora_targets) == ("lm_head",) and cfg.lora_dropout == 0.0


def _head_logits(team: ChainTeam, agent: int, input_ids: Tensor) -> Tensor:
    """Exact head-only logits: h = H[x] (H (V, d): the frozen base's final hidden state at [BOS, x], cached per base),
    then peft's LoRA Linear computed in its own order, W h + B_a(A_a(h)) · s_a, for the agent's adapter a (no
    dropout). Equal to the full forward up to float rounding (tested); about 10× fewer kernel launches."""
    model: Any = team.model_of(agent)
    name = team.adapter_names[agent]
    key = 0 if team.cfg.shared_base else agent
    hidden = team.hidden_cache.get(key)
    if hidden is None:
        with torch.no_grad():
            ctx = team.contexts(torch.arange(team.vocab_size))  # (V, 2)
            hidden = model.get_base_model().model(input_ids=ctx, use_cache=False).last_hidden_state[:, -1]  # (V, d)
        team.hidden_cache[key] = hidden
    head: Any = model.get_base_model().lm_head  # peft lora.Linear around the frozen nn.Linear
    lora_a, lora_b = head.lora_A[name].weight, head.lora_B[name].weight  # (r, d), (V+1, r)
    for p in (lora_a, lora_b):
        if not p.requires_grad:  # peft's set_adapter froze it while another agent was active
            p.requires_grad_(True)
    h = hidden[input_ids[:, -1].to(team.device)]  # (B, d)
    logits = F.linear(h, head.base_layer.weight) + F.linear(F.linear(h, lora_a), lora_b) * head.scaling[name]
    return logits[:, : team.vocab_size]  # (B, V)


def policy_matrix(team: ChainTeam, agent: int) -> Matrix:
    """Exact P_i[x, y] = π_i(y | x) from one batched forward over the V contexts [BOS, x] → (V, V) float64."""
    inputs = torch.arange(team.vocab_size)
    with torch.no_grad():
        logits = message_logits(team, agent, team.contexts(inputs))  # (V, V)
    return torch.softmax(logits.double(), dim=-1).cpu().numpy()


def policy_matrices(team: ChainTeam) -> list[Matrix]:
    """[P_0, …, P_{n−1}] of the current team."""
    return [policy_matrix(team, i) for i in range(team.n_agents)]


def team_success(team: ChainTeam) -> float:
    """Exact J of the current team (:func:`exact_success` of :func:`policy_matrices`)."""
    return exact_success(policy_matrices(team))


@dataclass(frozen=True)
class ChainBatch:
    """B sampled episodes of the chain; agent-major tensors on the team's device.

    ``messages[i]`` are the exact sampled token ids (= symbols) of agent i, ``input_ids[i]`` the contexts it saw,
    ``logprobs[i]`` their log-probabilities under the sampling policy (temperature 1, over the V symbols).
    """

    keys: Tensor  # (B,) long, the hidden keys
    input_ids: Tensor  # (n, B, T_ctx) long, agent i's context [BOS, m_{i−1}] (m_{−1} = key)
    messages: Tensor  # (n, B) long, sampled message token ids
    logprobs: Tensor  # (n, B) float32, behaviour log π_i(m_i | context), no grad
    rewards: Tensor  # (B,) float32, 1[m_{n−1} == key]

    @property
    def batch_size(self) -> int:
        return int(self.keys.shape[0])


def sample_rollouts(team: ChainTeam, batch_size: int, generator: torch.Generator) -> ChainBatch:
    """Sample ``batch_size`` episodes from the current team, agent by agent along the chain, batched over B.

    Randomness comes only from ``generator`` (a CPU ``torch.Generator``): keys, then one multinomial draw per agent.
    """
    keys = torch.randint(team.vocab_size, (batch_size,), generator=generator)  # (B,)
    inputs = keys
    b_ids, b_msgs, b_logp = [], [], []
    for i in range(team.n_agents):
        ids = team.contexts(inputs)  # (B, T_ctx)
        with torch.no_grad():
            logp = torch.log_softmax(message_logits(team, i, ids), dim=-1)  # (B, V)
        msgs = torch.multinomial(logp.exp().cpu(), 1, generator=generator).squeeze(1)  # (B,)
        b_ids.append(ids)
        b_msgs.append(msgs.to(team.device))
        b_logp.append(logp.gather(1, b_msgs[-1].unsqueeze(1)).squeeze(1))
        inputs = msgs
    keys = keys.to(team.device)
    return ChainBatch(
        keys=keys,
        input_ids=torch.stack(b_ids),
        messages=torch.stack(b_msgs),
        logprobs=torch.stack(b_logp),
        rewards=(b_msgs[-1] == keys).float(),
    )


def agent_logits(team: ChainTeam, agent: int, batch: ChainBatch) -> Tensor:
    """Current logits over the V symbols at ``agent``'s recorded contexts → (B, V), with grad (exact-vocab KL)."""
    return message_logits(team, agent, batch.input_ids[agent])


def agent_logprobs(team: ChainTeam, agent: int, batch: ChainBatch) -> Tensor:
    """log π_i^θ(m_i | context) of ``agent``'s recorded messages under its current adapter → (B,), with grad."""
    logp = torch.log_softmax(agent_logits(team, agent, batch), dim=-1)  # (B, V)
    return logp.gather(1, batch.messages[agent].unsqueeze(1)).squeeze(1)


# ----------------------------------------------------------------------------------------------------------------
# warm start


@dataclass(frozen=True)
class WarmStartReport:
    """Outcome of :func:`warm_start`: per-agent exact pass probability, final KL and steps, total wall time."""

    pass_prob: tuple[float, ...]  # mean_x P_i[x, x] after training
    kl: tuple[float, ...]  # mean_x KL(target(·|x) ‖ π_i(·|x)) at the last step
    steps: tuple[int, ...]  # Adam steps taken
    seconds: float  # wall time of the whole warm start


def noisy_pass_through(vocab_size: int, p: float) -> Matrix:
    """Target policy T[x, x] = p, T[x, y≠x] = (1 − p)/(V − 1) → (V, V)."""
    target = np.full((vocab_size, vocab_size), (1.0 - p) / (vocab_size - 1))
    np.fill_diagonal(target, p)
    return target


def pass_for_success(success: float, n_agents: int, vocab_size: int) -> float:
    """The per-hop pass probability p at which a chain of ``n_agents`` noisy pass-throughs (:func:`noisy_pass_through`)
    has team success ``success``. T = λI + (1 − λ)/V · 11ᵀ with λ = p − (1 − p)/(V − 1), so
    J = tr(Tⁿ)/V = 1/V + (1 − 1/V)·λⁿ, hence λ = ((J − 1/V)/(1 − 1/V))^(1/n) and p = (λ(V − 1) + 1)/V.

    Raises:
        ValueError: ``success`` is not in (1/V, 1).
    """
    v = vocab_size
    if not 1.0 / v < success < 1.0 or n_agents < 1:
        raise ValueError(f"need 1/V < success < 1 and n ≥ 1, got success={success}, V={v}, n={n_agents}")
    lam = ((success - 1.0 / v) / (1.0 - 1.0 / v)) ** (1.0 / n_agents)
    return (lam * (v - 1) + 1.0) / v


def shifted_pass_through(vocab_size: int, p: float, shift: int = 1) -> Matrix:
    """A competent agent of ANOTHER message convention: it relays input x as symbol x + shift (mod V) with
    probability p (:func:`noisy_pass_through` with its columns rolled) → (V, V)."""
    return np.roll(noisy_pass_through(vocab_size, p), shift, axis=1)


def warm_start(team: ChainTeam, cfg: ChainConfig | None = None, *, target: Matrix | None = None) -> WarmStartReport:
    """Supervised warm start of EVERY agent's adapter to the noisy pass-through (docs/telephone-chain.md §5: drift scaling
    is measured in the reliable-agent regime, per-hop pass ≥ 0.8).

    For each agent in turn (base frozen, fresh Adam on its LoRA parameters only), full-batch over the V contexts:
        minimise  L = (1/V) Σ_x KL(T(·|x) ‖ π_i(·|x))   (= soft-label cross-entropy − its constant entropy)
    until L < ``warm_kl_tol`` or ``warm_steps``. LoRA must reach lm_head: a random-init base with its final norm and
    lm_head frozen cannot produce logit gaps of log(p(V−1)/(1−p)) ≈ 3.7. Deterministic given the team's seed.
    The ``warm_*`` knobs come from ``cfg`` (default: the team's own config). The base weights are never touched.
    ``target`` replaces the noisy pass-through (e.g. :func:`shifted_pass_through`); the pass probability checked is
    then the probability of each row's most likely target symbol.

    Raises:
        RuntimeError: an agent's exact pass probability ended farther than ``warm_pass_tol`` from ``warm_pass``.
    """
    cfg = team.cfg if cfg is None else cfg
    start = time.perf_counter()
    goal = noisy_pass_through(team.vocab_size, cfg.warm_pass) if target is None else np.asarray(target, np.float64)
    hit_cols = goal.argmax(axis=1)  # the symbol each input should be relayed as
    soft = torch.as_tensor(goal, dtype=torch.float32, device=team.device)
    log_target = soft.log()  # (V, V)
    ids = team.contexts(torch.arange(team.vocab_size))  # (V, T_ctx)
    passes, kls, steps = [], [], []
    for i in range(team.n_agents):
        opt = torch.optim.Adam(list(team.adapter_parameters(i).values()), lr=cfg.warm_lr)
        step = 0
        while True:
            logp = torch.log_softmax(message_logits(team, i, ids), dim=-1)  # (V, V)
            loss = (soft * (log_target - logp)).sum(dim=-1).mean()  # mean_x KL(T(·|x) ‖ π_i(·|x))
            kl = loss.item()
            if kl < cfg.warm_kl_tol or step == cfg.warm_steps:
                break
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
        opt.zero_grad(set_to_none=True)  # leave no stale gradients behind for the caller's optimizer
        passes.append(float(policy_matrix(team, i)[np.arange(team.vocab_size), hit_cols].mean()))
        kls.append(kl)
        steps.append(step)
    report = WarmStartReport(tuple(passes), tuple(kls), tuple(steps), time.perf_counter() - start)
    bad = [i for i, p in enumerate(passes) if abs(p - cfg.warm_pass) > cfg.warm_pass_tol]
    if bad:
        raise RuntimeError(f"warm start missed pass {cfg.warm_pass}±{cfg.warm_pass_tol} for agents {bad}: {report}")
    return report


# ----------------------------------------------------------------------------------------------------------------
# exact team quantities (pure functions on lists of (V, V) row-stochastic matrices)


def _mats(mats: Sequence[npt.ArrayLike]) -> list[Matrix]:
    out = [np.asarray(m, dtype=np.float64) for m in mats]
    if not out or any(m.ndim != 2 or m.shape != out[0].shape or m.shape[0] != m.shape[1] for m in out):
        raise ValueError("need a non-empty list of square matrices of one size")
    return out


def exact_success(mats: Sequence[npt.ArrayLike]) -> float:
    """J = tr(P_0 P_1 ⋯ P_{n−1}) / V: the probability that the last message equals a uniform key."""
    ps = _mats(mats)
    prod = np.linalg.multi_dot(ps) if len(ps) > 1 else ps[0]  # (V, V)
    return float(np.trace(prod) / prod.shape[0])


def exact_success_with(mats: Sequence[npt.ArrayLike], agent: int, mat: npt.ArrayLike) -> float:
    """J of the team with agent ``agent``'s matrix replaced by ``mat`` (exact value of a one-agent update)."""
    ps = _mats(mats)
    ps[agent] = np.asarray(mat, dtype=np.float64)
    return exact_success(ps)


def pass_probabilities(mats: Sequence[npt.ArrayLike]) -> Matrix:
    """Per-hop pass probability mean_x P_i[x, x] of every agent → (n,)."""
    return np.array([float(np.diag(m).mean()) for m in _mats(mats)])


def occupancies(mats: Sequence[npt.ArrayLike]) -> list[Matrix]:
    """Joint (key, input) occupancies [d_0, …, d_{n−1}], each (V, V) summing to 1:

    d_0(k, x) = 1[x = k] / V,   d_i(k, x) = (1/V) [P_0 ⋯ P_{i−1}]_{k,x}
    """
    ps = _mats(mats)
    d = np.eye(ps[0].shape[0]) / ps[0].shape[0]  # (V, V)
    out = [d]
    for p in ps[:-1]:
        d = d @ p
        out.append(d)
    return out


def tv_distance(p: npt.ArrayLike, q: npt.ArrayLike) -> float:
    """Total variation ½ Σ |p − q| over all entries (joint distributions of any shape)."""
    return 0.5 * float(np.abs(np.asarray(p, dtype=np.float64) - np.asarray(q, dtype=np.float64)).sum())


def row_tv(p_old: npt.ArrayLike, p_new: npt.ArrayLike) -> Matrix:
    """Per-input TV(π_old(·|x), π_new(·|x)) = ½ Σ_y |P_old[x, y] − P_new[x, y]| → (V,)."""
    return 0.5 * np.abs(np.asarray(p_old, dtype=np.float64) - np.asarray(p_new, dtype=np.float64)).sum(axis=1)


def own_step_tv(occupancy: npt.ArrayLike, p_old: npt.ArrayLike, p_new: npt.ArrayLike) -> float:
    """E_{(k,x)∼d_i} TV(π_i^old(·|x), π_i^new(·|x)) = Σ_x (Σ_k d_i(k, x)) · TV_x."""
    return float(np.asarray(occupancy, dtype=np.float64).sum(axis=0) @ row_tv(p_old, p_new))


def own_step_kl(occupancy: npt.ArrayLike, p_old: npt.ArrayLike, p_new: npt.ArrayLike) -> float:
    """E_{(k,x)∼d_i} KL(π_i^old(·|x) ‖ π_i^new(·|x)): the exact occupancy-weighted trust-region KL."""
    old = np.asarray(p_old, dtype=np.float64)
    new = np.asarray(p_new, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(old > 0, old * (np.log(old) - np.log(new)), 0.0)  # (V, V)
    return float(np.asarray(occupancy, dtype=np.float64).sum(axis=0) @ terms.sum(axis=1))


# ----------------------------------------------------------------------------------------------------------------
# drift over one stage (docs/telephone-chain.md §1). A stage makes U updates: update m changes agent order[m].
# snapshots[m] = the team's matrices just before update m (snapshots[0] = stage start, snapshots[U] = stage end);
# train_index[m] = t_m, the snapshot its training batch was sampled from: "fresh" (TeamTR, t_m = m) or "stale"
# (naive / stale_indep, t_m = 0), or explicit. Every *_terms function returns one term per update → (U,).


def _stage(
    snapshots: Sequence[Sequence[npt.ArrayLike]], order: Sequence[int], train_index: TrainIndex
) -> tuple[list[list[Matrix]], list[int]]:
    snaps = [_mats(s) for s in snapshots]
    n_updates = len(order)
    if len(snaps) != n_updates + 1 or any(len(s) != len(snaps[0]) for s in snaps):
        raise ValueError(f"need {n_updates + 1} team snapshots of one size for {n_updates} updates")
    if any(not 0 <= a < len(snaps[0]) for a in order):
        raise ValueError(f"order {list(order)} names an agent outside 0..{len(snaps[0]) - 1}")
    if train_index == "fresh":
        t = list(range(n_updates))
    elif train_index == "stale":
        t = [0] * n_updates
    else:
        t = [int(x) for x in train_index]
    if len(t) != n_updates or any(not 0 <= tm <= m for m, tm in enumerate(t)):
        raise ValueError(f"train_index {t}: need one 0 ≤ t_m ≤ m per update (a batch cannot come from the future)")
    return snaps, t


def _occ(snaps: list[list[Matrix]], m: int, agent: int) -> Matrix:
    return occupancies(snaps[m][: agent + 1])[agent]  # d_agent only depends on agents 0..agent−1


def stale_mismatch_terms(
    snapshots: Sequence[Sequence[npt.ArrayLike]], order: Sequence[int], train_index: TrainIndex
) -> Matrix:
    """Definition (a), mismatch incurred: TV(d_i^{train}, d_i^{at update}) = TV(d_i(S[t_m]), d_i(S[m])), i = order[m]."""
    snaps, t = _stage(snapshots, order, train_index)
    return np.array(
        [tv_distance(_occ(snaps, tm, i), _occ(snaps, m, i)) for m, (i, tm) in enumerate(zip(order, t, strict=True))]
    )


def exact_surrogate(team: Sequence[Matrix], agent: int, p_old: Matrix, p_new: Matrix) -> float:
    """The first-order gain of changing ``agent``'s policy from ``p_old`` to ``p_new`` in ``team`` (matrices):
    L = Σ_{k,x} d_agent(k, x) Σ_y (p_new − p_old)[x, y] Q[y, k], with d_agent the agent's (key, input) occupancy
    and Q[y, k] = [P_{agent+1} ⋯ P_{n−1}]_{y,k} the chance that message y still reaches key k. It is the exact
    expectation of the sampled surrogate mean (ρ − 1)·R on episodes of ``team`` (a baseline adds 0)."""
    d = occupancies(list(team[: agent + 1]))[agent]  # (V, V) over (k, x)
    rest = list(team[agent + 1 :])
    q = np.linalg.multi_dot(rest) if len(rest) > 1 else (rest[0] if rest else np.eye(d.shape[0]))  # (V, V) y → k
    return float(np.einsum("kx,xy,yk->", d, p_new - p_old, q))


def stale_gap_terms(
    snapshots: Sequence[Sequence[npt.ArrayLike]], order: Sequence[int], train_index: TrainIndex
) -> Matrix:
    """Stale gap of update m (docs/algorithms.md §2.3), exact: |L(S[t_m]) − L(S[m])| for the update's own change
    P_i^{S[m]} → P_i^{S[m+1]}, i = order[m], L = :func:`exact_surrogate` in the team its batch came from vs the team
    it acts in. 0 for a fresh batch (t_m = m)."""
    snaps, t = _stage(snapshots, order, train_index)
    return np.array(
        [
            abs(
                exact_surrogate(snaps[tm], i, snaps[m][i], snaps[m + 1][i])
                - exact_surrogate(snaps[m], i, snaps[m][i], snaps[m + 1][i])
            )
            for m, (i, tm) in enumerate(zip(order, t, strict=True))
        ]
    )


def drift_b_terms(
    snapshots: Sequence[Sequence[npt.ArrayLike]], order: Sequence[int], train_index: TrainIndex
) -> Matrix:
    """Definition (b): TV(d_i(S[r_m]), d_i(S[m])), i = order[m], r_m = max(0, min(t_m, m − 1)).

    * stale batch (t_m < m; naive): r_m = t_m, the occupancy shift ACCUMULATED since the batch was sampled (= (a));
    * fresh batch (t_m = m; TeamTR): r_m = m − 1, the ONE-UPDATE shift caused by the previous update
      TV(d_i^{before upd m−1}, d_i^{after}); 0 for the first update. Agent 0's term is always 0 (its input is the key).
    With a random order the previous update is often downstream (term 0): (b) is meant for a fixed order.
    """
    snaps, t = _stage(snapshots, order, train_index)
    terms = [
        tv_distance(_occ(snaps, max(0, min(tm, m - 1)), i), _occ(snaps, m, i))
        for m, (i, tm) in enumerate(zip(order, t, strict=True))
    ]
    return np.array(terms)


def drift_b(snapshots: Sequence[Sequence[npt.ArrayLike]], order: Sequence[int], train_index: TrainIndex) -> float:
    """Σ_m of :func:`drift_b_terms` (naive: Σ_i TV(d_i^{start}, d_i^{at update}); TeamTR: Σ_i one-update shifts)."""
    return float(drift_b_terms(snapshots, order, train_index).sum())


def own_step_terms(snapshots: Sequence[Sequence[npt.ArrayLike]], order: Sequence[int]) -> Matrix:
    """Own step of update m: E_{d_i(S[m])} TV(P_i^{S[m]}(·|x), P_i^{S[m+1]}(·|x)), i = order[m].

    d_i is taken at update time; it equals d_i(S[m+1]) since an update never moves the updated agent's own input.
    """
    snaps, _ = _stage(snapshots, order, "fresh")
    return np.array([own_step_tv(_occ(snaps, m, i), snaps[m][i], snaps[m + 1][i]) for m, i in enumerate(order)])


def drift_d_terms(
    snapshots: Sequence[Sequence[npt.ArrayLike]], order: Sequence[int], train_index: TrainIndex
) -> Matrix:
    """Definition (d): TV(d_i^{train}, d_i^{at update}) + E_{d_i} TV(π_i^{old}, π_i^{new}) per update (TeamTR: own
    step only, its mismatch is 0)."""
    return stale_mismatch_terms(snapshots, order, train_index) + own_step_terms(snapshots, order)


def drift_d(snapshots: Sequence[Sequence[npt.ArrayLike]], order: Sequence[int], train_index: TrainIndex) -> float:
    """Σ_m of :func:`drift_d_terms`."""
    return float(drift_d_terms(snapshots, order, train_index).sum())
