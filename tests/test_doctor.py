"""``orchestra doctor``: what it prints about this machine and this install (its speed is measured, never asserted)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

from orchestra.backends.llamacpp_build import Plan, cpu_info, expected_features, is_x86, rebuild_command
from orchestra.backends.llamacpp_probe import SIMULATE_ENV
from orchestra.jobs.doctor import DoctorConfig, collect, render

ROOT = Path(__file__).resolve().parents[1]


def doctor(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "orchestra", "doctor", *args]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def report() -> dict[str, Any]:
    return collect(DoctorConfig())


def test_doctor_names_the_cpu_and_what_llamacpp_was_built_with(report: dict[str, Any]) -> None:
    import llama_cpp

    model, flags = cpu_info()
    assert report["cpu"]["model"] == model and report["cpu"]["logical_cpus"] == os.cpu_count()
    ll = report["llama_cpp"]
    assert ll["system_info"] == llama_cpp.llama_print_system_info().decode().strip()
    assert ll["version"] == metadata.version("llama-cpp-python")
    assert not [f for f in ll["built_with"] if "AMX" in f]
    if is_x86():
        assert flags is not None and set(report["cpu"]["isa"]) <= flags and "avx" in report["cpu"]["isa"]
        assert expected_features(Plan().cmake_args) <= set(ll["built_with"])
        assert ll["verdict"].startswith("built as orchestra builds for this CPU")
    assert ll["orchestra_build"]["cmake_args"] == Plan().cmake_args and ll["rebuild"] == rebuild_command()


def test_doctor_reports_versions_models_backends_cuda_and_caches(report: dict[str, Any]) -> None:
    import torch

    for dist in ("torch", "transformers", "peft", "d3rlpy", "llama-cpp-python"):
        assert report["versions"][dist] == metadata.version(dist), dist
    assert (
        report["cuda"]["available"] == torch.cuda.is_available() and report["cuda"]["torch_cuda"] == torch.version.cuda
    )
    assert report["threads"]["torch_threads"] == torch.get_num_threads() and report["threads"]["llamacpp_threads"] >= 1
    assert "SmolLM2" in report["models"]["smollm2_gguf"] and "MiB" in report["models"]["smollm2_gguf"]
    assert not report["models"]["minilm_encoder"].startswith("missing")
    assert report["backends"]["llamacpp"] == report["backends"]["transformers"] == "available"
    assert report["caches"]["llama_wheels"].endswith("llama-cpp-python")


def test_doctor_says_when_the_library_holds_amx_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """A library built the native way on an AMX CPU: the verdict names the crash and the command that rebuilds."""
    import llama_cpp

    info = "CPU : SSE3 = 1 | AVX = 1 | AVX2 = 1 | AVX512 = 1 | AMX_INT8 = 1 | LLAMAFILE = 1 | "
    monkeypatch.setattr(llama_cpp, "llama_print_system_info", lambda: info.encode())
    ll = collect(DoctorConfig())["llama_cpp"]
    assert "AMX_INT8" in ll["built_with"]
    assert ll["verdict"].startswith("AMX kernels compiled in (AMX_INT8): a known crash")
    assert ll["verdict"].endswith(rebuild_command())


def test_the_report_renders_every_section(report: dict[str, Any]) -> None:
    text = render(report)
    for section in (
        "system:",
        "cpu:",
        "llama_cpp:",
        "threads:",
        "cuda:",
        "models:",
        "backends:",
        "versions:",
        "caches:",
    ):
        assert f"\n{section}" in f"\n{text}", section
    assert f"  llama-cpp-python: {metadata.version('llama-cpp-python')}" in text
    assert f"  model: {cpu_info()[0]}" in text
    assert "{" not in text.split("versions:")[1]  # nested values are lines, not dict reprs


@pytest.mark.slow
def test_the_command_prints_json_and_fails_on_a_crashing_probe() -> None:
    r = doctor("--json")
    assert r.returncode == 0, r.stderr
    parsed = json.loads(r.stdout)
    assert parsed["cpu"]["model"] == cpu_info()[0] and parsed["versions"]["torch"] == metadata.version("torch")
    r = doctor()
    assert r.returncode == 0 and "llama_cpp:" in r.stdout and "verdict:" in r.stdout
    # --probe runs the child now: where it dies, doctor says how in one line and exits 1
    r = doctor("--probe", env={**os.environ, SIMULATE_ENV: "segfault"})
    assert r.returncode == 1, r.stdout + r.stderr
    probe = next(ln for ln in r.stdout.splitlines() if ln.strip().startswith("probe:"))
    assert "crashed (SIGSEGV) in a test decode" in probe and probe.endswith(rebuild_command())
    r = doctor("--probe")
    assert r.returncode == 0 and "decoded SmolLM2" in r.stdout


def test_doctor_lists_the_model_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestra.jobs.doctor import _caches

    (tmp_path / "abc-v1").mkdir()
    (tmp_path / "abc-v1" / "model.safetensors").write_bytes(b"x" * 2**21)
    monkeypatch.setenv("ORCHESTRA_MODEL_CACHE", str(tmp_path))
    assert _caches()["models"] == f"{tmp_path} (1 dequantised model, 2 MiB)"
    monkeypatch.setenv("ORCHESTRA_MODEL_CACHE", "off")
    assert _caches()["models"] == "off ($ORCHESTRA_MODEL_CACHE)"
