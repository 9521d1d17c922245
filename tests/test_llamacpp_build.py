"""How llama.cpp is built (orchestra/backends/llamacpp_build.py) and the crash probe that runs before its first use
(orchestra/backends/llamacpp_probe.py): no AMX kernel in the library, options that follow the CPU, and a native crash
that becomes one line and one failed check instead of a dead process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from orchestra.backends import BackendError, llamacpp_probe
from orchestra.backends.llamacpp_build import (
    AMX_OPTIONS,
    X86_OPTIONS,
    Plan,
    build_key,
    cmake_args,
    cpu_info,
    expected_features,
    rebuild_command,
    system_features,
)
from orchestra.backends.llamacpp_probe import SIMULATE_ENV, ProbeResult, run_probe
from orchestra.backends.models import smollm2_gguf_path

ROOT = Path(__file__).resolve().parents[1]


def flag_list(line: str) -> list[str]:
    """A /proc/cpuinfo flag line as its flags."""
    return line.split()


# /proc/cpuinfo of an Intel Xeon Platinum 8480+ (Sapphire Rapids): AVX-512 with VNNI and BF16, AVX-VNNI, and AMX
XEON_AMX = flag_list(
    "fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr sse sse2 ss ht syscall nx "
    "pdpe1gb rdtscp lm constant_tsc rep_good nopl xtopology nonstop_tsc cpuid tsc_known_freq pni pclmulqdq ssse3 fma "
    "cx16 pcid sse4_1 sse4_2 x2apic movbe popcnt tsc_deadline_timer aes xsave avx f16c rdrand hypervisor lahf_lm abm "
    "3dnowprefetch ssbd ibrs ibpb stibp ibrs_enhanced fsgsbase tsc_adjust bmi1 hle avx2 smep bmi2 erms invpcid rtm "
    "avx512f avx512dq rdseed adx smap avx512ifma clflushopt clwb avx512cd sha_ni avx512bw avx512vl xsaveopt xsavec "
    "xgetbv1 xsaves avx_vnni avx512_bf16 wbnoinvd arat avx512vbmi umip pku ospke waitpkg avx512_vbmi2 gfni vaes "
    "vpclmulqdq avx512_vnni avx512_bitalg tme avx512_vpopcntdq la57 rdpid cldemote movdiri movdir64b fsrm md_clear "
    "serialize tsxldtrk amx_bf16 avx512_fp16 amx_tile amx_int8 flush_l1d arch_capabilities"
)
# AMD EPYC (Zen 3): AVX2, no AVX-512, no AMX
EPYC_ZEN3 = flag_list(
    "fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr sse sse2 ht syscall nx "
    "mmxext fxsr_opt pdpe1gb rdtscp lm constant_tsc rep_good nopl pni pclmulqdq ssse3 fma cx16 pcid sse4_1 sse4_2 "
    "x2apic movbe popcnt aes xsave avx f16c rdrand hypervisor lahf_lm abm sse4a bmi1 avx2 smep bmi2 erms invpcid "
    "rdseed adx smap clflushopt clwb sha_ni xsaveopt xsavec xgetbv1 xsaves vaes vpclmulqdq rdpid fsrm"
)


def _opts(args: list[str]) -> dict[str, str]:
    return dict(a[2:].split("=", 1) for a in args)


# ------------------------------------------------------------------------------------------------ the build
def test_an_amx_xeon_gets_avx512_and_vnni_but_never_amx() -> None:
    opts = _opts(cmake_args(XEON_AMX, "x86_64"))
    assert opts["GGML_NATIVE"] == "OFF"  # -march=native is what turns the AMX kernels on
    for on in ("GGML_AVX2", "GGML_FMA", "GGML_F16C", "GGML_AVX512", "GGML_AVX512_VNNI", "GGML_AVX512_BF16"):
        assert opts[on] == "ON", on
    assert opts["GGML_AVX_VNNI"] == opts["GGML_AVX512_VBMI"] == "ON"
    assert all(opts[o] == "OFF" for o in AMX_OPTIONS)
    assert expected_features(cmake_args(XEON_AMX, "x86_64")) >= {"AVX512", "AVX512_VNNI", "AVX512_BF16", "AVX2"}


def test_the_options_follow_the_cpu() -> None:
    zen3 = _opts(cmake_args(EPYC_ZEN3, "x86_64"))
    assert zen3["GGML_AVX2"] == zen3["GGML_FMA"] == zen3["GGML_BMI2"] == "ON"
    assert zen3["GGML_AVX512"] == zen3["GGML_AVX512_VNNI"] == zen3["GGML_AVX_VNNI"] == "OFF"
    # AVX-512 needs all five of its base extensions (ggml compiles it with -mavx512{f,cd,vl,dq,bw})
    assert _opts(cmake_args([*EPYC_ZEN3, "avx512f", "avx512cd"], "x86_64"))["GGML_AVX512"] == "OFF"
    # unreadable flags: ggml's own defaults for a non-native x86 build (AVX2 level), still no AMX
    unknown = _opts(cmake_args(None, "x86_64"))
    assert unknown["GGML_NATIVE"] == "OFF" and unknown["GGML_AVX2"] == "ON" and unknown["GGML_AVX512"] == "OFF"
    # other architectures have no AMX kernels: ggml's native build
    assert cmake_args(["fp", "asimd"], "aarch64") == ["-DGGML_NATIVE=ON"]
    # every x86 option is named, so nothing is left to a default that could change
    assert len(cmake_args(EPYC_ZEN3, "x86_64")) == 1 + len(X86_OPTIONS) + len(AMX_OPTIONS)


def test_the_build_key_holds_the_build_options() -> None:
    xeon, zen3 = cmake_args(XEON_AMX, "x86_64"), cmake_args(EPYC_ZEN3, "x86_64")
    assert build_key("0.3.36", xeon) == build_key("0.3.36", list(xeon))
    assert build_key("0.3.36", xeon) != build_key("0.3.36", zen3)
    assert build_key("0.3.36", zen3) != build_key("0.3.35", zen3)
    # the same instruction sets share a wheel whatever else the flag line says
    assert build_key("0.3.36", cmake_args([*EPYC_ZEN3, "sse4a", "clzero"], "x86_64")) == build_key("0.3.36", zen3)
    # a wheel of the old scheme (a folder named by cksum of the flag line: decimal) is never this key (hex, 16)
    key = Plan().key
    assert len(key) == 16 and not key.isdecimal()


def test_cpu_info_reads_the_model_and_flags(tmp_path: Path) -> None:
    path = tmp_path / "cpuinfo"
    path.write_text(
        "processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\nflags\t\t: fpu avx2 amx_int8\n\n"
        "processor\t: 1\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\nflags\t\t: fpu avx2 amx_int8\n"
    )
    assert cpu_info(path) == ("Intel(R) Xeon(R) Platinum 8480+", frozenset({"fpu", "avx2", "amx_int8"}))
    model, flags = cpu_info(tmp_path / "missing")
    assert flags is None and model


def test_system_features_parses_llamacpps_system_info() -> None:
    info = "CPU : SSE3 = 1 | AVX = 1 | AVX2 = 1 | AMX_INT8 = 1 | LLAMAFILE = 1 | OPENMP = 1 | REPACK = 1 | "
    assert system_features(info) == {
        "SSE3": "1",
        "AVX": "1",
        "AVX2": "1",
        "AMX_INT8": "1",
        **{"LLAMAFILE": "1", "OPENMP": "1", "REPACK": "1"},
    }


def test_the_built_library_reports_no_amx_kernel() -> None:
    """The installed llama.cpp was built as this module builds for this CPU: no AMX, every instruction set it named."""
    import llama_cpp

    info = llama_cpp.llama_print_system_info().decode()
    features = system_features(info)
    assert features, info
    assert not [k for k in features if "AMX" in k], info
    plan = Plan()
    if any(a == "-DGGML_NATIVE=OFF" for a in plan.cmake_args):  # x86: the instruction sets are exactly the planned ones
        isa = {f for _, _, f in X86_OPTIONS if f}
        assert isa & {k for k, v in features.items() if v == "1"} == expected_features(plan.cmake_args), info


# ------------------------------------------------------------------------------------------------ the probe
def test_llamacpp_runs_on_this_machine(llamacpp_probe_result: ProbeResult | None) -> None:
    """The probe the suite ran before any test: a child process decoded with this library on this CPU. Where this
    fails, every llama.cpp test fails with the same line, and nothing else crashes."""
    if llamacpp_probe_result is None:
        pytest.fail("the llama.cpp crash probe is switched off (ORCHESTRA_LLAMACPP_PROBE=off)")
    if not llamacpp_probe_result.ok:
        pytest.fail(llamacpp_probe_result.message(), pytrace=False)
    assert llamacpp_probe_result.system_info and "tokens" in llamacpp_probe_result.detail


@pytest.mark.parametrize(("how", "signal"), [("segfault", "SIGSEGV"), ("abort", "SIGABRT")])
def test_a_child_that_dies_gives_one_line(monkeypatch: pytest.MonkeyPatch, how: str, signal: str) -> None:
    """A real signal in a real child: the parent lives and says, in one line, what died where with which build."""
    monkeypatch.setenv(SIMULATE_ENV, how)
    result = run_probe(smollm2_gguf_path())
    assert not result.ok and result.signal == signal and result.returncode is not None and result.returncode < 0
    msg = result.message()
    assert "\n" not in msg
    assert f"crashed ({signal})" in msg and cpu_info()[0] in msg and "SmolLM2" in msg
    built = [k for k, v in system_features(result.system_info).items() if v == "1"]
    assert built and all(k in msg for k in built)  # the build's features, as the child reported them before dying
    assert msg.endswith(rebuild_command())


def test_a_child_that_fails_or_hangs_is_a_failure_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SIMULATE_ENV, "error")
    err = run_probe(smollm2_gguf_path())
    assert not err.ok and err.returncode == 1 and err.signal is None and "simulated probe error" in err.detail
    assert "failed (exit 1: RuntimeError: simulated probe error)" in err.message()
    monkeypatch.setenv(SIMULATE_ENV, "hang")
    hung = run_probe(smollm2_gguf_path(), timeout_s=5)
    assert not hung.ok and hung.returncode is None and "did not finish in 5 s" in hung.message()


def test_a_failed_probe_stops_the_backend_before_llamacpp_loads(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The backend's first load asks the probe; a failure is a BackendError, remembered in the process, never on
    disk; a success is remembered on disk and not probed again."""
    from orchestra.backends import llamacpp
    from orchestra.backends.llamacpp import LlamaCppBackend

    monkeypatch.setattr(llamacpp_probe, "cache_root", lambda: tmp_path)
    monkeypatch.setattr(llamacpp_probe, "_RESULTS", {})
    monkeypatch.setattr(llamacpp, "_SHARED", {})  # as in a fresh process: nothing loaded yet
    monkeypatch.setenv(SIMULATE_ENV, "segfault")
    with pytest.raises(BackendError, match=r"crashed \(SIGSEGV\) in a test decode .* rebuild it"):
        LlamaCppBackend("smollm2", n_ctx=256)
    assert not llamacpp._SHARED and not list(tmp_path.rglob("*.json"))
    calls: list[Any] = []
    monkeypatch.setattr(llamacpp_probe, "run_probe", lambda m: calls.append(m))  # a second probe would fail here
    with pytest.raises(BackendError, match="SIGSEGV"):  # the verdict is kept: no second child
        LlamaCppBackend("smollm2", n_ctx=256)
    assert calls == []

    monkeypatch.undo()
    monkeypatch.setattr(llamacpp_probe, "cache_root", lambda: tmp_path)
    monkeypatch.setattr(llamacpp_probe, "_RESULTS", {})
    monkeypatch.delenv(SIMULATE_ENV, raising=False)
    model = smollm2_gguf_path()
    first = llamacpp_probe.check(model)
    assert first is not None and first.ok
    assert llamacpp_probe.marker_path(llamacpp_probe.probe_key(model)).is_file()
    monkeypatch.setattr(llamacpp_probe, "_RESULTS", {})  # a new process
    monkeypatch.setattr(llamacpp_probe, "run_probe", lambda m: pytest.fail("probed again despite the marker"))
    again = llamacpp_probe.check(model)
    assert again is not None and again.ok and again.seconds == first.seconds


@pytest.mark.slow
def test_the_suite_survives_a_crashing_probe() -> None:
    """The whole mechanism in a real pytest run whose probe child segfaults: the probe check fails with the one line,
    the llama.cpp tests (the backend's and a llama_cpp.server's) fail at once with it, a test without llama.cpp
    passes, and pytest ends with its summary (exit 1), not a signal."""
    tests = [
        "tests/test_llamacpp_build.py::test_llamacpp_runs_on_this_machine",
        "tests/test_backends.py::test_llamacpp_greedy_deterministic_and_consistent",
        "tests/test_backends_http.py::test_real_server_chat_completion",
        "tests/test_llamacpp_build.py::test_the_options_follow_the_cpu",
    ]
    env = {**os.environ, SIMULATE_ENV: "segfault", "COLUMNS": "2000"}  # summary lines unabridged
    cmd = [sys.executable, "-m", "pytest", "-q", "-rfE", "-p", "no:cacheprovider", *tests]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    summary = out.strip().splitlines()[-1]
    assert "1 passed" in summary and ("3 failed" in summary or ("failed" in summary and "error" in summary)), out
    for test in tests[:3]:
        lines = [ln for ln in out.splitlines() if test.split("::")[1] in ln and ln.startswith(("FAILED", "ERROR"))]
        assert lines and "crashed (SIGSEGV) in a test decode" in lines[0], out
    assert "Fatal Python error" not in proc.stdout


@pytest.mark.slow
def test_a_command_stops_with_the_line_before_llamacpp_loads(tmp_path: Path) -> None:
    """`orchestra record` on a machine where the probe's child dies: exit 2 with one `error:` line, no traceback,
    nothing recorded, the process alive to say so."""
    out = tmp_path / "rec" / "x.jsonl"
    cmd = [sys.executable, "-m", "orchestra", "record", "--team", "arithmetic", "--conductor", "round_robin"]
    cmd += ["--episodes", "1", "--out", str(out), "--quiet", "--no-cache"]
    proc = subprocess.run(
        cmd, cwd=ROOT, env={**os.environ, SIMULATE_ENV: "segfault"}, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: llama.cpp crashed (SIGSEGV) in a test decode"), proc.stderr
    assert lines[0].endswith(rebuild_command()) and "Traceback" not in proc.stderr
    assert not out.exists()
