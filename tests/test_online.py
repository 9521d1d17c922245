"""Online refinement: MaskablePPO learns a routing problem through the conductor gym; warm start,
save/load, resume, and the finetune job end to end (all with scripted or tool workers, no LLM)."""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable, Mapping
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
import yaml

from envs.config import TeamEnvConfig, WorkerSpec
from envs.tasks.base import Split, Task, ToolFn, Verdict
from orchestra.backends.base import GenerationParams
from orchestra.jobs.conductor_ppo import ConductorPPOConfig, train_conductor_ppo
from orchestra.runtime.conductor_gym import ConductorGymEnv, SafetyRails
from orchestra.runtime.rollout import RolloutEngine, plan_jobs
from orchestra.runtime.workers import Worker
from policies.base import ConductorPolicy, PolicyError
from policies.learning.checkpoint import ConductorMeta, LayoutError, team_layout
from policies.learning.dataset import build_dataset
from policies.learning.learned import load_conductor
from policies.learning.online import PPOConductor, PPOConfig, aggregate_episode_metrics, train_ppo
from tests.test_conductor_gym import ScriptedBackend, make_team


class RoutingFamily:
    """Each task is of kind "a" or "b"; the kind shows in the observation through the prompt, which names
    it: its (hash) embedding and its length (the observation holds no difficulty or kind field)."""

    name = "routing"
    difficulties: tuple[int, ...] = (1, 2)

    def generate(self, split: Split, n: int, seed: int, difficulty: int | None = None) -> list[Task]:
        rng = random.Random(f"{split}:{seed}:{difficulty}")
        out = []
        for i in range(n):
            d = difficulty if difficulty is not None else rng.choice(self.difficulties)
            x = rng.randrange(1000)
            meta = {"kind": "a" if d == 1 else "b"}
            prompt = "An alpha task." if d == 1 else "A beta task, of the second kind, with a much longer prompt."
            out.append(Task(f"routing-{split}-{seed}-{i}", self.name, split, prompt, str(x), d, seed, meta))
        return out

    def verify(self, task: Task, text: str) -> Verdict:
        m = re.search(r"Answer:\s*(\S+)", text)
        if m is None:
            return Verdict(0.0, "no answer", None)
        got = m.group(1)
        return Verdict(float(got == task.answer), "checked", got)

    def tools(self) -> Mapping[str, ToolFn]:
        return {}


ROUTE_CFG = TeamEnvConfig(
    name="routing",
    workers=(WorkerSpec("alpha", "llm", ("solve",)), WorkerSpec("beta", "llm", ("solve",))),
    instructions={"solve": "Solve."},
    max_turns=1,
    embedder="hash",
)
FAMILY = RoutingFamily()
TEAM = make_team(ROUTE_CFG, "routing")
ALPHA, BETA, SUBMIT = 0, 1, 2


def expert(kind: str) -> Callable[[Task, object], str]:
    """A worker that answers right on its own kind of task and wrong on the other."""
    return lambda t, _: f"Answer: {t.answer if t.metadata['kind'] == kind else 'wrong'}"


def route_workers() -> dict[str, Worker]:
    return {
        "alpha": Worker("alpha", "llm", ScriptedBackend(expert("a"), tokens=3), GenerationParams(), "v1"),
        "beta": Worker("beta", "llm", ScriptedBackend(expert("b"), tokens=3), GenerationParams(), "v1"),
    }


def route_env(seed: int = 0, split: Split = "train") -> ConductorGymEnv:
    return ConductorGymEnv(TEAM, FAMILY, route_workers(), SafetyRails(), split=split, seed=seed)


def route_meta(env: ConductorGymEnv) -> ConductorMeta:
    names, labels = team_layout(ROUTE_CFG, env.encoder)
    return ConductorMeta("ppo", ROUTE_CFG.name, env.encoder.embedder.name, names, labels)


class Oracle:
    """Routes by the task's kind, then submits (the expert the warm start clones)."""

    name = "oracle"

    def reset(self, seed: int | None = None) -> None:
        pass

    def act(self, obs: np.ndarray, action_mask: np.ndarray, state: Mapping | None = None) -> int:
        assert state is not None
        if action_mask[SUBMIT]:
            return SUBMIT
        return ALPHA if state["task"]["prompt"].startswith("An alpha") else BETA


def evaluate(conductor: ConductorPolicy, episodes: int = 60, seed: int = 123) -> tuple[float, float]:
    """(success rate, share of right first picks) on fresh held-out episodes; every pick must be legal."""
    env = route_env(seed=seed, split="test")
    successes = right = 0
    for _ in range(episodes):
        obs, info = env.reset()
        first, done = True, False
        while not done:
            mask = env.action_masks()
            a = conductor.act(obs, mask.astype(np.int8), info["state"])
            assert mask[a], "the conductor emitted a masked action"
            if first:
                right += int(a == (ALPHA if info["state"]["task"]["prompt"].startswith("An alpha") else BETA))
                first = False
            obs, _, term, trunc, info = env.step(a)
            done = term or trunc
        successes += int(info["episode_metrics"]["rollout/success_rate"])
    return successes / episodes, right / episodes


FAST = PPOConfig(
    total_timesteps=2048, n_steps=256, batch_size=64, n_epochs=10, learning_rate=3e-4, ent_coef=0.01, seed=0
)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[PPOConductor, Path]:
    out = tmp_path_factory.mktemp("ppo")
    env = route_env()
    return train_ppo(env, FAST, out, meta=route_meta(env)), out


def test_ppo_learns_to_route(trained: tuple[PPOConductor, Path]) -> None:
    conductor, out = trained
    success, right = evaluate(conductor)
    assert right >= 0.9 and success >= 0.9
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == FAST.total_timesteps // FAST.n_steps
    last = rows[-1]
    for key in (
        "rollout/ep_return_mean",
        "rollout/success_rate",
        "losses/policy_gradient_loss",
        "losses/value_loss",
        "rails/denied",
    ):
        assert key in last, key
    assert last["rollout/success_rate"] > rows[0]["rollout/success_rate"]
    header = (out / "metrics.csv").read_text().splitlines()[0].split(",")
    assert "rollout/ep_return_mean" in header and "losses/approx_kl" in header
    cfg = json.loads((out / "ppo_config.json").read_text())
    assert cfg["ppo"] == asdict(FAST)


def test_save_load_round_trip_gives_identical_decisions(
    trained: tuple[PPOConductor, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import cloudpickle

    def no_unpickling(*a: object, **k: object) -> None:
        raise AssertionError("a checkpoint load unpickled something")

    monkeypatch.setattr(cloudpickle, "loads", no_unpickling)  # stable-baselines3 would unpickle `data` entries
    conductor, out = trained
    env = route_env(seed=7)
    obs_batch, masks = [], []
    for _ in range(20):
        obs, _ = env.reset()
        obs_batch.append(obs)
        masks.append(env.action_masks().astype(np.int8))
    conductor.save(tmp_path / "copy")
    for folder in (out / "checkpoint", tmp_path / "copy"):
        loaded = load_conductor(folder, ROUTE_CFG, env.encoder)
        assert isinstance(loaded, PPOConductor) and loaded.meta.algo == "ppo"
        for o, m in zip(obs_batch, masks, strict=True):
            assert loaded.act(o, m) == conductor.act(o, m)
    # only submit legal → submit, whatever the network prefers
    only_submit = np.array([0, 0, 1], dtype=np.int8)
    assert conductor.act(obs_batch[0], only_submit) == SUBMIT
    other = TeamEnvConfig(
        "other",
        (*ROUTE_CFG.workers, WorkerSpec("gamma", "llm", ("solve",))),
        ROUTE_CFG.instructions,
        1,
        embedder="none",
    )
    from envs.observation import ObservationEncoder

    with pytest.raises(LayoutError, match="action space differs"):
        PPOConductor.load(out / "checkpoint", other, ObservationEncoder(other))
    # the same layout from another sentence encoder is refused too, by both loaders
    import json
    import shutil

    shutil.copytree(out / "checkpoint", tmp_path / "minilm")
    meta = json.loads((tmp_path / "minilm" / "conductor.json").read_text())
    (tmp_path / "minilm" / "conductor.json").write_text(json.dumps({**meta, "embedder": "minilm"}))
    for load in (PPOConductor.load, load_conductor):
        with pytest.raises(LayoutError, match="trained on 'minilm' sentence embeddings"):
            load(tmp_path / "minilm", ROUTE_CFG, env.encoder)
    # a model whose data holds a pickled entry orchestra does not rebuild is refused, not unpickled
    import zipfile

    shutil.copytree(out / "checkpoint", tmp_path / "hostile")
    model = tmp_path / "hostile" / "model.zip"
    with zipfile.ZipFile(out / "checkpoint" / "model.zip") as src, zipfile.ZipFile(model, "w") as dst:
        for item in src.namelist():
            raw = src.read(item)
            if item == "data":
                raw = json.dumps({**json.loads(raw), "payload": {":serialized:": "gASV"}}).encode()
            dst.writestr(item, raw)
    with pytest.raises(PolicyError, match="payload"):
        PPOConductor.load(tmp_path / "hostile", ROUTE_CFG, env.encoder)


def test_warm_start_from_a_dataset_raises_agreement(tmp_path: Path) -> None:
    tasks = FAMILY.generate("train", 40, seed=3)
    engine = RolloutEngine(TEAM, FAMILY, route_workers(), Oracle, conductor_name="oracle", num_envs=4, progress=False)
    episodes = engine.run(plan_jobs(tasks, 3, "oracle"))
    env = route_env()
    ds = build_dataset(None, ROUTE_CFG, env.encoder, episodes=episodes)
    ds.check_layout(ROUTE_CFG, env.encoder)
    cfg = PPOConfig(total_timesteps=0, warm_start_epochs=30, seed=0)
    conductor = train_ppo(env, cfg, tmp_path, meta=route_meta(env), warm_start=ds)
    row = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])
    assert row["warm_start/agreement_after"] >= row["warm_start/agreement_before"]
    assert row["warm_start/agreement_after"] >= 0.95 and row["warm_start/loss_after"] < row["warm_start/loss_before"]
    assert evaluate(conductor, episodes=30)[1] >= 0.9  # the cloned policy already routes
    meta = ConductorMeta.load(tmp_path / "checkpoint")
    assert meta.algo == "ppo" and meta.dataset["episodes"] == 40


def test_resume_continues_from_the_checkpoint(tmp_path: Path) -> None:
    env = route_env()
    cfg = PPOConfig(total_timesteps=256, n_steps=128, batch_size=64, n_epochs=2, seed=1)
    train_ppo(env, cfg, tmp_path, meta=route_meta(env))
    more = PPOConfig(**{**asdict(cfg), "total_timesteps": 384})
    c = train_ppo(route_env(), more, tmp_path, meta=route_meta(env), resume=True)
    assert c.model.num_timesteps == 384
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["global_step"] for r in rows] == [128, 256, 384] and [r["rollout"] for r in rows] == [1, 2, 3]


def test_aggregate_episode_metrics_means_rates_sums_counts() -> None:
    eps = [
        {"rollout/ep_return_mean": 1.0, "rollout/success_rate": 1.0, "rails/denied": 2},
        {"rollout/ep_return_mean": 0.0, "rollout/success_rate": 0.0, "rails/denied": 1},
    ]
    m = aggregate_episode_metrics(eps)
    assert m == {
        "rollout/episodes": 2.0,
        "rollout/ep_return_mean": 0.5,
        "rollout/success_rate": 0.5,
        "rails/denied": 3.0,
    }


def test_finetune_job_end_to_end(tmp_path: Path) -> None:
    """A tool-only arithmetic team (no LLM to load): warm start from a rule-based teacher, rails on."""
    team_file = tmp_path / "calc.yaml"
    team_file.write_text(
        yaml.safe_dump(
            {
                "name": "calc-only",
                "family": "arithmetic",
                "embedder": "none",
                "max_turns": 2,
                "instructions": {"check": "Check it.", "solve": "Solve it."},
                "workers": [
                    {"name": "calculator", "kind": "tool", "tool": "calculator", "instructions": ["check", "solve"]}
                ],
            }
        )
    )
    cfg = ConductorPPOConfig(
        team=str(team_file),
        timesteps=128,
        n_steps=64,
        batch_size=32,
        n_epochs=2,
        warm_start="round_robin",
        warm_start_episodes=8,
        warm_start_epochs=5,
        allow=["calculator:check", "submit"],
        use_cache=False,
        progress=False,
    )
    run = train_conductor_ppo(cfg, tmp_path / "run")
    for name in (
        "config.json",
        "ppo_config.json",
        "metrics.jsonl",
        "metrics.csv",
        "summary.json",
        "checkpoint/model.zip",
        "checkpoint/conductor.json",
    ):
        assert (run / name).exists(), name
    summary = json.loads((run / "summary.json").read_text())
    assert summary["timesteps"] == 128 and summary["rails_totals"]["rails/filtered"] > 0
    assert summary["warm_start"]["warm_start/decisions"] > 0
    assert json.loads((run / "config.json").read_text())["config"]["allow"] == ["calculator:check", "submit"]
    from envs.observation import ObservationEncoder
    from orchestra.runtime.team_file import load_team

    team = load_team(team_file)
    meta = ConductorMeta.load(run / "checkpoint")
    assert meta.dataset["teacher"] == "round_robin" and meta.config["finetune"]["timesteps"] == 128
    conductor = load_conductor(run / "checkpoint", team.env, ObservationEncoder(team.env))
    mask = np.array([1, 0, 0], dtype=np.int8)
    assert conductor.act(np.zeros(ObservationEncoder(team.env).size, np.float32), mask) == 0
    with pytest.raises(ValueError, match="not a dataset file"):
        train_conductor_ppo(
            ConductorPPOConfig(team=str(team_file), warm_start="nonsense", use_cache=False, progress=False),
            tmp_path / "bad",
        )
