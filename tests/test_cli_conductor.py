"""CLI smoke runs of the phase-1 commands via subprocess: dataset, train, ope, distill, evaluate with a
learned checkpoint, finetune-conductor (real SmolLM2 workers, tiny budgets)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.scripted import arithmetic_team, record_scripted
from tests.test_rollout import short_team
from trajectories import read_trajectories

pytestmark = pytest.mark.slow


def orchestra(*args: str, env: dict[str, str] | None = None, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "orchestra", *args], capture_output=True, text=True, timeout=timeout, env=env
    )


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Scripted-worker episodes of the arithmetic team under two conductors."""
    d = tmp_path_factory.mktemp("rec")
    team = arithmetic_team()
    record_scripted(team, "heuristic", 12, path=d / "heuristic.jsonl")
    record_scripted(team, "round_robin", 12, path=d / "rr.jsonl")
    return d


def test_help_on_every_phase1_command() -> None:
    for cmd in (
        ["dataset"],
        ["dataset", "build"],
        ["dataset", "stats"],
        ["train"],
        ["ope"],
        ["finetune-conductor"],
        ["distill"],
        ["reproduce"],
        ["reproduce", "conductor"],
    ):
        r = orchestra(*cmd, "--help")
        assert r.returncode == 0 and "usage: orchestra" in r.stdout, (cmd, r.stderr)


def test_dataset_train_ope_distill_evaluate(tmp_path: Path, recorded: Path) -> None:
    env = {**os.environ, "ORCHESTRA_CACHE_DIR": str(tmp_path / "cache")}
    team = str(short_team(tmp_path))  # the built-in team with the hash embedder and short generations
    ds = tmp_path / "arith.npz"
    r = orchestra("dataset", "build", "--team", team, "--input", str(recorded), "--out", str(ds), env=env)
    assert r.returncode == 0, r.stderr
    assert "24 episodes" in r.stdout and "heuristic" in r.stdout and "round_robin" in r.stdout
    r = orchestra("dataset", "stats", str(ds), "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["episodes"] == 24

    ck = tmp_path / "bc"
    r = orchestra(
        "train", "--algo", "bc", "--dataset", str(ds), "--out", str(ck), "--steps", "300", "--team", team, "--quiet"
    )
    assert r.returncode == 0, r.stderr
    assert (ck / "conductor.json").exists() and (ck / "metrics.csv").exists() and (ck / "config.json").exists()

    r = orchestra(
        "ope",
        "--checkpoint",
        str(ck),
        "--dataset",
        str(ds),
        "--team",
        team,
        "--steps",
        "200",
        "--out",
        str(tmp_path / "ope.json"),
    )
    assert r.returncode == 0, r.stderr
    est = json.loads((tmp_path / "ope.json").read_text())
    assert est["episodes"] == 24 and -1.0 < est["fqe_estimate"] < 1.5

    # depth 5: the arithmetic heuristic allows two revisions, and counting FAILs takes one more split than depth 4
    r = orchestra(
        "distill",
        "--dataset",
        str(ds),
        "--team",
        team,
        "--conductor",
        "heuristic",
        "--max-depth",
        "5",
        "--out",
        str(tmp_path / "tree"),
    )
    assert r.returncode == 0, r.stderr
    fidelity = float(r.stdout.split("fidelity: ")[1].split()[0])
    assert fidelity >= 0.9 and (tmp_path / "tree" / "rules.txt").exists()
    assert "→ submit" in (tmp_path / "tree" / "rules.txt").read_text()
    r = orchestra(
        "distill", "--dataset", str(ds), "--team", team, "--checkpoint", str(ck), "--out", str(tmp_path / "tree2")
    )
    assert r.returncode == 0, r.stderr

    # the learned checkpoint runs in a real evaluation next to a rule-based conductor (SmolLM2 workers)
    out = tmp_path / "eval"
    r = orchestra(
        "evaluate",
        "--team",
        team,
        "--conductor",
        "pipeline",
        "--conductor",
        f"bc:{ck}",
        "--episodes",
        "2",
        "--out",
        str(out),
        "--quiet",
        env=env,
    )
    assert r.returncode == 0, r.stderr
    eps = read_trajectories(out / "episodes" / "arithmetic-bc.jsonl").episodes
    assert len(eps) == 2 and all(e.conductor.name == "bc" and e.conductor.checkpoint == str(ck) for e in eps)
    assert (out / "paired.csv").exists() and (out / "cost.png").exists()
    # the same checkpoint on a team whose encoder uses other embeddings is refused
    r = orchestra(
        "evaluate",
        "--team",
        "arithmetic",
        "--conductor",
        f"bc:{ck}",
        "--episodes",
        "1",
        "--out",
        str(tmp_path / "e2"),
        env=env,
    )
    assert r.returncode == 2 and "trained on 'hash' sentence embeddings" in r.stderr


def test_phase1_bad_input_is_a_clear_error(tmp_path: Path, recorded: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    r = orchestra("dataset", "build", "--team", "arithmetic", "--input", str(empty), "--out", str(tmp_path / "x.npz"))
    assert r.returncode == 2 and "empty.jsonl: no valid episode" in r.stderr and "Traceback" not in r.stderr
    r = orchestra("train", "--algo", "cql", "--dataset", str(tmp_path / "missing.npz"), "--out", str(tmp_path / "m"))
    assert r.returncode == 2 and "missing.npz: no such dataset file" in r.stderr
    ds = tmp_path / "arith.npz"
    assert (
        orchestra("dataset", "build", "--team", "arithmetic", "--input", str(recorded), "--out", str(ds)).returncode
        == 0
    )
    r = orchestra("train", "--algo", "cql", "--dataset", str(ds), "--out", str(tmp_path / "c"), "--team", "blocksworld")
    assert r.returncode == 2 and "action space differs" in r.stderr and "Traceback" not in r.stderr
    r = orchestra(
        "dataset", "build", "--team", "blocksworld", "--input", str(recorded), "--out", str(tmp_path / "b.npz")
    )
    assert r.returncode == 2 and "recorded with team 'arithmetic'" in r.stderr
    r = orchestra(
        "evaluate",
        "--team",
        "blocksworld",
        "--conductor",
        f"x:{tmp_path}",
        "--episodes",
        "1",
        "--out",
        str(tmp_path / "e"),
    )
    assert r.returncode == 2 and "not a conductor checkpoint" in r.stderr


def test_finetune_conductor_with_rails_on_real_workers(tmp_path: Path) -> None:
    env = {**os.environ, "ORCHESTRA_CACHE_DIR": str(tmp_path / "cache")}
    team = str(short_team(tmp_path))
    out = tmp_path / "ppo"
    r = orchestra(
        "finetune-conductor",
        "--team",
        team,
        "--out",
        str(out),
        "--timesteps",
        "32",
        "--n-steps",
        "16",
        "--warm-start",
        "pipeline",
        "--max-turns",
        "2",
        "--allow",
        "solver:solve",
        "--allow",
        "calculator:check",
        "--allow",
        "submit",
        "--quiet",
        env=env,
    )
    assert r.returncode == 0, r.stderr
    assert (out / "checkpoint" / "conductor.json").exists()
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert any(x.get("warm_start/agreement_after", 0) > x.get("warm_start/agreement_before", 1) for x in rows)
    assert any("rollout/episodes" in x for x in rows) and any(k.startswith("losses/") for x in rows for k in x)
