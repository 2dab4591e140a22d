# The two commands of the README: `make run` and `make test`. Both create .venv themselves.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PG_URL ?= postgresql+psycopg://postgres@127.0.0.1:5432/test

.PHONY: run test test-sqlite test-postgres test-plain-core lint bench install native

$(BIN)/gpusched: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev,bench]'
	@touch $@

install: $(BIN)/gpusched

# The scheduling core compiled with mypyc (app/compiled_core.py). A no-op while the build
# matches the source; without a C compiler the core simply runs as plain Python.
native: install
	$(BIN)/python -m app.compile_core

# API + scheduler + agents (simulated GPUs unless NVML works) + dashboard, on SQLite and a private Redis.
run: native
	$(BIN)/gpusched up

# Whole suite on SQLite, then on PostgreSQL (compiled core), the scheduling tests again on
# the plain-Python core, then lint and types.
test: native test-sqlite test-postgres test-plain-core lint

test-sqlite: native
	GPUSCHED_TEST_DB=sqlite $(BIN)/pytest -q

test-postgres: native
	GPUSCHED_TEST_DB=postgresql GPUSCHED_TEST_PG_URL=$(PG_URL) $(BIN)/pytest -q

test-plain-core: install
	GPUSCHED_NATIVE=0 $(BIN)/pytest -q tests/scheduling tests/simulator

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy app workers
	$(BIN)/check-jsonschema --builtin-schema vendor.compose-spec docker-compose.yml

bench: native
	$(BIN)/python bench/api_submit.py
