# stocksentry — the two commands are `make demo` and `make test`; see README.md.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check -q
DEMO_ARGS ?=
SCALE ?=
SCALE_ARGS ?=

.PHONY: demo demo-tools test lint format bench services tools helm-tools install dev clean generate fuzz

# The venv, created once; Debian ships venv separately, so install it when it is missing.
# Set-up output goes to stderr: `make demo DEMO_ARGS="--format json"` prints only JSON.
$(PY):
	@$(PYTHON) -m venv $(VENV) 2>/dev/null || { \
	  echo "make: python3-venv missing, installing it" >&2; \
	  apt-get update -qq >&2 && apt-get install -y -qq python3-venv >/dev/null && \
	  $(PYTHON) -m venv $(VENV); }
	@$(PIP) install --upgrade pip setuptools >&2

# Stamps: reinstall when pyproject.toml changes. `make demo` needs only the lab's extra.
$(VENV)/.stamp-install: pyproject.toml | $(PY)
	@echo "make: installing stocksentry[lab] into $(VENV)" >&2
	@$(PIP) install -e '.[lab]' >&2
	@touch $@

$(VENV)/.stamp-dev: pyproject.toml | $(PY)
	$(PIP) install -e '.[dev]'
	@touch $@ $(VENV)/.stamp-install

install: $(VENV)/.stamp-install
dev: $(VENV)/.stamp-dev

## demo: set up and run the flash-sale lab on an embedded PostgreSQL and Redis, with the
## exporter and a Prometheus evaluating the alert rules beside it (Prometheus is installed
## from Debian's package when missing, its daemon kept from starting; without it the demo
## runs and says the alerts were not evaluated). DEMO_ARGS passes options: --help lists them.
demo: install demo-tools
	@$(VENV)/bin/stocksentry demo $(DEMO_ARGS)

demo-tools:
	@command -v prometheus >/dev/null 2>&1 || bash .ci/tools.sh prometheus >&2 || \
	  echo "make: prometheus could not be installed; the demo runs without alerts" >&2
	@case "$(DEMO_ARGS)" in *--contain*) command -v amtool >/dev/null 2>&1 || \
	  bash .ci/tools.sh >&2 || echo "make: alertmanager could not be installed;" \
	  "the containment run is skipped" >&2;; esac

services:
	@bash .ci/services.sh

tools:
	@bash .ci/tools.sh

# Helm has no Debian package: the chart is linted and rendered through helm-python-sdk.
helm-tools: dev
	@bash helm/install-helm.sh

## test: install, start PostgreSQL, Redis and MariaDB when down, install promtool/amtool
## and the Helm SDK, run pytest (tests/unit needs none of them; tests/integration does).
## The test files are spread over TEST_WORKERS processes, whole files to one worker
## (pytest-xdist --dist loadfile: a module's fixtures are set up once); most of the suite
## waits on servers and subprocesses, so 4 workers on 2 cores; TEST_WORKERS=0 runs serially.
TEST_WORKERS ?= 4
test: dev services tools helm-tools
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile

## fuzz: the fuzz suite (tests/fuzz: config and web-config loaders, timeline's parsers, the
## SQL classifier, the SKU guard, the multiprocess reader, the middlewares' headers) with
## HYPOTHESIS_PROFILE=long: fifty times the examples `make test` runs, fresh randomness,
## minutes of fuzzing; failures found are kept in .hypothesis/ and replayed first next time.
## No service needed. `make test` runs the same suite on its fixed, derandomized budget.
fuzz: dev
	HYPOTHESIS_PROFILE=long $(PY) -m pytest -q tests/fuzz

## lint: ruff (lint and format check) and mypy --strict
lint: dev
	@mkdir -p .typecheck/stocksentry
	@ln -sfn ../../instrumentation .typecheck/stocksentry/instrumentation
	@ln -sfn ../../exporter .typecheck/stocksentry/exporter
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy -p stocksentry.instrumentation -p stocksentry.exporter
	$(VENV)/bin/mypy benchmarks dashboards

format: dev
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

## bench: the overhead per reservation (in memory, with its ratio on real PostgreSQL), the
## scrape path, the multiprocess merge against prometheus_client's, the probes, the
## timeline and the Redis lock watcher; medians over repeats (load-independent instruction
## counts: benchmarks/callgrind_reservation.py). `make bench SCALE=1` adds the probes on a
## generated shop of 1M products and 5M orders (a few minutes; SCALE_ARGS="--products 200000
## --orders 1000000 --keep" to change it, "--database mysql" for MariaDB).
bench: dev services
	$(PY) benchmarks/bench_floor.py
	$(PY) benchmarks/bench_floor_sqlalchemy.py
	$(PY) benchmarks/bench_freeze.py
	$(PY) benchmarks/bench_reservation.py
	$(PY) benchmarks/bench_exporter.py
	$(PY) benchmarks/bench_multiproc.py
	$(PY) benchmarks/bench_probes.py
	$(PY) benchmarks/bench_timeline.py
	$(PY) benchmarks/bench_lockwatch.py
	@if [ -n "$(SCALE)" ]; then $(PY) benchmarks/bench_scale.py $(SCALE_ARGS); fi

clean:
	rm -rf $(VENV) .typecheck build dist *.egg-info .mypy_cache .ruff_cache .pytest_cache

## generate: rebuild generated artefacts (docs/metrics.md, the rendered alert rules,
## dashboards/*.json, the chart's copies)
generate: dev
	$(PY) docs/generate.py
	$(PY) alert_rules/render.py
	$(PY) dashboards/build.py
	$(PY) helm/sync.py
