VENV ?= .venv
PY = $(VENV)/bin/python
PYTHON ?= $(shell command -v python3.11 2>/dev/null || command -v python3)
STAMP = $(VENV)/.installed
# Docker users point DYNAMODB_ENDPOINT at amazon/dynamodb-local and need no fetch.
EXTERNAL_DDB = $(DYNAMODB_ENDPOINT)$(AWS_ENDPOINT_URL_DYNAMODB)

# `make test` runs its steps in order and stops at the first failure, even under -j.
.NOTPARALLEL:
.PHONY: venv install dynamodb-local lint typecheck unit integration test bench-writers clean

venv: $(PY)

$(PY):
	$(PYTHON) -m venv $(VENV)

install: $(STAMP)

$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

dynamodb-local: $(STAMP)
	$(PY) -m tally.local.dynamodb_local fetch

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/ruff format --check src tests benchmarks

typecheck: $(STAMP)
	$(VENV)/bin/mypy

unit: $(STAMP)
	$(PY) -m pytest tests/unit -q

integration: $(STAMP) $(if $(EXTERNAL_DDB),,dynamodb-local)
	$(PY) -m pytest tests/integration -q

test: lint typecheck unit integration

bench-writers: $(STAMP)
	$(PY) benchmarks/bench_writers.py

clean:
	rm -rf build dist src/*.egg-info .pytest_cache .mypy_cache .ruff_cache
	find src tests benchmarks -name __pycache__ -type d -prune -exec rm -rf {} +
