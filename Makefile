# specon developer entry points. Every target installs what it needs first.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
CACHE ?= $(CURDIR)/.cache
export SPECON_CACHE := $(CACHE)

.PHONY: install run test lint typecheck unit bench clean help

help: ## List targets
	@grep -E '^[a-z-]+:.*##' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-10s %s\n", $$1, $$2}'

install: $(STAMP) ## Create .venv with specon (editable), dev tools and torch

# Re-runs only when the project's dependency list changes.
$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check --upgrade pip setuptools wheel
	$(BIN)/pip install --quiet --disable-pip-version-check "torch==2.13.0"
	$(BIN)/pip install --quiet --disable-pip-version-check -e ".[dev,train]"
	@touch $(STAMP)

run: install ## Run the main job on the embedded default and print the result
	$(BIN)/specon demo

lint: install ## ruff
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: install ## mypy --strict
	$(BIN)/mypy

unit: install ## The test suite only
	$(BIN)/pytest -q

test: install lint typecheck unit ## Lint, type check and the whole suite

bench: install ## Benchmarks: print figures and write bench/results/*.json
	$(BIN)/python -m bench

clean: ## Remove build products (keeps .venv and the cache)
	rm -rf build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache
