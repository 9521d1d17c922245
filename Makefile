# orchestra — two commands: `make demo` and `make test` (each sets up .venv first if needed).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.orchestra-installed

.PHONY: install llama-rebuild demo test test-fast lint bench clean doctor cli-docs

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# llama-cpp-python compiles llama.cpp from source. Left to itself it builds with -march=native, which on an Intel CPU
# that reports AMX compiles ggml's AMX kernels: they crash at the first decode on some such machines. We build it with
# the instruction sets named one by one from the CPU's flags and AMX always off, once per build key (version, Python,
# architecture, the CMake options) into ~/.cache/orchestra/llama-cpp-python/<key>/, and install it from there:
# orchestra/backends/llamacpp_build.py (stdlib only; -P keeps its folder off sys.path). Its version is pyproject.toml's pin.
LLAMA_BUILD := $(BIN)/python -P orchestra/backends/llamacpp_build.py

# torch first and pinned: the CPU build is taken from local disk (an unpinned torch pulls CUDA).
# llama-cpp-python compiles from source the first time on a build key (~5-10 min on 2 cores).
$(STAMP): pyproject.toml orchestra/backends/llamacpp_build.py | $(BIN)/python
	$(BIN)/pip install -q torch==2.13.0
	$(LLAMA_BUILD) install --pip $(BIN)/pip
	$(BIN)/pip install -q -e ".[dev]"
	touch $(STAMP)

# compile llama-cpp-python again for this CPU and reinstall it (what the crash probe's message tells you to run)
llama-rebuild: | $(BIN)/python
	$(LLAMA_BUILD) install --pip $(BIN)/pip --rebuild

install: $(STAMP)

demo: install
	$(BIN)/orchestra demo --out runs/demo

# docs/cli.md from the parser behind every --help (tests/test_api.py fails when it is stale)
cli-docs: install
	$(BIN)/python -m orchestra.cli.reference docs/cli.md

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

doctor: install
	$(BIN)/orchestra doctor

bench: install
	$(BIN)/python benchmarks/record.py
	$(BIN)/python benchmarks/rollout.py

clean:
	rm -rf runs .pytest_cache .mypy_cache .ruff_cache
