# specon developer entry points. Every target installs what it needs first.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Two install stamps: the dev tools with specon itself (enough for lint, typecheck and imports:
# no torch), and everything (torch on top) for the tests, the demo and the benchmarks.
DEV_STAMP := $(VENV)/.installed-dev
STAMP := $(VENV)/.installed
PIP := $(BIN)/pip install --quiet --disable-pip-version-check
# Expensive builds (kube-apiserver) are cached per user, outside the clone, so a fresh
# clone on a warm machine reuses them.
CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/specon
export SPECON_CACHE := $(CACHE)
# Python's bytecode and pytest's rewritten test modules are build outputs too (__pycache__,
# ignored by git): a machine that sets PYTHONDONTWRITEBYTECODE would have every worker, daemon
# and job of the suite compile the same sources again (collection alone took 31 CPU-s, 19 with
# the caches).
unexport PYTHONDONTWRITEBYTECODE

.PHONY: install install-dev run test check fast lint typecheck imports unit bench chaos clean help gpu-wheels

help: ## List targets
	@grep -E '^[a-z-]+:.*##' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-10s %s\n", $$1, $$2}'

install: $(STAMP) ## Create .venv with specon (editable, every extra), dev tools and torch

install-dev: $(DEV_STAMP) ## Only specon (editable, plot extra) and the dev tools: no torch

# Each re-runs only when the project's dependency list changes.
$(DEV_STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) --upgrade pip setuptools wheel
	$(PIP) -e ".[dev,plot,kubernetes]"
	@touch $@

$(STAMP): $(DEV_STAMP) pyproject.toml
	$(PIP) "torch==2.13.0"
	$(PIP) -e ".[dev,train,plot,docker,kubernetes,tensorboard,lightning,transformers,keras,gpu]"
	@touch $@

run: install ## Run the main job on the embedded default and print the result
	$(BIN)/specon demo

lint: $(DEV_STAMP) ## ruff
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# mypy's cache is per user too: a cold check takes about a minute of one core, and mypy
# revalidates a cached module moved to another clone by its content hash.
typecheck: $(DEV_STAMP) ## mypy --strict
	$(BIN)/mypy --cache-dir $(CACHE)/mypy

imports: $(DEV_STAMP) ## Import contracts (layering; [tool.importlinter] in pyproject.toml)
	$(BIN)/lint-imports

# Workers for the suite: most tests wait on processes, not the CPU (docs/development.md has
# the measurements behind the default for 2 cores). TEST_WORKERS=0 runs it in one process.
# --no-loadscope-reorder: the workers take the tests in the order tests/conftest.py sets
# (heavy groups first, serial tests last), not largest group first.
TEST_WORKERS ?= 4
unit: install ## The test suite only, on $(TEST_WORKERS) pytest-xdist workers (PYTEST_ARGS="-k name" to filter)
	$(BIN)/pytest -q -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder $(PYTEST_ARGS)

fast: install ## The fast tests: tests/unit without the ones marked slow
	$(BIN)/pytest -q tests/unit -m "not slow"

check: install lint typecheck imports fast ## Lint, types, import contracts and the fast tests (about a minute)

test: install lint typecheck imports unit ## Lint, type check, import contracts and the whole suite

bench: install ## Benchmarks: print figures, write bench/results/*.json, flag regressions against bench/baseline.json (BENCH_ARGS="--strict bench_sim")
	$(BIN)/python -m bench $(BENCH_ARGS)

# What `python -m bench bench_gpu` needs beyond PyTorch, aiohttp, pyyaml, numpy and
# prometheus-client, for a GPU machine that reaches no package registry (bench/bench_gpu.py).
GPU_WHEELS := build/gpu-wheels
GPU_WHEEL_PACKAGES := msgspec structlog tenacity nvidia-ml-py
gpu-wheels: $(DEV_STAMP) ## Download the wheels bench_gpu needs on a GPU machine without registries (build/gpu-wheels)
	@mkdir -p $(GPU_WHEELS)
	for v in 3.10 3.11 3.12 3.13; do \
		$(BIN)/pip download --quiet --disable-pip-version-check --only-binary=:all: --python-version $$v \
			--platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 -d $(GPU_WHEELS) \
			$(GPU_WHEEL_PACKAGES) || exit 1; \
	done
	@ls $(GPU_WHEELS)

CHAOS_SEED ?= 1
CHAOS_MIGRATIONS ?= 100
CHAOS_PARTITIONS ?= 30
CHAOS_HOST_LOSSES ?= 20
CHAOS_LONG_PARTITIONS ?= 20
CHAOS_RECLAIMS ?= 5
chaos: install ## Seeded chaos run on network hosts (two agents' clocks off): kills, hangs, >= 30 partitions (>= 20 past recovery.after), >= 20 lost hosts, >= 5 reclaim notices, slow saves while >= 100 jobs migrate; counts to bench/results/chaos.json
	cd tests/integration && $(abspath $(VENV))/bin/python chaos_run.py --seed $(CHAOS_SEED) \
		--migrations $(CHAOS_MIGRATIONS) --min-partitions $(CHAOS_PARTITIONS) \
		--min-host-losses $(CHAOS_HOST_LOSSES) --min-long-partitions $(CHAOS_LONG_PARTITIONS) \
		--min-reclaims $(CHAOS_RECLAIMS) --out $(abspath bench/results/chaos.json)

clean: ## Remove build products (keeps .venv and the cache)
	rm -rf build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache .import_linter_cache

# The real control plane for tests/k8s (the test fixtures run the same script).
KUBE_BUILD := tests/k8s/build-apiserver.sh
.PHONY: kube-apiserver
kube-apiserver: install ## Build once and cache kube-apiserver, kube-scheduler, kube-controller-manager, kubelet v1.20.2, pause, etcd; apt-install containerd/runc/CNI (tests/k8s)
	PYTHON=$(CURDIR)/$(BIN)/python bash $(KUBE_BUILD) --node

# -- Kubernetes (see manifests/ and docs/kubernetes.md) ------------------------------------
IMAGE ?= specon:0.1.0
KUBECTL ?= kubectl
DEPLOY_DIR := $(CACHE)/deploy

.PHONY: image deploy undeploy

image: ## Build the container image $(IMAGE) (docker build)
	docker build -t $(IMAGE) .

# manifests/ ships no credential: agents authenticate with their pods' ServiceAccount
# tokens (TokenReview). deploy adds the two Secrets manifests/ mounts, a random read token for
# the status API and page and the manager's certificate from a CA of the deployment, made once
# and kept in .cache/deploy (never in git), through an overlay there, and first creates the training namespaces of manifests/training that do
# not exist yet, each enforcing Pod Security baseline or stricter (scripts/training-namespaces.sh;
# undeploy never deletes them).
deploy: image ## Build the image and apply manifests/ to the current kube context
	@mkdir -p $(DEPLOY_DIR)
	@WEBHOOK=$(WEBHOOK) bash scripts/deploy-overlay.sh $(DEPLOY_DIR) $(IMAGE)
	@bash scripts/training-namespaces.sh $(KUBECTL)
	$(KUBECTL) apply -k $(DEPLOY_DIR)
	$(KUBECTL) -n specon rollout status deployment/specon-manager --timeout=120s

# undeploy keeps what is labelled specon.io/keep-on-undeploy (the namespace with the journal,
# the volume's claim), so a redeploy finds every migration and binds the same volume;
# PURGE=1 deletes those too. Training namespaces and their pods always stay.
undeploy: ## Remove specon from the current kube context; keeps its namespace, journal and volume claim (PURGE=1: everything)
ifeq ($(PURGE),1)
	$(KUBECTL) delete -k manifests/ --ignore-not-found
else
	$(KUBECTL) delete -k manifests/ --ignore-not-found -l 'specon.io/keep-on-undeploy!=true'
endif
