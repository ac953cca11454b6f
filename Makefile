# Two commands matter: `make run MODEL=/path/to/model` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
MODEL ?=

.PHONY: install test lint run demo-model

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	# CPU hosts: this pins the CPU wheel that lies on local disk; GPU hosts get the CUDA build.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[dev]"
	touch $@

install: $(VENV)/.installed

lint: install
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy

test: lint
	$(PY) -m pytest

# Batcher, worker(s) and gateway as local processes; needs a Redis at REDIS_URL and MODEL=<dir>.
run: install
	MODEL="$(MODEL)" PY="$(PY)" scripts/run_local.sh

# A small random-weight model directory to try the stack with (no hub needed): make demo-model
demo-model: install
	$(PY) -m tests.tiny_model models/tiny-llama
