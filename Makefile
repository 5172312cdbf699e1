# Two commands do all the set-up on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
HOST ?= 127.0.0.1
PORT ?= 5672
MANAGEMENT_PORT ?= 15672
PROMETHEUS_PORT ?= 15692
DATA_DIR ?= ./data
LOG_LEVEL ?= info

.PHONY: run test bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# Installing is recorded in a stamp so repeated runs skip it until pyproject.toml changes.
$(VENV)/.installed-run: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e .
	touch $@

$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[test,spark]'
	touch $@ $(VENV)/.installed-run

run: $(VENV)/.installed-run
	$(BIN)/python -m broker --host $(HOST) --port $(PORT) --management-port $(MANAGEMENT_PORT) --prometheus-port $(PROMETHEUS_PORT) --data-dir $(DATA_DIR) --log-level $(LOG_LEVEL)

test: $(VENV)/.installed-test
	$(BIN)/python -m pytest $(PYTEST_ARGS)

bench: $(VENV)/.installed-test
	$(BIN)/python -m tests.bench.compare $(BENCH_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info
