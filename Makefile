SHELL := /bin/bash
# Every target creates the virtual environment first, so `make demo` and `make test` work on a fresh clone.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
EXTRAS := daemon,s3,torch,lance,parquet,zstd,dev
PIP_QUIET := --quiet --disable-pip-version-check

.PHONY: setup test lint typecheck demo bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install $(PIP_QUIET) --upgrade pip 2>&1 | grep -v "^WARNING: Location" || true
	# torch is pinned to the CPU build that lies on disk; an unpinned torch would pull a multi-GB CUDA build.
	$(PY) -m pip install $(PIP_QUIET) "torch==2.13.0" 2>&1 | grep -v "^WARNING: Location"; test $${PIPESTATUS[0]:-0} -eq 0
	$(PY) -m pip install $(PIP_QUIET) -e ".[$(EXTRAS)]" 2>&1 | grep -v "^WARNING: Location"; test $${PIPESTATUS[0]:-0} -eq 0
	touch $(STAMP)

lint: $(STAMP)
	$(VENV)/bin/ruff check daemon client protocol tests bench harness examples scripts
	$(VENV)/bin/ruff format --check daemon client protocol tests bench harness examples scripts

typecheck: $(STAMP)
	$(VENV)/bin/mypy

test: lint typecheck
	$(VENV)/bin/pytest -q

# The demo is an example beside the package (examples/trainer_demo); flags: make demo ARGS="--epochs 3".
demo: $(STAMP)
	PYTHONPATH=examples$${PYTHONPATH:+:$$PYTHONPATH} $(PY) -m trainer_demo $(ARGS)

bench: $(STAMP)
	$(PY) -m bench

clean:
	rm -rf $(VENV) .shardcache .pytest_cache .mypy_cache .ruff_cache
