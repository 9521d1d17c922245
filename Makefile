# orchestra — two commands: `make demo` and `make test` (each sets up .venv first if needed).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.orchestra-installed

.PHONY: install demo test test-fast lint bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# torch first and pinned: the CPU build is taken from local disk (an unpinned torch pulls CUDA).
# llama-cpp-python compiles from source the first time (~5-10 min on 2 cores); pip caches the wheel.
$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q torch==2.13.0
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
