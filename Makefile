# Every target sets up what it needs first: `make up` and `make test` work on a fresh clone.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup up down test check unit integration e2e faults clean

$(STAMP): pyproject.toml requirements.lock
	bash scripts/setup.sh $(PYTHON) $(VENV)
	@touch $(STAMP)

setup: $(STAMP)

up: $(STAMP)  ## seed the demo models and start every service in the foreground (Ctrl-C stops all)
	$(BIN)/exa up

down: $(STAMP)
	$(BIN)/exa down

check: $(STAMP)  ## lint, types and the import contracts
	$(BIN)/ruff check examlops tests bench
	$(BIN)/ruff format --check examlops tests bench
	$(BIN)/mypy
	$(BIN)/lint-imports

test: check  ## the whole suite: checks, then unit, integration and e2e tests, a test file per worker on two
	$(BIN)/pytest -n 2 --dist loadfile

unit: $(STAMP)
	$(BIN)/pytest tests/unit

integration: $(STAMP)
	$(BIN)/pytest tests/integration

e2e: $(STAMP)
	$(BIN)/pytest tests/e2e

FAULTS_REPORT ?= .examlops/faults-report.jsonl

faults: $(STAMP)  ## the fault suite's long runs (tens of minutes); each scenario's figures go to $(FAULTS_REPORT)
	@mkdir -p $(dir $(FAULTS_REPORT))
	EXAMLOPS_FAULTS=long EXAMLOPS_FAULTS_REPORT=$(abspath $(FAULTS_REPORT)) $(BIN)/pytest tests/faults -m faults -s -rxX

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
