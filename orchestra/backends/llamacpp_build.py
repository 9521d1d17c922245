"""How llama-cpp-python is compiled for the machine it runs on: explicit instruction sets, never AMX.

llama-cpp-python compiles llama.cpp from source. Left to itself it builds with ``GGML_NATIVE=ON``
(``-march=native``), which on a CPU that reports AMX (Intel Xeon since Sapphire Rapids, most current cloud
instances) also compiles ggml's AMX matrix kernels and routes the weights through their buffer type. Those kernels
crash in ``ggml_backend_amx_mul_mat`` on some such machines (ggml-org/llama.cpp#20824, closed without a fix;
stanfordnlp/dspy#10079 dropped the AMX build for the same crash), killing the whole process at the first decode.

So orchestra builds with ``GGML_NATIVE=OFF`` and names every x86 instruction-set option itself, each switched on
exactly when the CPU reports the flags it needs (``/proc/cpuinfo``), and the three AMX options always off. On every
other feature the build matches what ``-march=native`` gives ggml's kernels (AVX2/FMA/F16C on AMD EPYC, AVX-512 with
VNNI and BF16 on a recent Xeon); ``benchmarks/record.py`` measured it against the native build
(docs/llamacpp-build.md). Rejected: ggml's runtime CPU-variant dispatch (``GGML_CPU_ALL_VARIANTS``) compiles about
ten copies of the CPU backend, too slow on two cores; llama-cpp-python's ``use_extra_bufts=False`` keeps weights out
of the AMX buffers at load time, but a library that still holds the kernels crashes the next program that loads it
differently (``llama_cpp.server``, a user's own script). On other architectures (aarch64) ggml's native build has no
such kernels and is kept.

The wheel is built once per build key (the llama-cpp-python version, the Python version, the architecture and the
CMake options: two CPUs with the same instruction sets share a wheel; a wheel built another way never matches) into
``~/.cache/orchestra/llama-cpp-python/<key>/``, with ``build.json`` beside it, and installed from there.

Standard library only: ``make`` runs this file before anything is installed (``python -P
orchestra/backends/llamacpp_build.py install --pip .venv/bin/pip``); ``orchestra doctor`` and the crash probe
(:mod:`orchestra.backends.llamacpp_probe`) import it. ``python -m orchestra.backends.llamacpp_build --help``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import re
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

PACKAGE = "llama-cpp-python"
BUILD_SCHEME = 2  # 1 was the -march=native build keyed by the CPU's flag line (before issue 31)

# (ggml CMake option, the /proc/cpuinfo flags it needs, the feature name llama.cpp's system info prints for it)
X86_OPTIONS: tuple[tuple[str, tuple[str, ...], str | None], ...] = (
    ("GGML_SSE42", ("sse4_2",), None),
    ("GGML_AVX", ("avx",), "AVX"),
    ("GGML_AVX2", ("avx2",), "AVX2"),
    ("GGML_FMA", ("fma",), "FMA"),
    ("GGML_F16C", ("f16c",), "F16C"),
    ("GGML_BMI2", ("bmi2",), "BMI2"),
    ("GGML_AVX_VNNI", ("avx_vnni",), "AVX_VNNI"),
    ("GGML_AVX512", ("avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw"), "AVX512"),
    ("GGML_AVX512_VBMI", ("avx512vbmi",), "AVX512_VBMI"),
    ("GGML_AVX512_VNNI", ("avx512_vnni",), "AVX512_VNNI"),
    ("GGML_AVX512_BF16", ("avx512_bf16",), "AVX512_BF16"),
)
# Never on, whatever the CPU reports: the kernels behind them are the crash this module exists to avoid.
AMX_OPTIONS = ("GGML_AMX_TILE", "GGML_AMX_INT8", "GGML_AMX_BF16")
# ggml's own defaults for a non-native x86 build, used where the CPU's flags cannot be read
X86_FALLBACK_FLAGS = frozenset({"sse4_2", "avx", "avx2", "fma", "f16c", "bmi2"})


def is_x86(machine: str | None = None) -> bool:
    return (machine or platform.machine()).lower() in {"x86_64", "amd64", "i686", "i386", "x86"}


def cpu_info(path: Path = Path("/proc/cpuinfo")) -> tuple[str, frozenset[str] | None]:
    """The CPU's model name and its instruction-set flags (None where the kernel does not list them)."""
    model: str | None = None
    flags: frozenset[str] | None = None
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        text = ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key in ("model name", "Model", "cpu model") and value.strip() and model is None:
            model = value.strip()
        elif key in ("flags", "Features") and flags is None:
            flags = frozenset(value.split())
    return model or platform.processor() or platform.machine(), flags


def cmake_args(flags: Iterable[str] | None, machine: str | None = None) -> list[str]:
    """The CMake options for a CPU with these flags: explicit instruction sets and no AMX on x86, native elsewhere."""
    if not is_x86(machine):
        return ["-DGGML_NATIVE=ON"]
    have = X86_FALLBACK_FLAGS if flags is None else frozenset(flags)
    args = ["-DGGML_NATIVE=OFF"]
    for option, needs, _ in X86_OPTIONS:
        args.append(f"-D{option}={'ON' if all(f in have for f in needs) else 'OFF'}")
    args += [f"-D{option}=OFF" for option in AMX_OPTIONS]
    return args


def expected_features(args: Sequence[str]) -> set[str]:
    """The features llama.cpp's system info should list for a library built with ``args`` (x86 only)."""
    on = {a[2:].split("=")[0] for a in args if a.endswith("=ON")}
    return {feature for option, _, feature in X86_OPTIONS if feature and option in on}


def system_features(info: str) -> dict[str, str]:
    """``llama_print_system_info()`` → {feature: value}, e.g. ``{"AVX2": "1", "AMX_INT8": "1", ...}``."""
    out = {}
    for part in info.split("|"):
        name, eq, value = part.rpartition("=")
        if eq:
            out[name.split(":")[-1].strip()] = value.strip()
    return out


def pinned_version(pyproject: Path | None = None) -> str:
    """The llama-cpp-python version: pyproject.toml's pin in a checkout, else the installed one."""
    pyproject = pyproject or Path(__file__).resolve().parents[2] / "pyproject.toml"
    if pyproject.is_file():
        import tomllib

        deps = tomllib.loads(pyproject.read_text(encoding="utf-8")).get("project", {}).get("dependencies", [])
        for dep in deps:
            m = re.fullmatch(rf"{PACKAGE}(\[[^]]*\])?==([0-9][0-9a-z.]*)", dep.replace(" ", ""))
            if m:
                return m.group(2)
    from importlib import metadata

    try:
        return metadata.version(PACKAGE)
    except metadata.PackageNotFoundError:
        raise SystemExit(f"error: no pinned {PACKAGE} in {pyproject} and none installed: pass --version") from None


def build_key(version: str, args: Sequence[str], machine: str | None = None) -> str:
    """The wheel's cache key: everything the compiled library depends on, the build options included."""
    payload = {
        "scheme": BUILD_SCHEME,
        "package": PACKAGE,
        "version": version,
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "machine": (machine or platform.machine()).lower(),
        "system": platform.system(),
        "cmake_args": list(args),
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def cache_root() -> Path:
    """Machine-level state of orchestra (compiled wheels, probe results): ~/.cache/orchestra. The response cache has
    its own setting (``$ORCHESTRA_CACHE_DIR``, same default folder)."""
    return Path.home() / ".cache" / "orchestra"


def wheel_dir(key: str) -> Path:
    return cache_root() / "llama-cpp-python" / key


def find_wheel(folder: Path, version: str) -> Path | None:
    found = sorted(folder.glob(f"llama_cpp_python-{version}-*.whl"))
    return found[-1] if found else None


def rebuild_command() -> str:
    """The command that rebuilds and reinstalls llama-cpp-python for this CPU into the running environment: ``make
    llama-rebuild`` where this is the checkout's own .venv, else this module run by this Python."""
    root = Path(__file__).resolve().parents[2]
    if (root / "Makefile").is_file() and Path(sys.prefix).resolve() == (root / ".venv").resolve():
        return f"make -C {root} llama-rebuild"
    return f"{sys.executable} -m orchestra.backends.llamacpp_build install --rebuild"


class Plan:
    """What to build for this machine: the options, the key, where the wheel goes."""

    def __init__(self, version: str | None = None, cpuinfo: Path = Path("/proc/cpuinfo")) -> None:
        self.version = version or pinned_version()
        self.cpu, self.flags = cpu_info(cpuinfo)
        self.cmake_args = cmake_args(self.flags)
        self.key = build_key(self.version, self.cmake_args)
        self.folder = wheel_dir(self.key)

    def describe(self) -> dict[str, object]:
        return {
            "package": PACKAGE,
            "version": self.version,
            "cpu": self.cpu,
            "machine": platform.machine(),
            "cmake_args": self.cmake_args,
            "key": self.key,
            "wheel_dir": str(self.folder),
            "wheel": str(find_wheel(self.folder, self.version) or ""),
        }


def build(plan: Plan, pip: Sequence[str], rebuild: bool = False) -> Path:
    """The wheel for ``plan``, compiled with its options unless one is cached (or ``rebuild``)."""
    wheel = find_wheel(plan.folder, plan.version)
    if wheel is not None and not rebuild:
        return wheel
    plan.folder.mkdir(parents=True, exist_ok=True)
    for old in plan.folder.glob("*.whl"):
        old.unlink()
    env = {**os.environ, "CMAKE_ARGS": " ".join(plan.cmake_args), "FORCE_CMAKE": "1"}
    print(
        f"compiling {PACKAGE} {plan.version} for {plan.cpu} ({' '.join(plan.cmake_args)}); "
        "about 5-10 minutes on 2 cores, once per build key",
        file=sys.stderr,
        flush=True,
    )
    t0 = time.monotonic()
    cmd = [*pip, "wheel", "-q", "--no-cache-dir", "--no-deps", "--no-binary", PACKAGE, "-w", str(plan.folder)]
    subprocess.run([*cmd, f"{PACKAGE}=={plan.version}"], env=env, check=True)
    wheel = find_wheel(plan.folder, plan.version)
    if wheel is None:
        raise SystemExit(f"error: pip wheel left no {PACKAGE} {plan.version} wheel in {plan.folder}")
    record = {**plan.describe(), "wheel": str(wheel), "built_s": round(time.monotonic() - t0, 1)}
    record["built_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    (plan.folder / "build.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return wheel


def install(plan: Plan, pip: Sequence[str], rebuild: bool = False) -> Path:
    wheel = build(plan, pip, rebuild)
    subprocess.run([*pip, "install", "-q", "--no-cache-dir", "--no-deps", "--force-reinstall", str(wheel)], check=True)
    return wheel


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m orchestra.backends.llamacpp_build",
        description=f"Build {PACKAGE} for this CPU (explicit instruction sets, no AMX) and install it.",
    )
    ap.add_argument("action", choices=["show", "key", "cmake-args", "build", "install"], help="what to do")
    ap.add_argument("--pip", default=None, help="the pip to build and install with (default: this Python's pip)")
    ap.add_argument("--version", default=None, help=f"the {PACKAGE} version (default: pyproject.toml's pin)")
    ap.add_argument("--rebuild", action="store_true", help="compile again even if a wheel for this key is cached")
    a = ap.parse_args(argv)
    plan = Plan(a.version)
    pip = [a.pip] if a.pip else [sys.executable, "-m", "pip"]
    if a.action == "show":
        print(json.dumps(plan.describe(), indent=2))
    elif a.action == "key":
        print(plan.key)
    elif a.action == "cmake-args":
        print(" ".join(plan.cmake_args))
    elif a.action == "build":
        print(build(plan, pip, a.rebuild))
    else:
        print(f"installed {install(plan, pip, a.rebuild)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
