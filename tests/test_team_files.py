"""Team files: the built-in ones load; bad ones fail with errors that name the file and the field."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from orchestra.runtime.conductors import CONDUCTOR_NAMES, conductor_factory, team_rules
from orchestra.runtime.team_file import TeamFileError, builtin_teams, load_team
from policies import PipelineConductor, PolicyError


@pytest.mark.parametrize("name", builtin_teams())
def test_builtin_team_loads_with_every_rule_based_conductor(name: str) -> None:
    team = load_team(name)
    assert team.name == name and team.env.worker_names
    assert any(w.kind == "tool" for w in team.env.workers), "each family's team has a tool worker"
    assert any(w.kind == "llm" for w in team.env.workers), "each family's team has an LLM role"
    for c in ("round_robin", "random", "pipeline", "heuristic"):
        policy = conductor_factory(c, team, seed=0)()
        assert policy.name == c


def _write(tmp_path: Path, mutate) -> Path:  # type: ignore[no-untyped-def]
    raw = yaml.safe_load(load_team("arithmetic").path.read_text())
    mutate(raw)
    p = tmp_path / "team.yaml"
    p.write_text(yaml.safe_dump(raw))
    return p


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (
            lambda r: r["workers"][0]["generation"].__setitem__("max_tokens", "many"),
            r"workers\[0\]\.generation\.max_tokens: expected int",
        ),
        (lambda r: r["workers"][0].__setitem__("backend", "gpt9"), r"workers\[0\]\.backend: unknown backend 'gpt9'"),
        (
            lambda r: r["workers"][1].__setitem__("instructions", ["fly"]),
            r"workers\[1\] \(calculator\)\.instructions: 'fly' is not declared",
        ),
        (lambda r: r["workers"][0].__setitem__("colour", "red"), r"workers\[0\]\.colour: unknown field"),
        (lambda r: r.__setitem__("reward_weights", {"speed": 1.0}), r"reward_weights\.speed: unknown reward component"),
        (lambda r: r.pop("family"), r"family: required field is missing"),
        (
            lambda r: r["workers"][0].__setitem__("sees", "everyone"),
            r"workers\[0\]\.sees: expected all, own, last, task",
        ),
        (lambda r: r["workers"][1].__setitem__("name", "solver"), r"duplicate worker names"),
        (
            lambda r: r["workers"][0].__setitem__("requires", {"revise": "luck"}),
            r"workers\[0\]\.requires\.revise: expected one of message, candidate",
        ),
        (
            lambda r: r["workers"][1].__setitem__("requires", {"solve": "message"}),
            r"workers\[1\] \(calculator\)\.requires: 'solve' is not one of its instructions",
        ),
        # checked at the door (issue 14): non-finite or negative weights, unknown tools and families, absurd budgets
        (
            lambda r: r.__setitem__("reward_weights", {"success": float("nan")}),
            r"reward_weights\.success: expected a finite",
        ),
        (lambda r: r.__setitem__("reward_weights", {"turn_cost": -0.5}), r"reward_weights\.turn_cost: must be >= 0"),
        (
            lambda r: r["workers"][1].__setitem__("tool", "abacus"),
            r"workers\[1\]\.tool: family 'arithmetic' has no tool 'abacus'",
        ),
        (lambda r: r.__setitem__("family", "astrology"), r"family: unknown task family 'astrology'"),
        (
            lambda r: r["workers"][0]["generation"].__setitem__("max_tokens", 100000000),
            r"workers\[0\]\.generation\.max_tokens: must be between 1 and the model's context \(8192 tokens\)",
        ),
        (
            lambda r: r["workers"][0]["generation"].__setitem__("temperature", float("inf")),
            r"workers\[0\]\.generation\.temperature: expected a finite number",
        ),
        (
            lambda r: r["workers"][0]["generation"].__setitem__("top_p", 1.5),
            r"workers\[0\]\.generation\.top_p: must be in",
        ),
        # prices and demonstrations (priced teams)
        (
            lambda r: r["workers"][0].__setitem__("price", {"per_call": -1}),
            r"workers\[0\] \(solver\)\.price\.per_call: must be >= 0",
        ),
        (
            lambda r: r["workers"][0].__setitem__("price", {"per_hour": 1}),
            r"workers\[0\]\.price\.per_hour: unknown field",
        ),
        (
            lambda r: r["workers"][0].__setitem__("examples", [{"task": "q"}]),
            r"workers\[0\]\.examples\[0\]\.reply: required field is missing",
        ),
        (
            lambda r: r["workers"][1].__setitem__("examples", [{"task": "q", "reply": "a"}]),
            r"workers\[1\] \(calculator\)\.examples: only an llm worker reads demonstrations",
        ),
    ],
)
def test_bad_team_file_names_the_field(tmp_path: Path, mutate, message: str) -> None:  # type: ignore[no-untyped-def]
    p = _write(tmp_path, mutate)
    with pytest.raises(TeamFileError, match=message) as e:
        load_team(p)
    assert str(p) in str(e.value)


def test_yaml_syntax_error_names_the_line(tmp_path: Path) -> None:
    p = tmp_path / "broken.yaml"
    p.write_text("name: x\nworkers: [\n  - oops: : :\n")
    with pytest.raises(TeamFileError, match=r"broken\.yaml: line \d+: not valid YAML"):
        load_team(p)


def test_unknown_team_lists_the_builtin_ones() -> None:
    with pytest.raises(TeamFileError, match="built-in: arithmetic"):
        load_team("no_such_team")


def test_pipeline_with_unknown_worker_is_rejected_at_build_time(tmp_path: Path) -> None:
    p = _write(tmp_path, lambda r: r["conductors"].__setitem__("pipeline", {"steps": ["wizard:solve"]}))
    with pytest.raises(ValueError, match="unknown worker 'wizard'"):
        conductor_factory("pipeline", load_team(p))
    with pytest.raises(ValueError, match="unknown conductor"):
        conductor_factory("oracle", load_team("arithmetic"))
    assert "llm" in CONDUCTOR_NAMES


@pytest.mark.parametrize("name", ["arithmetic", "logic_grid", "code_synthesis", "blocksworld"])
def test_each_builtin_team_has_a_menu_of_at_least_six_named_rules(name: str) -> None:
    team = load_team(name)
    menu = team_rules(team)
    assert len(menu) >= 6 and {"tool_only", "single_shot", "pipeline", "heuristic", "resample"} <= set(menu)
    assert "random" not in menu and "llm" not in menu
    for rule in menu:
        conductor_factory(rule, team)()  # each builds (its steps name real workers and instructions)


def test_a_named_rule_needs_a_rule_type(tmp_path: Path) -> None:
    p = _write(
        tmp_path, lambda r: r["conductors"].__setitem__("twice", {"type": "pipeline", "steps": ["solver:solve"] * 2})
    )
    team = load_team(p)
    assert "twice" in team_rules(team)
    assert isinstance(conductor_factory("twice", team)(), PipelineConductor)
    bad = _write(tmp_path, lambda r: r["conductors"].__setitem__("twice", {"type": "oracle", "steps": []}))
    with pytest.raises(PolicyError, match=r"conductors.twice.type: give one of round_robin, pipeline, heuristic"):
        conductor_factory("twice", load_team(bad))
    with pytest.raises(PolicyError, match="rules of team.yaml: .*twice"):
        conductor_factory("thrice", load_team(bad))


def test_price_and_demonstrations_reach_the_worker_spec(tmp_path: Path) -> None:
    def mutate(r):  # type: ignore[no-untyped-def]
        r["workers"][0]["price"] = {"per_call": 0.1, "per_token": 0.001}
        r["workers"][0]["examples"] = [{"task": "What is 2 + 2?", "reply": "print(2 + 2)"}]

    solver = load_team(_write(tmp_path, mutate)).env.workers[0]
    assert (solver.price_per_call, solver.price_per_token) == (0.1, 0.001)
    assert solver.examples == (("What is 2 + 2?", "print(2 + 2)"),) and solver.price(10) == pytest.approx(0.11)


def test_the_http_example_is_the_priced_team_plus_its_analyst() -> None:
    """docs/examples/arithmetic_priced_http.yaml copies the built-in priced team (YAML has no include): a guard
    against the copy drifting from the team whose calibration docs/results/priced-team.md reports."""
    base = load_team("arithmetic_priced")
    http = load_team(str(Path(__file__).parent.parent / "docs/examples/arithmetic_priced_http.yaml"))
    assert set(http.env.worker_names) - set(base.env.worker_names) == {"analyst"}
    shared = {w.name: w for w in http.env.workers if w.name != "analyst"}
    assert shared == {w.name: w for w in base.env.workers}
    assert {k: http.workers[k] for k in shared} == base.workers
    assert http.env.instructions == base.env.instructions and http.env.reward_weights == base.env.reward_weights
    assert {k: v for k, v in http.conductors.items() if k != "analyst"} == base.conductors
