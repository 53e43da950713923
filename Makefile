VENV ?= .venv
PY = $(VENV)/bin/python
PYTHON ?= $(shell command -v python3.11 2>/dev/null || command -v python3)
STAMP = $(VENV)/.installed
# Docker users point DYNAMODB_ENDPOINT at amazon/dynamodb-local and need no fetch.
EXTERNAL_DDB = $(DYNAMODB_ENDPOINT)$(AWS_ENDPOINT_URL_DYNAMODB)

# `make test` runs its steps in order and stops at the first failure, even under -j.
.NOTPARALLEL:
.PHONY: venv install dynamodb-local lint typecheck sam asl deploy-test unit integration live check test demo demo-under-load bench-writers bench-reconciler bench-live bench-audit invoke clean

export SAM_CLI_TELEMETRY = 0

venv: $(PY)

$(PY):
	$(PYTHON) -m venv $(VENV)

install: $(STAMP)

$(STAMP): pyproject.toml | $(PY)
	@echo "install: pip installs tally and its dev tools into $(VENV) (about 30 s the first time)"
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

dynamodb-local: $(STAMP)
	$(PY) -m tally.local.dynamodb_local fetch

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/ruff format --check src tests benchmarks

typecheck: $(STAMP)
	$(VENV)/bin/mypy

# The template must lint clean, also as deployed on an existing table, and build without a
# container (the code is pure Python).
EXISTING_TABLE = ExistingTableName=Social \
	ExistingTableStreamArn=arn:aws:dynamodb:us-east-1:123456789012:table/Social/stream/2024-06-01T00:00:00.000
sam: $(STAMP)
	$(VENV)/bin/sam validate --lint
	$(VENV)/bin/cfn-lint template.yaml --parameters $(EXISTING_TABLE)
	$(VENV)/bin/sam build --build-dir .aws-sam/build

# The audit state machine's definition: the project's own checks (reachability, transitions,
# substitutions, paths), then the npm registry's asl-validator, installed into .cache/npm.
ASL_VALIDATOR = .cache/npm/node_modules/.bin/asl-validator
$(ASL_VALIDATOR):
	npm install --prefix .cache/npm --no-save --no-package-lock --no-audit --no-fund asl-validator@4.0.0

asl: $(STAMP) $(ASL_VALIDATOR)
	TALLY_REQUIRE_ASL_VALIDATOR=1 $(PY) -m pytest tests/unit/template/test_state_machine.py -q

# template.yaml expanded as `sam deploy` expands it and created with moto's CloudFormation, on
# the example table and on an existing one; what moto can answer is read back and compared with
# the template and the pump (docs/operations.md). `make integration` runs it too.
deploy-test: $(STAMP)
	$(PY) -m pytest tests/integration/test_deploy.py -q

# Both run their tests in parallel processes (pytest-xdist). The unit tests compute: a worker
# a core, test by test (they share nothing between tests: about 20 s sooner than whole files).
# The integration tests go whole files to a worker (pyproject.toml). The integration tests mostly
# wait (graces, delays, stacks starting), so they take more workers than cores, each with a
# DynamoDB Local and a moto server of its own (tests/conftest.py). One DYNAMODB_ENDPOINT
# would be every worker's, and the local stack's tables have fixed names
# (tally-local-table), so with one the integration tests run in one process.
# `make integration INTEGRATION_WORKERS=0` runs them in one process anyway. The live tests
# (marked serial: writer threads, the pump and an injector racing, an index lag measured
# against a grace) are `make live`'s, alone, in one process; CI runs both (.ci/run).
UNIT_WORKERS ?= 2
INTEGRATION_WORKERS ?= $(if $(EXTERNAL_DDB),0,4)
unit: $(STAMP)
	$(PY) -m pytest tests/unit -q -n $(UNIT_WORKERS) --dist load

integration: $(STAMP) $(if $(EXTERNAL_DDB),,dynamodb-local)
	$(PY) -m pytest tests/integration -q -n $(INTEGRATION_WORKERS) -m "not serial"

# The live tests, alone (about a minute and a half): nothing else on the machine races them.
live: $(STAMP) $(if $(EXTERNAL_DDB),,dynamodb-local)
	$(PY) -m pytest tests/integration -q -m serial

# The edit-test loop: lint, types and the unit tests, about two minutes on two cores (the unit
# tests take about 230 s of CPU).
check: lint typecheck unit

test: lint typecheck sam asl unit integration

# The whole story on the local stack; fails if any injected fault goes uncaught.
demo: $(STAMP) $(if $(EXTERNAL_DDB),,dynamodb-local)
	$(PY) -m tally.cli demo

# `make demo` again and again beside busy CPUs: it must pass every run, however slow.
RUNS ?= 20
HOGS ?= 2
demo-under-load: $(STAMP) $(if $(EXTERNAL_DDB),,dynamodb-local)
	$(PY) benchmarks/demo_under_load.py --runs $(RUNS) --hogs $(HOGS)

bench-writers: $(STAMP)
	$(PY) benchmarks/bench_writers.py

bench-reconciler: $(STAMP)
	$(PY) benchmarks/bench_reconciler.py

# The live fault test's scenario, several runs per ParallelizationFactor: counts and latency.
bench-live: $(STAMP) $(if $(EXTERNAL_DDB),,dynamodb-local)
	$(PY) benchmarks/live_faults.py --runs 3 --factors 1,2,10

# Scan engine against export + DuckDB on 10^5 and 10^6 items; loading DynamoDB Local dominates.
bench-audit: $(STAMP)
	$(PY) benchmarks/bench_audit.py

# `make invoke FN=ReconcilerFunction EVENT=events/ReconcilerFunction/like_added.json`:
# sam local invoke with Docker (host network, so the container reaches the local stack),
# otherwise the same handler in process against the local stack. Either way it says which.
# DOCKER=false chooses the in-process way where Docker runs too.
TALLY_STATE_DIR ?= .tally
DOCKER ?= docker
invoke: $(STAMP)
	@if $(DOCKER) info >/dev/null 2>&1; then \
		echo "invoke: Docker runs: sam local invoke $(FN) on the host network," \
			"variables from $(TALLY_STATE_DIR)/sam-env.json (tally local env --sam)"; \
		$(PY) -m tally.cli local env --sam > $(TALLY_STATE_DIR)/sam-env.json && \
		$(VENV)/bin/sam local invoke $(FN) --event $(EVENT) --docker-network host \
			--env-vars $(TALLY_STATE_DIR)/sam-env.json && \
		echo "invoke: alerts the local subscriber holds (tally alerts):" && \
		$(PY) -m tally.cli alerts; \
	else \
		echo "invoke: no Docker: $(FN) in process against the local stack (tally invoke)"; \
		$(PY) -m tally.cli invoke $(FN) $(EVENT); \
	fi

clean:
	rm -rf .cache build dist src/*.egg-info .pytest_cache .mypy_cache .ruff_cache
	find src tests benchmarks -name __pycache__ -type d -prune -exec rm -rf {} +
