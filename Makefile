# Quick start:  make demo  (main job)   |   make test  (test suite)
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
export SPOTWISE_PLATFORM ?= none

.PHONY: setup demo test lint bench clean

$(BIN)/spotwise: pyproject.toml requirements-dev.txt
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -r requirements-dev.txt
	touch $@

setup: $(BIN)/spotwise

demo: setup
	$(BIN)/spotwise launch examples/digits/job.yaml

# two workers on a 2-core machine: most tests wait on real processes, so this pays; four were
# faster still (33 min) but starved the e2e tests whose notice windows are a few seconds long.
# Idle workers take queued tests from busy ones (no long tail); the slowest tests are listed.
PYTEST_WORKERS ?= 2
test: setup
	$(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) --dist worksteal --durations=25

lint: setup
	$(BIN)/ruff check src tests benchmarks examples scripts
	$(BIN)/ruff format --check src tests benchmarks examples scripts
	$(BIN)/mypy

bench: setup
	$(BIN)/python benchmarks/bench_checkpoint.py --size-gb 1

clean:
	rm -rf $(VENV) build *.egg-info
