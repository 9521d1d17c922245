"""The Python API (``import orchestra``): its names, one code path with the CLI, the README's example run for real, and
``docs/cli.md`` kept in step with the parser behind ``--help``."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import orchestra
from orchestra.cli import main
from orchestra.cli.reference import cli_reference

ROOT = Path(__file__).resolve().parents[1]


def readme_example() -> str:
    """The Python block of README.md between the ``python-example`` markers."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = re.search(r"<!-- python-example:start -->\s*```python\n(.*?)```\s*<!-- python-example:end -->", text, re.S)
    assert block, "README.md: no ```python block between <!-- python-example:start --> and <!-- python-example:end -->"
    return block.group(1)


def test_every_public_name_resolves_to_its_home_and_is_documented() -> None:
    api_doc = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    assert len(orchestra.__all__) >= 15
    for name in orchestra.__all__:
        value = getattr(orchestra, name)
        assert value.__module__.split(".")[0] in ("orchestra", "policies"), name
        assert f"`{name}`" in api_doc, f"docs/api.md does not describe orchestra.{name}"
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = orchestra.nope  # type: ignore[attr-defined]


def test_import_orchestra_loads_no_model_stack() -> None:
    code = "import sys, orchestra; print(sorted(m for m in ('torch', 'transformers', 'd3rlpy') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


class Called(Exception):
    """Raised by a stand-in job: the CLI reached it with this config."""


@pytest.mark.parametrize(
    ("module", "function", "argv"),
    [
        (
            "orchestra.jobs.record",
            "record",
            [
                "record",
                "--team",
                "arithmetic",
                "--conductor",
                "round_robin",
                "--episodes",
                "3",
                "--seed",
                "4",
                "--out",
                "x.jsonl",
            ],
        ),
        (
            "orchestra.jobs.conductor",
            "build_dataset",
            ["dataset", "build", "--team", "arithmetic", "--input", "a.jsonl", "--out", "d.npz"],
        ),
        ("orchestra.jobs.conductor", "train_conductor", ["train", "--dataset", "d.npz", "--out", "bc", "--algo", "bc"]),
        (
            "orchestra.jobs.evaluate",
            "evaluate",
            ["evaluate", "--team", "arithmetic", "--conductor", "round_robin", "--out", "ev"],
        ),
        ("orchestra.jobs.finetune", "finetune", ["finetune", "--out", "ft", "--stages", "1"]),
    ],
)
def test_the_cli_calls_the_api_function(
    module: str, function: str, argv: list[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """One code path: ``orchestra COMMAND`` hands its resolved config to the very function ``orchestra.NAME`` is."""
    import importlib

    home = importlib.import_module(module)
    assert getattr(orchestra, function) is getattr(home, function)
    seen: list[Any] = []

    def stand_in(cfg: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(cfg)
        raise Called

    monkeypatch.setattr(home, function, stand_in)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(Called):
        main(argv)
    config_type = {
        "record": orchestra.RecordConfig,
        "build_dataset": orchestra.DatasetBuildConfig,
        "train_conductor": orchestra.TrainConfig,
        "evaluate": orchestra.EvaluateConfig,
        "finetune": orchestra.FinetuneConfig,
    }[function]
    assert isinstance(seen[0], config_type)
    if function == "record":
        assert (seen[0].episodes, seen[0].run.seed) == (3, 4)
    if function == "finetune":
        assert seen[0].trainer.num_stages == 1


@pytest.fixture(scope="module")
def reference() -> str:
    """The reference as the parser renders it now (built once: every command's options import its job)."""
    return cli_reference()


def test_cli_reference_is_current(reference: str) -> None:
    current = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    assert current == reference, "docs/cli.md is stale: run `make cli-docs`"


def test_cli_reference_names_every_command_and_no_machine_path(reference: str) -> None:
    from orchestra.cli import commands

    text = reference
    for name in commands():
        assert f"## `orchestra {name}`" in text, name
    assert "## `orchestra dataset build`" in text  # sub-commands too
    for machine_path in {str(ROOT), str(Path.home()), os.environ.get("ORCHESTRA_CACHE_DIR") or str(ROOT)}:
        assert machine_path not in text, f"a help text embeds {machine_path}"


@pytest.mark.slow
def test_readme_example_runs(tmp_path: Path) -> None:
    """The README's example, as a user pastes it: a recording, a dataset, a BC conductor, an evaluation against a
    rule-based one (real SmolLM2 workers), then a TeamTR stage on the tiny model."""
    code = readme_example()
    assert 20 <= len(code.strip().splitlines()) <= 40
    env = {**os.environ, "ORCHESTRA_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert any(re.match(r"round_robin\s+success \d\.\d\d \[\d\.\d\d, \d\.\d\d\]", line) for line in lines), proc.stdout
    assert any(re.match(r"bc\s+success \d\.\d\d", line) for line in lines), proc.stdout
    assert "→ adapters ['solver']" in proc.stdout
    runs = tmp_path / "runs" / "py"
    assert (runs / "eval" / "results.csv").is_file()
    assert (runs / "finetune" / "adapters" / "solver" / "adapter_config.json").is_file()
    assert (runs / "bc" / "config.json").is_file()
