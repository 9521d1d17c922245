# orchestra — two commands: `make demo` and `make test` (each sets up .venv first if needed).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.orchestra-installed

.PHONY: install demo test test-fast lint bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# llama-cpp-python compiles llama.cpp for the CPU it is built on (-march=native: AVX-512, VNNI where present).
# pip's wheel cache does not know that, so a machine moved to another host, or a cache shared across hosts, can
# reuse a wheel built for another CPU, which crashes in the first llama_decode. We build the wheel once per CPU
# (the key is the kernel's flag line) into a folder of our own and install it from there. Its version comes
# from pyproject.toml, where it is pinned.
LLAMA_VERSION := $(shell grep -o 'llama-cpp-python[^"]*==[0-9.]*' pyproject.toml | sed 's/.*==//')
CPU_KEY := $(shell (uname -m; grep -m1 -E '^(flags|Features)' /proc/cpuinfo 2>/dev/null) | cksum | cut -d' ' -f1)
LLAMA_WHEELS := $(HOME)/.cache/orchestra/llama-cpp-python/$(CPU_KEY)
LLAMA_WHEEL = $(LLAMA_WHEELS)/llama_cpp_python-$(LLAMA_VERSION)-*.whl

# torch first and pinned: the CPU build is taken from local disk (an unpinned torch pulls CUDA).
# llama-cpp-python compiles from source the first time on a CPU (~5-10 min on 2 cores).
$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q torch==2.13.0
	ls $(LLAMA_WHEEL) > /dev/null 2>&1 || $(BIN)/pip wheel -q --no-cache-dir --no-deps -w $(LLAMA_WHEELS) \
		llama-cpp-python==$(LLAMA_VERSION)
	$(BIN)/pip install -q --no-cache-dir --no-deps $(LLAMA_WHEEL)
	$(BIN)/pip install -q -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

demo: install
	$(BIN)/orchestra demo --out runs/demo

# the import contracts (pyproject.toml [tool.importlinter]) first: a layering breach fails in a second
test: install
	$(BIN)/lint-imports --no-cache
	$(BIN)/python -m pytest -q -ra

test-fast: install
	$(BIN)/python -m pytest -q -m "not slow"

lint: install
	$(BIN)/ruff check orchestra envs policies trajectories tests benchmarks
	$(BIN)/ruff format --check orchestra envs policies trajectories tests benchmarks
	$(BIN)/mypy
	$(BIN)/lint-imports --no-cache

bench: install
	$(BIN)/python benchmarks/record.py
	$(BIN)/python benchmarks/rollout.py

clean:
	rm -rf runs .pytest_cache .mypy_cache .ruff_cache
