# tfpipe: two commands do all set-up on a fresh machine.
#   make demo   build what is missing, then run the example DAG tfpipe_digits through Airflow
#   make test   build what is missing, then run the whole test suite
#   make check  the quick tier after every change: ruff plus the unit, contract and provider tests
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := $(CURDIR)/.venv
PY := $(VENV)/bin/python
CACHE := $(CURDIR)/.cache

export AIRFLOW_HOME ?= $(CURDIR)/.airflow
export AIRFLOW__CORE__DAGS_FOLDER := $(CURDIR)/dags
export AIRFLOW__CORE__LOAD_EXAMPLES := False
export AIRFLOW__CORE__UNIT_TEST_MODE := False
export TFPIPE_HOME ?= $(CURDIR)/.demo
export PATH := $(VENV)/bin:$(PATH)

DAG ?= tfpipe_digits
CONF ?= {}
PYTEST_ARGS ?=
BENCH_ARGS ?=
# The image reference is content-derived; read it after `image` ran.
IMAGE_REF = $$(cat $(CACHE)/trainer-image)
# DAGs that name no image read the Airflow Variable tfpipe_image when a task runs (tfpipe/settings.py):
# point this project's Airflow at the image just built (only when it changed: the CLI takes seconds).
SET_IMAGE_VARIABLE = ref=$(IMAGE_REF); if [ "$$(cat $(AIRFLOW_HOME)/.tfpipe_image 2>/dev/null)" != "$$ref" ]; then \
	airflow variables set tfpipe_image "$$ref" >/dev/null && echo "$$ref" >$(AIRFLOW_HOME)/.tfpipe_image \
	&& echo "[image] Airflow Variable tfpipe_image = $$ref"; fi

.PHONY: help demo run test check test-host test-trainer lint image image-variable docker venv airflow-db data bench clean

help:
	@echo "make demo                        run the example pipeline tfpipe_digits end to end"
	@echo "make run DAG=<id> CONF='<json>'   run one DAG run of any DAG in dags/"
	@echo "make test                        run every test (lint, host, Airflow, containers, in-image)"
	@echo "make check                       the quick tier: ruff, unit, contract and provider tests (no image, about 3 min)"
	@echo "make lint                        ruff check (part of make test)"
	@echo "make docs                        build the documentation site (mkdocs --strict) into .cache/site"
	@echo "make reference                   write the generated reference pages again (after a config change)"
	@echo "make test-compat AIRFLOW_VERSION=X.Y.Z  the provider's tests on another Airflow 3 release"
	@echo "make image                       build (or reuse) the GPU-ready trainer image (TFPIPE_IMAGE_VARIANT=cpu: no CUDA)"
	@echo "make bench                       side-by-side speed ratios (not a test)"
	@echo "make tensorboard RUN=<id>|latest  serve a run's TensorBoard on localhost:PORT (default 6006)"
	@echo "make shell TASK=<task> RUN=<id>   a shell in a container set up as that task's (ARGS=--print ...)"
	@echo "make up / status / down           a real deployment here: scheduler, Celery, PostgreSQL, Redis, TLS engine"

docker:
	@scripts/ensure-docker.sh

venv: $(VENV)/.installed
$(VENV)/.installed: requirements/host.lock pyproject.toml
	@echo "[venv] creating $(VENV) with pinned dependencies (about a minute)"
	@$(PYTHON) -c 'import sys; sys.exit("Python >= 3.10 is required, found " + sys.version.split()[0]) if sys.version_info < (3, 10) else None'
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -m pip install -q --disable-pip-version-check -r requirements/host.lock 2> >(grep -v "^WARNING: Location" >&2)
	@$(PY) -m pip install -q --disable-pip-version-check --no-deps -e . 2> >(grep -v "^WARNING: Location" >&2)
	@# The build leaves the distribution's metadata in provider/, which is on sys.path: a second copy
	@# there makes Airflow load the plugin's entry point twice and record a plugin import error.
	@rm -rf provider/*.egg-info
	@touch $@

image: docker
	@docker/build-image.sh >/dev/null
	@if [ -f $(AIRFLOW_HOME)/.migrated ]; then $(SET_IMAGE_VARIABLE); fi

image-variable: venv image airflow-db
	@$(SET_IMAGE_VARIABLE)

airflow-db: $(AIRFLOW_HOME)/.migrated
$(AIRFLOW_HOME)/.migrated: $(VENV)/.installed
	@echo "[airflow] migrating the metadata DB in $(AIRFLOW_HOME)"
	@mkdir -p $(AIRFLOW_HOME)
	@airflow db migrate >$(AIRFLOW_HOME)/migrate.log 2>&1 || (tail -30 $(AIRFLOW_HOME)/migrate.log; exit 1)
	@touch $@

data: $(TFPIPE_HOME)/data/digits/digits.csv
$(TFPIPE_HOME)/data/digits/digits.csv: $(VENV)/.installed scripts/make_digits.py
	@$(PY) scripts/make_digits.py $(TFPIPE_HOME)/data/digits

# The venv (mostly downloads) and the image (mostly a CPU-bound docker build) do not depend on each
# other, so demo and test build both at once: on a fresh machine that takes the clone-to-model time
# under 6 minutes.
demo:
	@$(MAKE) --no-print-directory -j2 venv image
	@$(MAKE) --no-print-directory run DAG=tfpipe_digits

run: venv image airflow-db image-variable data
	@echo '[run] $(DAG) with conf $(CONF) on image '"$(IMAGE_REF)"
	@$(PY) -m tfpipe.cli run $(DAG) --conf '$(CONF)' \
	  || (echo "[run] $(DAG) did not succeed: its error is above; Airflow's log is in the file named there" >&2; exit 1)

# The in-image trainer suite keeps about one core busy; the oldest release's suite (its venv is mostly
# downloads, its integration tests mostly wait on containers) and the host suite's tools (Chromium, the
# outside TensorFlow client, the MLflow server) share the phase with it. Both of the last two need the
# stack's Debian packages (stack-tools), which one make installs once, before either.
test:
	@$(MAKE) --no-print-directory -j2 venv image
	@$(MAKE) --no-print-directory airflow-db data lint docs
	@$(MAKE) --no-print-directory -j3 test-trainer test-compat-oldest host-tools
	@$(MAKE) --no-print-directory test-host

# The quick tier a developer runs after every change: it needs only the venv (no image, no Docker
# engine, no Chromium), and runs the tests that are not marked integration on two workers.
check: venv airflow-db
	@echo "[check] ruff, then the contract, provider and bench tests"
	@$(VENV)/bin/ruff check --quiet .
	@$(PY) -m pytest -q -n 2 -m "not integration" tests/contract tests/provider $(wildcard tests/bench) $(PYTEST_ARGS)

.PHONY: docs reference
# The reference pages (configuration, run parameters, exit codes) are generated from the config
# models and the contract: `make reference` writes them again after a change there.
reference: venv
	@$(PY) scripts/gen_reference.py

# The documentation site (mkdocs.yml, docs/): --strict fails on a broken link, a page left out of the
# nav or a missing snippet. The site goes to .cache/site (mkdocs.yml's site_dir).
docs: venv
	@$(PY) scripts/gen_reference.py --check
	@echo "[docs] mkdocs build --strict"
	@NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict 2> >(grep -v '^INFO' >&2)

# ruff (pinned in requirements/host.lock; rules in pyproject.toml): pyflakes/pycodestyle, Airflow's AIR rules,
# and no module-level TensorFlow, google.cloud or kubernetes imports on the Airflow side.
lint: venv
	@echo "[lint] ruff check"
	@$(VENV)/bin/ruff check --quiet .

test-trainer: image
	@echo "[test] trainer tests inside the TF 2.9 image"
	@tests/trainer/run-in-image.sh $(PYTEST_ARGS)

# The host suite waits on containers most of the time (one test keeps about one core busy), so it
# runs on TEST_WORKERS pytest-xdist workers, each with its own copy of the Airflow DB
# (tests/conftest.py); TEST_WORKERS=1 runs it in this process, in file order.
TEST_WORKERS ?= 2
XDIST_ARGS = $(if $(filter-out 0 1,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder)

.PHONY: host-tools stack-tools
# What the host suite starts besides Airflow: each script says "ready" at once when it has nothing to do.
host-tools: venv stack-tools
	@scripts/ensure-chromium.sh
	@PYTHON=$(PYTHON) scripts/ensure-tf-client.sh
	@PYTHON=$(PYTHON) scripts/ensure-mlflow-server.sh

# The Debian packages the stack and the tests that start PostgreSQL, Redis or a registry need.
stack-tools: venv
	@$(PY) deploy/stack.py tools

# The tests marked older_releases run in the oldest release's suite: on the newest, make up's stack (Celery),
# the sweep's scheduler and tests/ui prove the same in depth.
test-host: venv image airflow-db image-variable data host-tools
	@echo "[test] host tests: provider, DAGs, Airflow runs with real containers ($(TEST_WORKERS) workers)"
	@TFPIPE_IMAGE=$(IMAGE_REF) $(PY) -m pytest -q --durations=25 $(XDIST_ARGS) -m "not older_releases" $(PYTEST_ARGS)

# Airflow version matrix: one lock per supported release in requirements/airflow-X.Y.lock (the
# newest is host.lock, the main venv's). `make test` runs the matrix ends: the newest through
# test-host, the oldest here. The oldest is read from the locks, so adding one moves it.
AIRFLOW_OLDEST = $(shell sed -n 's/^apache-airflow==//p' requirements/airflow-*.lock | sort -V | head -1)
AIRFLOW_VERSION ?= $(AIRFLOW_OLDEST)
.PHONY: test-compat test-compat-oldest compat-prepare-oldest

# venv: the compat suites run the main venv's GCS emulator (a server of its own, locked there).
test-compat: venv image data stack-tools
	@TFPIPE_IMAGE=$(IMAGE_REF) PYTHON=$(PYTHON) XDIST_ARGS="$(XDIST_ARGS)" scripts/test-compat.sh $(AIRFLOW_VERSION) $(PYTEST_ARGS)

test-compat-oldest: venv image data stack-tools
	@TFPIPE_IMAGE=$(IMAGE_REF) PYTHON=$(PYTHON) XDIST_ARGS="$(XDIST_ARGS)" scripts/test-compat.sh $(AIRFLOW_OLDEST) $(PYTEST_ARGS)

# The oldest release's venv and DB alone: `make test` builds them beside the trainer suite.
compat-prepare-oldest:
	@PYTHON=$(PYTHON) scripts/test-compat.sh --prepare $(AIRFLOW_OLDEST)

bench: venv image airflow-db data
	@TFPIPE_IMAGE=$(IMAGE_REF) $(PY) bench/run.py $(BENCH_ARGS)

# Seeing and reproducing a run (tfpipe tensorboard / tfpipe shell; see tfpipe/reproduce.py).
.PHONY: tensorboard shell
RUN ?= latest
TASK ?= train
PORT ?= 6006
ARGS ?=

tensorboard: venv image airflow-db image-variable
	@$(PY) -m tfpipe.cli tensorboard $(DAG) '$(RUN)' --port $(PORT) $(ARGS)

shell: venv image airflow-db image-variable
	@$(PY) -m tfpipe.cli shell $(DAG) $(TASK) --run '$(RUN)' $(ARGS)

clean:
	rm -rf $(AIRFLOW_HOME) $(TFPIPE_HOME)/work $(TFPIPE_HOME)/models

# A real deployment on this machine (deploy/stack.py): PostgreSQL, Redis, the api-server, scheduler,
# dag-processor, triggerer, two Celery workers, a registry and a TLS "GPU host" engine, all on
# loopback. Ports and the state dir come from TFPIPE_STACK_* (see deploy/stack.py).
.PHONY: up down status
STACK_PY = $(if $(wildcard $(PY)),$(PY),$(PYTHON))

up: venv image data
	@$(PY) deploy/stack.py up $(UP_ARGS)

down:
	@$(STACK_PY) deploy/stack.py down

status:
	@$(STACK_PY) deploy/stack.py status
