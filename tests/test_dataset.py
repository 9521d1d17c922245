"""Trajectory files → ConductorDataset → d3rlpy MDPDataset: boundaries, final observation, bad input."""

from __future__ import annotations

import dataclasses
import errno
import json
from pathlib import Path

import numpy as np
import pytest

from envs.observation import ObservationEncoder
from orchestra.runtime.team_file import load_team
from policies.learning.checkpoint import LayoutError
from policies.learning.dataset import ConductorDataset, DatasetError, DatasetFilter, build_dataset
from tests.scripted import arithmetic_team, array_dataset, record_scripted

TEAM = arithmetic_team()
ENC = ObservationEncoder(TEAM.env)


@pytest.fixture(scope="module")
def episodes():  # type: ignore[no-untyped-def]
    return record_scripted(TEAM, "heuristic", 8) + record_scripted(TEAM, "round_robin", 8)


def test_rows_follow_the_episodes_and_reencode_the_stored_state(episodes) -> None:  # type: ignore[no-untyped-def]
    ds = build_dataset(None, TEAM.env, ENC, episodes=episodes)
    assert len(ds.episodes) == 16
    assert len(ds) == sum(len(e.steps) for e in episodes)
    # re-encoding the stored state with the same encoder gives the observation the conductor saw
    stored = np.array([s.observation for e in episodes for s in e.steps], dtype=np.float32)
    np.testing.assert_allclose(ds.observations, stored, atol=1e-5)
    assert ds.actions.tolist() == [s.action.id for e in episodes for s in e.steps]
    # masks recovered from observations equal the env's masks, with the team (its encoder) and without
    # it (the dataset keeps the team's preconditions: critic:check needs a candidate, revise a message)
    np.testing.assert_array_equal(ENC.legal_mask(ds.observations), ds.masks)
    assert ds.action_requires[TEAM.env.action_id("critic", "check")] == "candidate"
    np.testing.assert_array_equal(ds.legal_mask(ds.observations), ds.masks)
    assert ds.masks[:, TEAM.env.action_id("critic", "check")].min() == 0  # the precondition did bind
    gave_up = dataclasses.replace(ds, give_up=True)  # a team that may give up: submit is always legal
    assert gave_up.legal_mask(ds.observations)[:, -1].all()
    s = ds.summary()
    assert set(s["per_conductor"]) == {"heuristic", "round_robin"}
    assert sum(s["action_histogram"].values()) == len(ds)


def test_reward_weights_are_chosen_at_build_time(episodes) -> None:  # type: ignore[no-untyped-def]
    only_success = build_dataset(
        None, TEAM.env, ENC, episodes=episodes, weights={"turn_cost": 0, "token_cost": 0, "format": 0}
    )
    per_ep = [only_success.rewards[only_success.episode_index == i].sum() for i in range(16)]
    assert per_ep == pytest.approx([float(e.score) for e in episodes])
    with pytest.raises(DatasetError, match="unknown component"):
        build_dataset(None, TEAM.env, ENC, episodes=episodes, weights={"speed": 1.0})


def test_filters(episodes) -> None:  # type: ignore[no-untyped-def]
    ds = build_dataset(None, TEAM.env, ENC, episodes=episodes, filters=DatasetFilter(conductors=("round_robin",)))
    assert {e.conductor for e in ds.episodes} == {"round_robin"}
    failed = [e for e in episodes if not e.success]
    ds = build_dataset(None, TEAM.env, ENC, episodes=episodes, filters=DatasetFilter(success_only=True))
    assert len(ds.episodes) == 16 - len(failed) and all(e.success for e in ds.episodes)
    with pytest.raises(DatasetError, match="no episode passed the filters"):
        build_dataset(None, TEAM.env, ENC, episodes=episodes, filters=DatasetFilter(families=("blocksworld",)))


def _ds(terminated: list[bool], truncated: list[bool]) -> ConductorDataset:
    """Two one-decision episodes with chosen end flags (arrays only)."""
    n, d, a = len(terminated), 3, 2
    return array_dataset(
        observations=np.arange(n * d, dtype=np.float32).reshape(n, d),
        actions=np.zeros(n, np.int64),
        rewards=np.ones(n, np.float32),
        terminals=np.array(terminated, np.float32),
        timeouts=np.array([tr and not te for te, tr in zip(terminated, truncated, strict=True)], np.float32),
        masks=np.ones((n, a), np.int8),
        episode_index=np.arange(n),
        final_observations=np.full((n, d), 99.0, np.float32),
        episodes=[],
    )


def test_d3rlpy_boundaries_terminal_timeout_and_final_observation() -> None:
    from policies.learning.dataset import EpisodeInfo

    ds = _ds([True, False], [True, True])  # episode 0: terminal AND timeout on one step; 1: timeout only
    ds.episodes = [EpisodeInfo(str(i), "c", "f", "train", str(i), False, 1.0, False, 1) for i in range(2)]
    boot = ds.mdp_arrays("bootstrap")
    # terminal wins over timeout; the timeout episode gets its final observation as an extra row
    assert boot["terminals"].tolist() == [1.0, 0.0, 0.0]
    assert boot["timeouts"].tolist() == [0.0, 0.0, 1.0]
    assert boot["observations"][2].tolist() == [99.0, 99.0, 99.0]
    mdp = ds.to_mdp("bootstrap")
    assert len(mdp.episodes) == 2
    assert mdp.episodes[0].terminated and not mdp.episodes[1].terminated
    assert mdp.transition_count == 2  # the final-observation row is never a transition itself
    from d3rlpy.dataset import BasicTransitionPicker

    tr = BasicTransitionPicker()(mdp.episodes[1], 0)
    assert tr.next_observation.tolist() == [99.0, 99.0, 99.0] and tr.terminal == 0.0
    # default: a spent turn budget is an end (no bootstrap from a state with no legal action)
    term = ds.mdp_arrays("terminal")
    assert term["terminals"].tolist() == [1.0, 1.0] and term["timeouts"].tolist() == [0.0, 0.0]


def test_save_load_round_trip(tmp_path: Path, episodes) -> None:  # type: ignore[no-untyped-def]
    ds = build_dataset(None, TEAM.env, ENC, episodes=episodes)
    back = ConductorDataset.load(ds.save(tmp_path / "d.npz"))
    np.testing.assert_array_equal(back.observations, ds.observations)
    assert back.episodes == ds.episodes and back.states == ds.states and back.weights == ds.weights
    assert back.action_requires == ds.action_requires and back.give_up == ds.give_up
    np.testing.assert_array_equal(back.legal_mask(back.observations), ds.masks)
    back.check_layout(TEAM.env, ENC)


def test_bad_input_names_the_cause(tmp_path: Path, episodes) -> None:  # type: ignore[no-untyped-def]
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(DatasetError, match="empty.jsonl: no valid episode"):
        build_dataset([empty], TEAM.env, ENC)
    damaged = tmp_path / "damaged.jsonl"
    damaged.write_text('{"schema_version": 1, "broken\n{nope}\n')
    with pytest.raises(DatasetError, match=r"damaged.jsonl: no valid episode.*damaged line"):
        build_dataset([damaged], TEAM.env, ENC)
    with pytest.raises(DatasetError, match="no such trajectory file"):
        build_dataset([tmp_path / "missing.jsonl"], TEAM.env, ENC)
    # episodes of another team (other workers, other action space)
    blocks = load_team("blocksworld")
    benc = ObservationEncoder(dataclasses.replace(blocks.env, embedder="hash"))
    with pytest.raises(LayoutError, match="recorded with team 'arithmetic'"):
        build_dataset(None, blocks.env, benc, episodes=episodes)
    # a dataset of one layout refuses a team of another
    ds = build_dataset(None, TEAM.env, ENC, episodes=episodes)
    with pytest.raises(LayoutError, match="action space differs"):
        ds.check_layout(blocks.env, benc)
    other = ObservationEncoder(dataclasses.replace(TEAM.env, recent_messages=2))
    with pytest.raises(LayoutError, match="observation layout differs"):
        ds.check_layout(TEAM.env, other)
    # an action id outside the team's action space (a hand-edited file)
    d = json.loads(json.dumps(episodes[0].to_dict()))
    d["steps"][0]["action"]["id"] = 42
    d["steps"][0]["action_mask"] = [0] * 42 + [1]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(d) + "\n")
    with pytest.raises(LayoutError, match=r"bad.jsonl: episode .* step 0: action_mask has 43 entries"):
        build_dataset([bad], TEAM.env, ENC)


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EROFS])
def test_a_failed_save_leaves_the_previous_dataset_whole(tmp_path: Path, episodes, code: int, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A disk that fills (or turns read-only) mid-save: one clear error naming the file, the old .npz unchanged, no
    partial file left beside it."""
    ds = build_dataset(None, TEAM.env, ENC, episodes=episodes)
    path = ds.save(tmp_path / "d.npz")
    before = path.read_bytes()

    def half_then_fail(f, **arrays):  # type: ignore[no-untyped-def]
        f.write(b"PK\x03\x04 half an archive")
        raise OSError(code, "injected")

    monkeypatch.setattr(np, "savez_compressed", half_then_fail)
    with pytest.raises(OSError) as err:
        ds.subset([0]).save(path)
    assert err.value.errno == code and err.value.filename == str(path) and "previous one is unchanged" in str(err.value)
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["d.npz"]
    assert len(ConductorDataset.load(path)) == len(ds)
    with pytest.raises(OSError, match="nothing was left behind"):
        ds.save(tmp_path / "new.npz")
    assert not (tmp_path / "new.npz").exists()
