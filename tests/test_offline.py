"""Offline conductor learning through d3rlpy: BC imitates, CQL finds the optimal schedule of a small
synthetic orchestration problem, masks are respected, checkpoints round-trip, FQE estimates a known
policy's value."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from envs.observation import ObservationEncoder
from orchestra.jobs.phase1 import drop_stale_evaluation, model_digest
from orchestra.runtime.team_file import load_team
from policies.learning.checkpoint import LayoutError, PolicyError
from policies.learning.dataset import ConductorDataset, EpisodeInfo, build_dataset
from policies.learning.learned import load_conductor
from policies.learning.offline import FQEConfig, OfflineConductor, OfflineConfig, agreement, fqe_evaluate, train_offline
from tests.scripted import arithmetic_team, record_scripted
from trajectories.rundir import ConfigMismatchError

# -- a synthetic orchestration problem with a known optimal schedule -------------------------------
# Two workers, "good:go" (its answer is right) and "bad:go" (wrong), then submit. Each worker turn
# costs 0.02; submitting the latest answer pays 1 if it came from "good". At most 3 worker turns.
# Optimal: good:go, submit (return 0.98). Observation: [turn/3, turns_left, has_candidate,
# latest_is_good, latest_is_bad].
LABELS = ["good:go", "bad:go", "submit"]
FEATURES = ["turn_frac", "turns_left_frac", "has_candidate", "latest_good", "latest_bad"]
MAX_TURNS = 3


def _obs(turn: int, latest: int | None) -> np.ndarray:
    return np.array(
        [turn / MAX_TURNS, 1 - turn / MAX_TURNS, latest is not None, latest == 0, latest == 1], dtype=np.float32
    )


def _mask(o: np.ndarray) -> np.ndarray:
    o = np.atleast_2d(o)
    m = np.zeros((o.shape[0], 3), np.int8)
    m[:, :2] = (o[:, 1] > 1e-6)[:, None]
    m[:, 2] = o[:, 2] > 0.5
    return m


def _step(turn: int, latest: int | None, a: int) -> tuple[int, int | None, float, bool]:
    if a == 2:
        return turn, latest, float(latest == 0), True
    return turn + 1, a, -0.02, False


def synthetic(n_episodes: int, seed: int, policy=None) -> ConductorDataset:  # type: ignore[no-untyped-def]
    """Episodes of a uniformly random (or given) behaviour policy."""
    rng = np.random.default_rng(seed)
    obs, act, rew, term, tout, masks, idx, finals, infos = [], [], [], [], [], [], [], [], []
    for e in range(n_episodes):
        turn, latest, done, ret = 0, None, False, 0.0
        while not done:
            o = _obs(turn, latest)
            m = _mask(o)[0]
            if not m.any():  # budget spent, no candidate: truncated
                tout[-1] = 1.0
                break
            a = int(policy(o[None], m[None])[0]) if policy else int(rng.choice(np.flatnonzero(m)))
            turn, latest, r, done = _step(turn, latest, a)
            obs.append(o), act.append(a), rew.append(r), masks.append(m), idx.append(e)
            term.append(float(done)), tout.append(0.0)
            ret += r
        finals.append(_obs(turn, latest))
        infos.append(EpisodeInfo(f"e{e}", "random", "synthetic", "train", f"t{e}", ret > 0.5, ret, False, 0))
    return ConductorDataset(
        observations=np.array(obs, np.float32),
        actions=np.array(act, np.int64),
        rewards=np.array(rew, np.float32),
        terminals=np.array(term, np.float32),
        timeouts=np.array(tout, np.float32),
        masks=np.array(masks, np.int8),
        episode_index=np.array(idx, np.int64),
        final_observations=np.array(finals, np.float32),
        episodes=infos,
        states=[{}] * len(obs),
        feature_names=FEATURES,
        action_labels=LABELS,
        weights={},
        team="synthetic",
        embedder="none",
    )


def rollout(policy) -> tuple[list[str], float]:  # type: ignore[no-untyped-def]
    turn, latest, done, ret, seq = 0, None, False, 0.0, []
    while not done and len(seq) < 10:
        o = _obs(turn, latest)
        m = _mask(o)
        if not m.any():
            break
        a = int(policy(o[None], m)[0])
        assert m[0, a], f"masked action {LABELS[a]} chosen"
        seq.append(LABELS[a])
        turn, latest, r, done = _step(turn, latest, a)
        ret += r
    return seq, ret


@pytest.fixture(scope="module")
def random_data() -> ConductorDataset:
    return synthetic(300, seed=0)


def test_cql_finds_the_known_optimal_schedule(tmp_path: Path, random_data: ConductorDataset) -> None:
    res = train_offline(random_data, OfflineConfig(algo="cql", n_steps=1500, n_steps_per_epoch=500), tmp_path)
    seq, ret = rollout(res.conductor.predict)
    assert seq == ["good:go", "submit"] and ret == pytest.approx(0.98)
    # the behaviour it learned from was far from optimal
    assert np.mean([e.return_ for e in random_data.episodes]) < 0.6
    # metrics per epoch, config and checkpoint in the run dir
    assert (tmp_path / "metrics.csv").read_text().count("\n") == 4
    assert {p.name for p in tmp_path.iterdir()} >= {"model.pt", "algo.json", "conductor.json"}


def test_bcq_filtered_bc_and_the_unconservative_q_learners_also_reach_the_optimum_on_this_problem(
    tmp_path: Path, random_data: ConductorDataset
) -> None:
    for algo in ("bcq", "fbc", "ddqn", "dqn"):
        res = train_offline(random_data, OfflineConfig(algo=algo, n_steps=1500, n_steps_per_epoch=500), tmp_path / algo)
        seq, _ = rollout(res.conductor.predict)
        assert seq[-1] == "submit" and seq[-2] == "good:go", (algo, seq)


def test_masked_actions_are_never_chosen(tmp_path: Path, random_data: ConductorDataset) -> None:
    rng = np.random.default_rng(1)
    obs = rng.random((500, len(FEATURES)), dtype=np.float32)
    masks = rng.integers(0, 2, (500, 3)).astype(np.int8)
    masks[masks.sum(1) == 0, 0] = 1
    for algo in ("bc", "bcq", "dqn", "ddqn", "cql"):
        c = train_offline(
            random_data, OfflineConfig(algo=algo, n_steps=200, n_steps_per_epoch=100), tmp_path / algo
        ).conductor
        picked = c.predict(obs, masks)
        assert masks[np.arange(500), picked].all(), algo
        assert np.isfinite(c.scores(obs, masks)[masks.astype(bool)]).any()
    with pytest.raises(PolicyError, match="all-zero action mask"):
        c.act(obs[0], np.zeros(3, np.int8))


def test_training_repeats_exactly_with_a_seed(tmp_path: Path, random_data: ConductorDataset) -> None:
    cfg = OfflineConfig(algo="cql", n_steps=300, n_steps_per_epoch=100, seed=3)
    a = train_offline(random_data, cfg, tmp_path / "a").conductor
    b = train_offline(random_data, cfg, tmp_path / "b").conductor
    np.testing.assert_array_equal(
        a.scores(random_data.observations, random_data.masks), b.scores(random_data.observations, random_data.masks)
    )
    # the checkpoint bytes repeat too, so a resumed phase-1 run keeps evaluations of unchanged models
    assert model_digest(tmp_path / "a") == model_digest(tmp_path / "b")
    episodes = tmp_path / "eval" / "t-cql.jsonl"
    drop_stale_evaluation(episodes, tmp_path / "a")
    episodes.write_text("{}\n")
    drop_stale_evaluation(episodes, tmp_path / "b")  # same weights: the evaluation is kept
    assert episodes.exists()
    train_offline(random_data, dataclasses.replace(cfg, seed=4), tmp_path / "b")
    drop_stale_evaluation(episodes, tmp_path / "b")  # retrained into other weights: evaluated afresh
    assert not episodes.exists()


def test_fqe_estimates_a_known_policy_within_tolerance(random_data: ConductorDataset) -> None:
    def bad_then_good(o: np.ndarray, m: np.ndarray) -> np.ndarray:
        # bad:go first, then good:go, then submit → −0.02 − 0.99·0.02 + 0.99²·1
        out = np.where(o[:, 2] < 0.5, 1, np.where(o[:, 4] > 0.5, 0, 2))
        return np.where(m[np.arange(len(out)), out] > 0, out, 2)

    truth = -0.02 - 0.99 * 0.02 + 0.99**2
    res = fqe_evaluate(bad_then_good, random_data, _mask, FQEConfig(n_steps=3000, gamma=0.99))
    assert res.estimate == pytest.approx(truth, abs=0.08)
    assert res.behaviour_return < truth - 0.2  # the logs alone would have said much less


# -- on real env episodes (scripted LLM workers, real calculator) ------------------------------------


@pytest.fixture(scope="module")
def heuristic_data() -> tuple[ConductorDataset, ObservationEncoder]:
    team = arithmetic_team()
    enc = ObservationEncoder(team.env)
    eps = record_scripted(team, "heuristic", 40)
    return build_dataset(None, team.env, enc, episodes=eps), enc


def test_bc_agrees_with_the_deterministic_conductor_it_imitates(tmp_path: Path, heuristic_data) -> None:  # type: ignore[no-untyped-def]
    ds, enc = heuristic_data
    train, held = ds.split_episodes(0.25, seed=0)
    res = train_offline(train, OfflineConfig(algo="bc", n_steps=1000, n_steps_per_epoch=500), tmp_path)
    assert agreement(res.conductor, held) >= 0.95
    assert res.metrics[-1]["perf/agreement"] >= 0.95


def test_checkpoint_round_trip_and_layout_check(tmp_path: Path, heuristic_data) -> None:  # type: ignore[no-untyped-def]
    ds, enc = heuristic_data
    team = arithmetic_team()
    res = train_offline(ds, OfflineConfig(algo="cql", n_steps=200, n_steps_per_epoch=100), tmp_path / "cql")
    back = load_conductor(tmp_path / "cql", team.env, enc, name="mine")
    assert isinstance(back, OfflineConductor) and back.name == "mine"
    np.testing.assert_array_equal(
        back.predict(ds.observations, ds.masks), res.conductor.predict(ds.observations, ds.masks)
    )
    blocks = load_team("blocksworld")
    with pytest.raises(LayoutError, match="action space differs"):
        load_conductor(
            tmp_path / "cql", blocks.env, ObservationEncoder(dataclasses.replace(blocks.env, embedder="hash"))
        )
    with pytest.raises(LayoutError, match="observation layout differs"):
        load_conductor(
            tmp_path / "cql",
            team.env,
            ObservationEncoder(dataclasses.replace(team.env, embedder="none", recent_messages=2)),
        )
    with pytest.raises(PolicyError, match="not a conductor checkpoint"):
        load_conductor(tmp_path, team.env, enc)
    (tmp_path / "cql" / "model.pt").write_bytes(b"garbage")
    with pytest.raises(PolicyError, match="cannot load the d3rlpy model"):
        load_conductor(tmp_path / "cql", team.env, enc)


def test_cql_targets_bootstrap_from_the_best_legal_action(random_data: ConductorDataset) -> None:
    """The masked-target patch takes effect inside d3rlpy: with the online Q network pushed to prefer an action that
    is illegal in the next state, DoubleDQN's target (``compute_target``) evaluates the best LEGAL action instead. If
    d3rlpy stopped routing its target through ``inner_predict_best_action``, the masked and unmasked targets would be
    equal and this test would fail."""
    import torch

    from policies.learning.offline import make_algo, mask_target_actions

    cfg = OfflineConfig(algo="cql", n_steps=10, n_steps_per_epoch=10)
    algo = make_algo(cfg)
    mdp = random_data.to_mdp(cfg.truncation)
    algo.build_with_dataset(mdp)
    impl = algo.impl
    with torch.no_grad():  # the online network now always rates "good:go" (action 0) highest
        for q_func in impl._modules.q_funcs:
            heads = [m for m in q_func.modules() if isinstance(m, torch.nn.Linear) and m.out_features == len(LABELS)]
            heads[-1].bias[0] += 100.0
    # next states: budget spent with a candidate (only submit legal), and a fresh state (the workers legal)
    next_obs = torch.tensor(np.stack([_obs(MAX_TURNS, 0), _obs(0, None)]))
    batch = type("Batch", (), {"next_observations": next_obs})()
    unmasked = impl.compute_target(batch).clone()
    assert impl.inner_predict_best_action(next_obs).tolist() == [0, 0]
    mask_target_actions(algo, _mask)
    assert impl.inner_predict_best_action(next_obs).tolist() == [2, 0]  # submit where only submit is legal
    masked = impl.compute_target(batch)
    want = impl._targ_q_func_forwarder.compute_target(next_obs, torch.tensor([2, 0]), reduction="min")
    assert torch.allclose(masked, want) and not torch.allclose(masked[0], unmasked[0])
    assert torch.allclose(masked[1], unmasked[1])  # where the preferred action is legal, nothing changes


# -- resume: a killed run continues from its last finished epoch, bit-identical ------------------------------------


class _Killed(RuntimeError):
    pass


def _model_tensors(folder: Path) -> dict[str, dict[str, np.ndarray]]:
    import torch

    state = torch.load(folder / "model.pt", map_location="cpu", weights_only=True)
    return {k: {n: t.numpy() for n, t in v.items() if hasattr(t, "numpy")} for k, v in state.items()}


def _same_tensors(a: dict[str, dict[str, np.ndarray]], b: dict[str, dict[str, np.ndarray]]) -> bool:
    return a.keys() == b.keys() and all(
        a[k].keys() == b[k].keys() and all(np.array_equal(a[k][n], b[k][n]) for n in a[k]) for k in a
    )


def _untimed(rows: list[dict]) -> list[dict]:  # type: ignore[type-arg]
    """Metric rows without d3rlpy's wall-clock columns (losses/time_*), the only ones allowed to differ."""
    return [{k: v for k, v in r.items() if not k.startswith("losses/time_")} for r in rows]


@pytest.mark.parametrize("algo", ["cql", "bcq"])
def test_a_training_killed_mid_run_resumes_bit_identical(
    algo: str, tmp_path: Path, random_data: ConductorDataset, monkeypatch: pytest.MonkeyPatch
) -> None:
    from policies.learning import train_state

    cfg = OfflineConfig(algo=algo, n_steps=1200, n_steps_per_epoch=300, target_update_interval=250, seed=3)
    straight = train_offline(random_data, cfg, tmp_path / "straight")
    real_save = train_state.save_state

    def save_then_die(out: Path, algo_: object, epoch: int, rows: list) -> Path:  # type: ignore[type-arg]
        folder = real_save(out, algo_, epoch, rows)
        if epoch == 2:
            raise _Killed  # as a SIGKILL after the second epoch's state landed
        return folder

    monkeypatch.setattr(train_state, "save_state", save_then_die)
    with pytest.raises(_Killed):
        train_offline(random_data, cfg, tmp_path / "killed")
    monkeypatch.setattr(train_state, "save_state", real_save)
    # the third epoch's steps ran twice in the killed process's RNG stream: a resume that did not restore the
    # RNGs, the Adam moments or the step counter (target syncs at 250, 500, …) would drift from here
    resumed = train_offline(random_data, cfg, tmp_path / "killed", resume=True)
    assert _untimed(resumed.metrics) == _untimed(straight.metrics) and len(resumed.metrics) == 4
    assert _same_tensors(_model_tensors(tmp_path / "killed"), _model_tensors(tmp_path / "straight"))
    # a finished run resumed again trains nothing and returns the same conductor
    again = train_offline(random_data, cfg, tmp_path / "killed", resume=True)
    assert again.metrics == resumed.metrics


def test_a_fresh_start_without_resume_state_and_a_changed_config_refused(
    tmp_path: Path, random_data: ConductorDataset
) -> None:
    cfg = OfflineConfig(algo="bc", n_steps=200, n_steps_per_epoch=100)
    a = train_offline(random_data, cfg, tmp_path / "a", resume=True)  # nothing to resume: starts from scratch
    b = train_offline(random_data, cfg, tmp_path / "b")
    assert _untimed(a.metrics) == _untimed(b.metrics)
    with pytest.raises(ConfigMismatchError, match=r"cannot resume .*offline\.learning_rate 0\.0003 → 0\.001"):
        train_offline(random_data, dataclasses.replace(cfg, learning_rate=1e-3), tmp_path / "a", resume=True)
    state = tmp_path / "a" / "resume"
    (state / (state / "latest").read_text().strip() / "rng.pt").write_bytes(b"garbage")
    with pytest.raises(PolicyError, match="damaged resume state"):
        train_offline(random_data, cfg, tmp_path / "a", resume=True)


def test_if_same_reuses_a_finished_model_and_retrains_on_another_dataset(
    tmp_path: Path, random_data: ConductorDataset, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``resume="if_same"`` (phase 1's reruns): a finished run of the same config and dataset is reused
    without a gradient step; a changed dataset (its digest) or config trains from scratch instead of failing."""
    cfg = OfflineConfig(algo="bc", n_steps=200, n_steps_per_epoch=100, seed=1)
    first = train_offline(random_data, cfg, tmp_path / "m")
    trained = _model_tensors(tmp_path / "m")
    import d3rlpy.algos

    fitted: list[int] = []
    real_fitter = d3rlpy.algos.DiscreteBC.fitter

    def counting(self: object, *a: object, **k: object) -> object:
        fitted.append(1)
        return real_fitter(self, *a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(d3rlpy.algos.DiscreteBC, "fitter", counting)
    again = train_offline(random_data, cfg, tmp_path / "m", resume="if_same")
    assert fitted == [] and again.metrics == first.metrics
    assert _same_tensors(_model_tensors(tmp_path / "m"), trained)
    other = random_data.subset(list(range(len(random_data.episodes) // 2)))
    assert other.digest() != random_data.digest()
    fresh = train_offline(other, cfg, tmp_path / "m", resume="if_same")
    assert fitted == [1] and len(fresh.metrics) == 2
    reference = train_offline(other, cfg, tmp_path / "ref")
    assert _untimed(fresh.metrics) == _untimed(reference.metrics)
    fitted.clear()
    train_offline(other, dataclasses.replace(cfg, learning_rate=1e-3), tmp_path / "m", resume="if_same")
    assert fitted == [1]  # another config: trained afresh, not refused


def test_phase1_reuses_an_fqe_estimate_only_for_the_same_model_data_config_and_states(
    tmp_path: Path,
    heuristic_data,
    monkeypatch: pytest.MonkeyPatch,  # type: ignore[no-untyped-def]
) -> None:
    from orchestra.jobs import phase1

    ds, enc = heuristic_data
    team = arithmetic_team()
    train_offline(ds, OfflineConfig(algo="bc", n_steps=200, n_steps_per_epoch=100), tmp_path / "m")
    calls: list[int] = []
    real = phase1.fqe_evaluate

    def counted(*a, **k):  # type: ignore[no-untyped-def]
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(phase1, "fqe_evaluate", counted)
    s0 = (ds.observations[:5], ds.masks[:5])
    fcfg = FQEConfig(n_steps=100, n_steps_per_epoch=50)
    path = tmp_path / "fqe" / "bc.json"
    first = phase1.fqe_estimate(path, tmp_path / "m", team.env, enc, ds, fcfg, s0)
    assert phase1.fqe_estimate(path, tmp_path / "m", team.env, enc, ds, fcfg, s0) == first and len(calls) == 1
    phase1.fqe_estimate(path, tmp_path / "m", team.env, enc, ds, dataclasses.replace(fcfg, seed=1), s0)
    phase1.fqe_estimate(path, tmp_path / "m", team.env, enc, ds, fcfg, (ds.observations[:4], ds.masks[:4]))
    assert len(calls) == 3
    train_offline(ds, OfflineConfig(algo="bc", n_steps=200, n_steps_per_epoch=100, seed=5), tmp_path / "m")
    phase1.fqe_estimate(path, tmp_path / "m", team.env, enc, ds, fcfg, (ds.observations[:4], ds.masks[:4]))
    assert len(calls) == 4  # retrained weights: estimated afresh
    path.write_text("{not json")
    phase1.fqe_estimate(path, tmp_path / "m", team.env, enc, ds, fcfg, (ds.observations[:4], ds.masks[:4]))
    assert len(calls) == 5 and "estimate" in path.read_text()  # a damaged file is redone and rewritten
