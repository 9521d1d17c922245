"""The command line derived from config dataclasses (orchestra/cli/options.py): types, docs and defaults come from
the dataclass; only the flags given override a preset or a config file; and every command's --help shows the
defaults of its config (compared here against the configs themselves, not against the CLI code)."""

from __future__ import annotations

import argparse
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any, Literal

import pytest

from orchestra.cli import build_parser
from orchestra.cli.options import (
    ConfigError,
    Opt,
    Unset,
    add_options,
    build,
    config_actions,
    field_docs,
    flatten,
    format_default,
    given,
    value_at,
)


@dataclass(frozen=True)
class Inner:
    rate: float = 0.5  # how fast
    mode: Literal["a", "b"] = "a"  # which way


@dataclass(frozen=True)
class Outer:
    name: str  # required: no default
    # a knob documented by the comment block above it,
    # on two lines
    count: int = 3
    sizes: tuple[int, ...] = (1, 2)  # widths
    on: bool = True  # the switch
    maybe: str | None = None  # unset by default
    inner: Inner = field(default_factory=Inner)  # nested
    seed: int = 0  # a seed
    inner_seed: int = 0  # another seed


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    add_options(
        p,
        Outer,
        [
            "name",
            "count",
            "sizes",
            Opt("on", "--off"),
            "maybe",
            Opt("inner.rate", "--rate"),
            Opt("inner.mode", "--mode"),
            Opt("seed", also=("inner_seed",)),
        ],
    )
    return p


def test_docs_come_from_the_field_comments() -> None:
    docs = field_docs(Outer)
    assert docs["count"] == "a knob documented by the comment block above it, on two lines"
    assert docs["sizes"] == "widths" and docs["name"] == "required: no default" and docs["inner"] == "nested"
    assert field_docs(Inner)["mode"] == "which way"


def test_types_choices_defaults_and_help_come_from_the_dataclass() -> None:
    p = _parser()
    acts = {a.dest: a for a, _ in config_actions(p)}
    assert acts["config:name"].required and acts["config:name"].default is None
    assert acts["config:sizes"].nargs == "+" and acts["config:sizes"].type is int
    assert acts["config:inner.mode"].choices == ["a", "b"]
    assert acts["config:on"].const is False  # a True default: the flag turns it off
    assert "(default: 1 2)" in acts["config:sizes"].help and "(default: on=True)" in acts["config:on"].help
    assert "(default: none)" in acts["config:maybe"].help and "(default: 0.5)" in acts["config:inner.rate"].help
    ns = p.parse_args(["--name", "x"])
    assert isinstance(ns.__dict__["config:count"], Unset) and given(ns) == {"name": "x"}


def test_only_the_flags_given_override_the_preset_and_the_layers() -> None:
    p = _parser()
    ns = p.parse_args(["--name", "x", "--rate", "0.25", "--sizes", "4", "5", "--off", "--seed", "7"])
    preset = Outer(name="p", count=9)
    cfg = build(preset, ns, {"count": 11, "inner.mode": "b"})
    assert cfg == Outer(
        name="x", count=11, sizes=(4, 5), on=False, inner=Inner(rate=0.25, mode="b"), seed=7, inner_seed=7
    )
    assert build(Outer, p.parse_args(["--name", "y"])) == Outer(name="y")  # a class: constructed from the flags
    with pytest.raises(ConfigError, match="inner.nope: unknown field of Inner"):
        build(preset, ns, {"inner.nope": 1})
    assert flatten({"a": {"b": 1, "c": {"d": [1]}}, "e": 2}) == {"a.b": 1, "a.c.d": [1], "e": 2}


def test_a_config_check_is_one_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    from orchestra.cli import main

    assert main(["experiment", "chain", "--seeds", "0", "--out", "/nonexistent/x"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "seeds ≥ 1" in err and "Traceback" not in err


# ----------------------------------------------------------------------------------------------------------------
# every command


def _roots() -> dict[tuple[str, ...], Any]:
    """Each command's root config, imported from the jobs (the source of truth the help must show)."""
    from orchestra.jobs.align import AlignChainConfig, AlignLLMConfig
    from orchestra.jobs.conductor import DatasetBuildConfig, DistillJob, OPEConfig, TrainConfig
    from orchestra.jobs.conductor_ppo import ConductorPPOConfig
    from orchestra.jobs.demo import DemoConfig
    from orchestra.jobs.doctor import DoctorConfig
    from orchestra.jobs.evaluate import EvaluateConfig
    from orchestra.jobs.experiment import (
        ChainExperimentJob,
        ChainPageJob,
        ChainRegimeJob,
        FreshnessJob,
        LLMExperimentJob,
        LLMFreshnessJob,
        LLMTuneJob,
    )
    from orchestra.jobs.finetune import FinetuneConfig
    from orchestra.jobs.inspect import ExportConfig
    from orchestra.jobs.phase1 import ReproduceConfig
    from orchestra.jobs.record import RecordConfig
    from orchestra.report.html import HTMLReportConfig

    return {
        ("record",): RecordConfig,
        ("report",): HTMLReportConfig,
        ("evaluate",): EvaluateConfig,
        ("trajectories", "export"): ExportConfig,
        ("demo",): DemoConfig(),
        ("experiment", "chain"): ChainExperimentJob(),
        ("experiment", "chain-regime"): ChainRegimeJob(),
        ("experiment", "chain-page"): ChainPageJob(),
        ("experiment", "llm"): LLMExperimentJob(),
        ("experiment", "llm-tune"): LLMTuneJob(),
        ("experiment", "freshness"): FreshnessJob(),
        ("experiment", "freshness-llm"): LLMFreshnessJob(),
        ("dataset", "build"): DatasetBuildConfig,
        ("train",): TrainConfig,
        ("ope",): OPEConfig,
        ("finetune-conductor",): ConductorPPOConfig,
        ("distill",): DistillJob,
        ("reproduce", "conductor"): ReproduceConfig(),
        ("finetune",): FinetuneConfig(),
        ("align", "chain"): AlignChainConfig(),
        ("align", "llm"): AlignLLMConfig(),
        ("doctor",): DoctorConfig(),
    }


def _leaves(p: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> dict[tuple[str, ...], argparse.ArgumentParser]:
    subs = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        return {path: p}
    out: dict[tuple[str, ...], argparse.ArgumentParser] = {}
    for name, sp in subs[0].choices.items():
        out.update(_leaves(sp, (*path, name)))
    return out


def test_the_same_commands_as_before() -> None:
    ap, handlers = build_parser()
    assert list(handlers) == [
        "record",
        "evaluate",
        "trajectories",
        "cache",
        "report",
        "teams",
        "families",
        "demo",
        "experiment",
        "dataset",
        "train",
        "ope",
        "finetune-conductor",
        "distill",
        "reproduce",
        "finetune",
        "align",
        "doctor",
    ]
    assert set(_leaves(ap)) >= set(_roots())


def test_every_default_in_help_is_its_config_default() -> None:
    ap, _ = build_parser()
    roots = _roots()
    checked = 0
    for path, parser in _leaves(ap).items():
        backed = config_actions(parser)
        assert bool(backed) == (path in roots), f"orchestra {' '.join(path)}: options not derived from its config"
        for action, paths in backed:
            want = value_at(roots[path], paths[0])
            for other in paths[1:]:
                assert value_at(roots[path], other) == want, (path, other)
            if action.required or action.option_strings == []:
                continue
            name = paths[0].rsplit(".", 1)[-1]
            shown = f"{name}={want}" if isinstance(want, bool) else format_default(want)
            assert f"(default: {shown})" in action.help.replace("%%", "%"), (path, action.option_strings)
            if action.default is not None:  # append options start empty; the help still shows the default
                assert isinstance(action.default, Unset) and action.default.value == want, (path, paths)
            checked += 1
        for action in parser._actions:  # nothing else may carry a default of its own
            if action.dest.startswith("config:") or isinstance(action, argparse._HelpAction):
                continue
            assert action.default in (None, False), (path, action.option_strings, action.default)
    assert checked > 120


def test_help_renders_the_dataclass_defaults() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "orchestra", "finetune", "--help"], capture_output=True, text=True, check=True
    ).stdout
    from orchestra.teamtr.config import LLM_CPU_TRAINER

    flat = " ".join(out.split())
    assert f"(default: {LLM_CPU_TRAINER.delta})" in flat and f"(default: {LLM_CPU_TRAINER.num_stages})" in flat
    assert "learning rate of each agent's optimizer" in flat  # the doc comment of TeamTRConfig.lr


def test_finetune_precedence_defaults_then_config_file_then_flags(tmp_path: Any) -> None:
    """The documented GPU configuration resolves to valid configs, and a flag given wins over the file."""
    from orchestra.cli.teamtr import finetune_config
    from orchestra.jobs.finetune import GPU_CONFIG, FinetuneConfig

    ap, _ = build_parser(only="finetune")
    cfg = finetune_config(ap.parse_args(["finetune", "--out", "x", "--config", str(GPU_CONFIG), "--stages", "3"]))
    assert cfg.trainer.num_stages == 3  # the flag
    assert cfg.trainer.batch_size == 64 and cfg.team.dtype == "bfloat16" and cfg.team.workers == ("solver", "critic")
    assert cfg.team.pipeline == ("solver:solve", "critic:check", "solver:revise")  # YAML lists become tuples
    assert cfg.trainer.kl_penalty_coef == FinetuneConfig().trainer.kl_penalty_coef  # untouched: the CPU default
    bad = tmp_path / "bad.yaml"
    bad.write_text("trainer: {batch_size: 6}\nteam: {group_size: 4}\n")
    with pytest.raises(ConfigError, match="batch_size 6 must be a multiple of team.group_size 4"):
        finetune_config(ap.parse_args(["finetune", "--out", "x", "--config", str(bad)]))
