"""The player of episodes: ``record`` plays through whatever :class:`~orchestra.runtime.player.EpisodePlayer` it is
given, and its result carries every episode of the file, so ``evaluate`` need not read the file back."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

import orchestra.runtime.session as session_mod
from orchestra.jobs.record import RecordConfig, record
from orchestra.runtime.player import EnginePlan, EpisodePlayer, LocalPlayer, Played
from orchestra.runtime.players import Players
from orchestra.runtime.rollout import EpisodeJob
from orchestra.runtime.session import RunOptions, Session
from tests.scripted import scripted_workers
from trajectories import Episode, TrajectoryWriter, read_trajectories

RUN = RunOptions(use_cache=False, progress=False)


@pytest.fixture(autouse=True)
def _scripted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(session_mod, "build_workers", lambda team, tools, **kw: scripted_workers(team))


class Counting:
    """A player that hands every call to another and counts what it was asked to play."""

    def __init__(self, inner: EpisodePlayer) -> None:
        self.inner, self.asked = inner, []

    def play(
        self,
        plan: EnginePlan,
        jobs: Sequence[EpisodeJob],
        writer: TrajectoryWriter,
        on_episode: Callable[[Episode], None],
        planned: int,
    ) -> Played:
        self.asked.append((plan.name, len(jobs), planned))
        return self.inner.play(plan, jobs, writer, on_episode, planned)


def test_record_plays_through_the_player_it_is_given(tmp_path: Path) -> None:
    cfg = RecordConfig("arithmetic", "round_robin,heuristic", 3, run=RUN)
    session = Session.of(cfg.team, None, RUN)
    player = Counting(LocalPlayer(session, RUN))
    res = record(cfg, tmp_path / "a.jsonl", session=session, player=player)
    assert player.asked == [("round_robin", 3, 3), ("heuristic", 3, 3)]
    assert len(res.episodes) == 6 and res.metrics["rollout/episodes"] == 6


def test_a_resumed_recording_returns_every_episode_of_its_file(tmp_path: Path) -> None:
    out = tmp_path / "a.jsonl"
    record(RecordConfig("arithmetic", "round_robin", 2, run=RUN), out)
    res = record(RecordConfig("arithmetic", "round_robin", 4, run=RUN), out, resume=True)
    on_disk = read_trajectories(out, strict=True).episodes
    assert res.skipped + len(res.episodes) == 4 and len(res.recorded) == len(on_disk) >= 4
    assert [e.to_dict() for e in res.recorded] == [e.to_dict() for e in on_disk]  # what reading it back would give


def test_players_pick_this_process_unless_ray_is_asked_for() -> None:
    with Players(RUN) as players, players.open("arithmetic", None, Session.of("arithmetic", None, RUN)) as p:
        assert isinstance(p, LocalPlayer)
    with pytest.raises(ValueError, match="--ray-actors"):
        Players(RunOptions(ray=True, ray_actors=0))
