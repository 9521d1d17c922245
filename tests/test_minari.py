"""``orchestra dataset export --to minari``: a ConductorDataset written as a Minari dataset and read back with Minari
itself — episode boundaries, final observations, masks, terminations and truncations preserved."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from envs.observation import ObservationEncoder
from orchestra.cli import main
from policies.learning.dataset import ConductorDataset, DatasetError, EpisodeInfo, build_dataset
from policies.learning.minari_io import load_minari, minari_header, to_minari
from tests.scripted import arithmetic_team, array_dataset, record_scripted

TEAM = arithmetic_team()


def _compare(ds: ConductorDataset, m: object) -> None:
    eps = list(m.iterate_episodes())  # type: ignore[attr-defined]
    assert len(eps) == len(ds.episodes) and m.total_steps == len(ds)  # type: ignore[attr-defined]
    for e, ep in enumerate(eps):
        rows = np.flatnonzero(ds.episode_index == e)
        np.testing.assert_array_equal(ep.observations["observation"][:-1], ds.observations[rows])
        np.testing.assert_array_equal(ep.observations["observation"][-1], ds.final_observations[e])
        np.testing.assert_array_equal(ep.observations["action_mask"][:-1], ds.masks[rows])
        assert not ep.observations["action_mask"][-1].any()  # the episode is over: nothing is legal
        np.testing.assert_array_equal(ep.actions, ds.actions[rows])
        np.testing.assert_allclose(ep.rewards, ds.rewards[rows], rtol=0, atol=1e-7)
        np.testing.assert_array_equal(ep.terminations, ds.terminals[rows].astype(bool))
        np.testing.assert_array_equal(ep.truncations, ds.timeouts[rows].astype(bool))
        assert not ep.terminations[:-1].any() and not ep.truncations[:-1].any()  # ends on the last step only


def test_recorded_dataset_round_trips_through_minari(tmp_path: Path) -> None:
    episodes = record_scripted(TEAM, "heuristic", 6) + record_scripted(TEAM, "round_robin", 6)
    ds = build_dataset(None, TEAM.env, ObservationEncoder(TEAM.env), episodes=episodes)
    folder = to_minari(ds, "orchestra/arith-v0", tmp_path)
    assert folder == (tmp_path / "orchestra" / "arith-v0").resolve() and folder.is_dir()
    m = load_minari("orchestra/arith-v0", tmp_path)
    assert m.action_space.n == ds.num_actions
    assert m.observation_space["observation"].shape == (ds.observations.shape[1],)
    _compare(ds, m)
    header = minari_header(m)
    assert header["action_labels"] == ds.action_labels and header["feature_names"] == ds.feature_names
    assert [h["episode_id"] for h in header["episodes"]] == [i.episode_id for i in ds.episodes]
    with pytest.raises(DatasetError, match="already exists"):  # Minari never overwrites; we say so
        to_minari(ds, "orchestra/arith-v0", tmp_path)


def test_truncated_and_terminated_episodes_keep_their_ends(tmp_path: Path) -> None:
    n, d = 5, 3  # episodes: [0, 1] terminated, [2] truncated (turn budget), [3, 4] terminated
    index = np.array([0, 0, 1, 2, 2])
    ends = np.array([0, 1, 1, 0, 1], np.float32)
    ds = array_dataset(
        observations=np.arange(n * d, dtype=np.float32).reshape(n, d),
        actions=np.array([0, 1, 1, 0, 1], np.int64),
        rewards=np.array([-0.02, 1.0, 0.0, -0.02, 0.5], np.float32),
        terminals=ends * (index != 1),
        timeouts=ends * (index == 1),
        masks=np.array([[1, 0], [1, 1], [0, 1], [1, 0], [1, 1]], np.int8),
        episode_index=index,
        final_observations=np.full((3, d), 99.0, np.float32) + np.arange(3)[:, None],
        episodes=[EpisodeInfo(str(i), "c", "f", "train", str(i), i != 1, 1.0, i == 1, 2 - (i == 1)) for i in range(3)],
    )
    to_minari(ds, "t-v0", tmp_path)
    m = load_minari("t-v0", tmp_path)
    _compare(ds, m)
    eps = list(m.iterate_episodes())
    assert [e.truncations.tolist() for e in eps] == [[False, False], [True], [False, False]]


def test_cli_export_and_its_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    episodes = record_scripted(TEAM, "heuristic", 3)
    path = build_dataset(None, TEAM.env, ObservationEncoder(TEAM.env), episodes=episodes).save(tmp_path / "d.npz")
    assert main(["dataset", "export", str(path), "--to", "minari", "--root", str(tmp_path / "m")]) == 0
    out = capsys.readouterr().out
    assert f"orchestra/{TEAM.name}-v0" in out and "3 episodes" in out
    assert load_minari(f"orchestra/{TEAM.name}-v0", tmp_path / "m").total_episodes == 3
    # a bad id and a second export of the same id: one line each, nothing overwritten
    again = ["dataset", "export", str(path), "--to", "minari", "--root", str(tmp_path / "m")]
    assert main([*again, "--id", "bad id!"]) != 0
    assert main(again) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "expected (namespace/)" in err[0] and "already exists" in err[1]
