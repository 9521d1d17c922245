"""Phase 2 sampling on a server while training runs in torch (``LLMTeamConfig.sampler_url``): each worker's adapter is
published after every update, and the server samples with exactly the adapters being trained.

The server is :class:`tests.vllm_like.VLLMLike`, vLLM's dialect over its own copy of the tiny base model: it knows the
adapters only through what the team publishes. So the behaviour log-probs it returns equal the team's current torch
log-probs (``behaviour_gap`` ≤ 1e-4) only if every update reached it; a control that stops publishing breaks that.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from orchestra.backends.hf import TransformersBackend
from orchestra.backends.http import adapter_digest
from orchestra.teamtr.config import TeamTRConfig
from orchestra.teamtr.llm import LLMTeam
from orchestra.teamtr.llm_config import LLMTeamConfig, LLMTeamError
from orchestra.teamtr.llm_models import load_base
from orchestra.teamtr.trainer import train
from tests.vllm_like import VLLMLike

pytestmark = pytest.mark.usefixtures("one_thread")


def _server(cfg: LLMTeamConfig) -> VLLMLike:
    base, tok, model_id = load_base(cfg.model, cfg, cfg.seed)  # the same base weights, no adapter
    return VLLMLike(TransformersBackend.from_model(base, tok, model_id, cfg.max_batch_size, seed=7), "tiny")


def _cfg(duo_file: Path, **kw: object) -> LLMTeamConfig:
    return LLMTeamConfig(
        team=str(duo_file),
        model="tiny",
        workers=("solver", "critic"),
        max_tokens=6,
        group_size=2,
        num_envs=4,
        conductor="random",
        seed=0,
        **kw,  # type: ignore[arg-type]
    )


def test_training_samples_on_the_server_with_the_adapters_it_trains(duo_file: Path, tmp_path: Path) -> None:
    cfg = _cfg(duo_file, eval_tasks=2)
    server = _server(cfg)
    try:
        team = LLMTeam(
            dataclasses.replace(
                cfg, sampler_url=server.url, sampler_model="tiny", sampler_adapter_dir=str(tmp_path / "adapters")
            )
        )
        local_calls = 0
        real = team.backends[0].generate_ids

        def counted(*a: object, **k: object) -> object:
            nonlocal local_calls
            local_calls += 1
            return real(*a, **k)  # type: ignore[arg-type]

        team.backends[0].generate_ids = counted  # type: ignore[method-assign]
        tcfg = TeamTRConfig(num_stages=2, batch_size=4, lr=1e-2, delta=0.05, order="random", seed=1)
        res = train(team, tcfg, out_dir=tmp_path / "run")
        assert len(res.updates) == 4
        for row in res.updates:
            name = team.agent_names[int(row["rollout/agent"])]
            assert row[f"agent/{name}/behaviour_gap"] <= 1e-4  # sampled with the adapter as trained so far
        assert any(row["kl/k3"] > 0 for row in res.updates)  # the adapters moved, so versions had to be published
        assert local_calls == 0 and server.completions > 0  # every trainable turn was sampled on the server
        loads = [b["lora_name"] for p, b in server.log if p == "/v1/load_lora_adapter"]
        assert len(loads) == len(set(loads)) >= 2 + 4  # the initial pair, then one version per update at least
        final = team.publish()  # nothing changed since the last publish: no new load, the names are the held ones
        assert sorted(server.loaded) == sorted(final.values())
        assert [b["lora_name"] for p, b in server.log if p == "/v1/load_lora_adapter"] == loads
        for name, served in final.items():  # the served version is the bytes of the current adapter
            assert served == f"{name}@{adapter_digest(str(tmp_path / 'adapters' / served))}"
    finally:
        server.close()


def test_a_server_that_misses_the_updates_shows_in_the_behaviour_gap(duo_file: Path, tmp_path: Path) -> None:
    """The control: publish once, then never again. The server keeps sampling with the initial adapters while
    training moves them, and the gap between its log-probs and the team's opens."""
    cfg = _cfg(duo_file)
    server = _server(cfg)
    try:
        team = LLMTeam(dataclasses.replace(cfg, sampler_url=server.url, sampler_model="tiny"))
        team.publish()
        team.publish = lambda: {}  # type: ignore[method-assign]
        tcfg = TeamTRConfig(num_stages=2, batch_size=4, lr=5e-2, delta=0.5, order="random", seed=1)
        res = train(team, tcfg, out_dir=tmp_path / "run")
        gaps = [row[f"agent/{team.agent_names[int(row['rollout/agent'])]}/behaviour_gap"] for row in res.updates]
        assert gaps[0] <= 1e-4 and max(gaps) > 1e-3
    finally:
        server.close()


def test_sampler_settings_are_checked(duo_file: Path) -> None:
    with pytest.raises(LLMTeamError, match="shared_base"):
        _cfg(duo_file, sampler_url="http://127.0.0.1:1", shared_base=False)
    assert torch.get_num_threads() == 1  # the module's one-thread fixture is on
