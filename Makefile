# Two commands do all the set-up on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
HOST ?= 127.0.0.1
PORT ?= 5672
MANAGEMENT_PORT ?= 15672
PROMETHEUS_PORT ?= 15692
MQTT_PORT ?= 1883
DATA_DIR ?= ./data
LOG_LEVEL ?= info

.PHONY: all run test bench clean browser etcd cluster-demo spark bytecode

# `make test` runs its set-up two steps at a time: apt-get fetches Chromium and etcd beside pip's install and the
# modules' compilation (35 to 40 s of both cores), which share nothing with them. Two installs into .venv at once, or
# two apt-gets (each would refuse the other apt's lock), must not run together: under `make test` the compilation and
# the bytecode wait for the tests' install (which installs Warren too), and etcd's download for Chromium's install.
TESTING := $(filter test,$(MAKECMDGOALS))
ifneq ($(TESTING),)
MAKEFLAGS += -j2
endif
INSTALLED := $(VENV)/.installed-$(if $(TESTING),test,run)

# `make` alone installs Warren into .venv and compiles the modules again where one of their sources changed, as
# `make run` and `make test` do before they start (the first rule would otherwise be the default: .venv/bin/python).
.DEFAULT_GOAL := all
all: $(VENV)/.installed-run $(VENV)/.compiled

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# Installing is recorded in a stamp so repeated runs skip it until pyproject.toml changes. The editable install
# builds nothing (WARREN_COMPILE=0, with the venv's setuptools rather than a build environment of its own): the
# modules are compiled in place below, again only where their sources changed.
EDITABLE := $(BIN)/pip install --quiet setuptools wheel && WARREN_COMPILE=0 $(BIN)/pip install --quiet --no-build-isolation -e
$(VENV)/.installed-run: pyproject.toml setup.py | $(BIN)/python
	$(EDITABLE) .
	touch $@

$(VENV)/.installed-test: pyproject.toml setup.py | $(BIN)/python
	$(EDITABLE) '.[test,spark]'
	touch $@ $(VENV)/.installed-run

# The Spark connector's dependencies (pyspark, pyarrow, pika), for its examples (docs/spark.md), without the tests'.
spark: $(VENV)/.installed-run
	$(EDITABLE) '.[spark]'

# mypyc compiles the modules broker/compiled.py names, again whenever one of them changes; where it cannot (no C
# compiler or Python headers), Warren runs as pure Python. mypy 1.17 is the first that builds mypyc's runtime library
# inside the broker package, where the installed commands find it from any directory; mypyc builds with setuptools,
# which a virtual environment of Python 3.12 or later does not have of itself.
COMPILED_SOURCES := $(shell $(PYTHON) -c 'from broker.compiled import built_sources; print(*built_sources())') broker/compiled.py
$(VENV)/.compiled: $(COMPILED_SOURCES) | $(INSTALLED)
	$(BIN)/pip install --quiet 'mypy>=1.17' setuptools || echo "mypy not installed: Warren runs as pure Python"
	$(BIN)/python -m broker.compiled
	touch $@

# Python writes no bytecode of the sources where PYTHONDONTWRITEBYTECODE is set (as on this project's machines), and
# then every process compiles them again as it imports them: 0.2 s of CPU a start, of the 0.6 s a broker takes to
# import itself, and the suite starts about 1,400 Python processes, a thousand of them brokers and their workers.
# compileall writes the bytecode beside the sources (ignored by git), again only for a source newer than its own.
bytecode: | $(INSTALLED)
	@$(BIN)/python -m compileall -q -j 0 broker cluster protocol storage spark_connector warrenctl warrenperf examples tests >/dev/null

# pytest rewrites the assert statements of each test module as it imports it, and caches what it made only where
# Python may write bytecode: each pytest process of `make test` (three, then the alone tests' one) would rewrite every
# test module again, 8 s of CPU of the 10 a collection of the suite takes. A collection with bytecode allowed writes
# them beside the modules (ignored by git), again after a test module changed; after the compiled modules, which the
# collection imports.
$(VENV)/.test-bytecode: $(shell find tests -name '*.py') $(VENV)/.installed-test | $(VENV)/.compiled
	@env -u PYTHONDONTWRITEBYTECODE $(BIN)/python -m pytest --collect-only -q -p no:cacheprovider >/dev/null || true
	@touch $@

run: $(VENV)/.installed-run $(VENV)/.compiled
	@echo "warrenctl: $(BIN)/warrenctl$(if $(filter-out 15672,$(MANAGEMENT_PORT)), --port $(MANAGEMENT_PORT)) list_queues"
	$(BIN)/python -m broker --host $(HOST) --port $(PORT) --management-port $(MANAGEMENT_PORT) --prometheus-port $(PROMETHEUS_PORT) --mqtt-port $(MQTT_PORT) --data-dir $(DATA_DIR) --log-level $(LOG_LEVEL)

# The suite runs on TEST_PROCESSES processes at once (pytest-xdist; most tests wait on a broker far more than they
# compute), then the tests marked `alone` by themselves: they time the broker, or what runs at the same time, which
# other tests' load would blur. Exit status 5 is pytest's "no test selected", as when PYTEST_ARGS names tests of one part only.
TEST_PROCESSES ?= 3
test: $(VENV)/.installed-test browser etcd $(VENV)/.compiled bytecode $(VENV)/.test-bytecode
	$(BIN)/python -m pytest -n $(TEST_PROCESSES) --dist loadgroup -m "not alone" $(PYTEST_ARGS) || [ $$? = 5 ]
	$(BIN)/python -m pytest -m alone $(PYTEST_ARGS) || [ $$? = 5 ]

# The cluster tests (and the cluster demo) run one etcd: Debian's etcd-server package, downloaded and unpacked into
# .cache/etcd, not installed (no service, nothing outside the repo). An etcd named by WARREN_ETCD or found on PATH
# is used instead. Where apt-get cannot download it, the cluster tests are skipped, saying so.
ETCD := .cache/etcd/usr/bin/etcd
etcd: | $(if $(TESTING),browser)
	@[ -n "$$WARREN_ETCD" ] || command -v etcd >/dev/null || [ -x $(ETCD) ] || $(MAKE) --no-print-directory $(ETCD)

$(ETCD):
	@rm -rf .cache/etcd && mkdir -p .cache/etcd && cd .cache/etcd && \
	{ timeout 300 apt-get download -q etcd-server >/dev/null 2>&1 || \
	  { [ "$$(id -u)" = 0 ] && timeout 300 apt-get update -q >/dev/null 2>&1 && \
	    timeout 300 apt-get download -q etcd-server >/dev/null 2>&1; }; } && \
	dpkg -x etcd-server_*.deb . && rm etcd-server_*.deb && echo "etcd unpacked: $(ETCD)" || \
	echo "etcd not unpacked (apt-get download etcd-server failed): the cluster tests will be skipped"

# A three-node cluster on this machine (tests/cluster/demo.py): etcd on 127.0.0.1:2379 (peer port 2380), nodes a, b
# and c on AMQP ports 5672-5674, management 15672-15674 and replication 5680-5682, lease_ttl 5 s, their data dirs,
# configs and logs under ./demo-cluster (kept between runs). Ctrl-C stops all. Other ports or directory: DEMO_ARGS,
# e.g. DEMO_ARGS="--port 6672 --etcd-port 3379" (python -m tests.cluster.demo --help). It runs on the cluster tests'
# harness, which imports pytest: installed on its own here when the test dependencies are not.
cluster-demo: $(VENV)/.installed-run $(VENV)/.compiled etcd
	@$(BIN)/python -c 'import pytest' 2>/dev/null || $(BIN)/pip install --quiet 'pytest>=8'
	$(BIN)/python -m tests.cluster.demo $(DEMO_ARGS)

# The console tests drive Chromium: installed here where apt-get may be used (root, as in CI); elsewhere they are
# skipped, saying so. The one line to run by hand: apt-get install -y chromium chromium-driver
browser:
	@command -v chromedriver >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	  { DEBIAN_FRONTEND=noninteractive timeout 900 apt-get install -y -q chromium chromium-driver >/dev/null 2>&1 || \
	    { timeout 300 apt-get update -q >/dev/null 2>&1 && \
	      DEBIAN_FRONTEND=noninteractive timeout 900 apt-get install -y -q chromium chromium-driver >/dev/null 2>&1; }; } \
	  || echo "Chromium not installed: the console tests will be skipped"; }

bench: $(VENV)/.installed-test $(VENV)/.compiled
	$(BIN)/python -m tests.bench.compare $(BENCH_ARGS)

clean:
	$(PYTHON) -m broker.compiled --clean
	rm -rf $(VENV) build *.egg-info
