# The two commands of the README: `make run` and `make test`. Both create .venv themselves.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PG_URL ?= postgresql+psycopg://postgres@127.0.0.1:5432/test

.PHONY: run test test-sqlite test-postgres lint bench install

$(BIN)/gpusched: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev,bench]'
	@touch $@

install: $(BIN)/gpusched

# API + scheduler + agents (simulated GPUs unless NVML works) + dashboard, on SQLite and a private Redis.
run: install
	$(BIN)/gpusched up

# Whole suite on SQLite, then on PostgreSQL, then lint and types.
test: install test-sqlite test-postgres lint

test-sqlite: install
	GPUSCHED_TEST_DB=sqlite $(BIN)/pytest -q

test-postgres: install
	GPUSCHED_TEST_DB=postgresql GPUSCHED_TEST_PG_URL=$(PG_URL) $(BIN)/pytest -q

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy app workers
	$(BIN)/check-jsonschema --builtin-schema vendor.compose-spec docker-compose.yml

bench: install
	$(BIN)/python bench/api_submit.py
