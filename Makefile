# Two commands matter: `make run` (serve the demo model; `make run ARGS="--workers 2"`) and `make test`
# (`make test-fast`: only the tests that start no service, tests/unit/, in about two minutes). `make run`
# installs what serves and the SDKs of the README's examples (the `serve` and `clients` extras); the test
# toolchain (`dev`) comes with `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
# Passed to `cbserve up`, e.g. ARGS="--model /path/to/model --port 8123 --workers 2". A MODEL given on
# the make command line reaches cbserve through the environment, as before.
ARGS ?=
# torch comes first and on its own, so no resolver picks its build. Here `pip install torch==2.13.0`
# finds a CPU wheel on local disk; a GPU host gets the CUDA build from PyPI. On a CPU-only machine
# elsewhere, set TORCH_INDEX_URL to PyTorch's CPU-only wheel index to skip the multi-GB CUDA build:
# it is passed as --index-url only when nvidia-smi is absent.
TORCH_INDEX_URL ?=
TORCH_PIP_ARGS := $(if $(TORCH_INDEX_URL),$(if $(shell command -v nvidia-smi),,--index-url $(TORCH_INDEX_URL)))

.PHONY: install install-serve check-deps test test-fast lint run train-demo-model

# --no-compile: Python compiles only what is imported, when first imported, instead of pip
# byte-compiling every file of torch and transformers up front (a minute of a clean CI run).
# pip runs quietly; these lines say what the wait is for (a first install takes minutes).
define pip_install
	test -x $(PY) || python3 -m venv $(VENV)
	@echo "make: installing torch 2.13.0 into $(VENV) (once; a few minutes the first time)"
	$(PY) -m pip install -q --no-compile torch==2.13.0 $(TORCH_PIP_ARGS)
	@echo "make: installing cbserve[$(1)] into $(VENV)"
	$(PY) -m pip install -q --no-compile -e ".[$(1)]"
endef

# Everything: what serves, the benchmarks and the test toolchain (dev includes serve and clients).
$(VENV)/.installed: pyproject.toml
	$(call pip_install,dev)
	touch $@ $(VENV)/.installed-serve

# What serves and the examples' SDKs, for `make run` (tests/stack/launcher_cli/test_readme_examples.py makes a
# venv with this target, VENV=build/readme-venv/<hash>, and runs every example of the docs in it).
RUN_EXTRAS := serve,clients
$(VENV)/.installed-serve: pyproject.toml
	$(call pip_install,$(RUN_EXTRAS))
	touch $@

install: $(VENV)/.installed
install-serve: $(VENV)/.installed-serve

lint: install
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy

# Programs the tests drive that pip cannot install: redis-server (each test starts its own) and
# Chromium for the dashboard's browser test (Playwright drives that binary; it never downloads one;
# CBSERVE_CHROMIUM may name it). As root with apt-get they are installed, else make stops and says how.
check-deps:
	@missing=""; \
	command -v redis-server >/dev/null || missing="$$missing redis-server"; \
	[ -n "$$CBSERVE_CHROMIUM" ] || command -v chromium >/dev/null || command -v chromium-browser >/dev/null \
		|| missing="$$missing chromium"; \
	[ -z "$$missing" ] && exit 0; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "make check-deps: installing$$missing with apt-get"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	else \
		echo "make check-deps: the tests need$$missing: sudo apt-get install$$missing" \
			"(or your system's package; CBSERVE_CHROMIUM=/path/to/chromium names a browser)" >&2; \
		exit 1; \
	fi

# Two processes, each taking whole test modules (module-scoped stacks start once): most tests wait on
# subprocesses and Redis, so two share two cores well. PYTEST_WORKERS=0 runs them in this process.
PYTEST_WORKERS ?= 2
# Each test starts its own services, hundreds of Python processes that import torch, transformers and
# FastAPI: they share compiled bytecode only if the first is allowed to write it, even where the
# environment sets PYTHONDONTWRITEBYTECODE (Python reads an empty value as unset).
test: export PYTHONDONTWRITEBYTECODE :=
# The CPU kernels (gpu_worker/kernels/cpu/) are compiled once, before any test's worker would wait on it.
test: check-deps lint
	$(PY) -m gpu_worker.kernels.cpu
	$(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadfile

# The tests that start no service (marked `unit` by their folder, tests/unit/): no Redis, no stack, no
# lint. The lane to run while changing code; `make test` is still the one that must pass. Naming the
# folder spares each pytest process importing the other test modules only to deselect them (~6 s).
test-fast: export PYTHONDONTWRITEBYTECODE :=
test-fast: install
	$(PY) -m gpu_worker.kernels.cpu
	$(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadfile -m unit tests/unit

# Redis (REDIS_URL if reachable, else redis-server from PATH, else the embedded one), the batcher,
# worker(s) and the gateway on :8000 in one command; Ctrl-C stops them all. See `cbserve up --help`.
# Bytecode written, as for the tests: without it every start of every service compiles torch's and
# transformers' sources again (seconds per process; the worker's restart doubled).
run: export PYTHONDONTWRITEBYTECODE :=
run: install-serve
	$(VENV)/bin/cbserve up $(ARGS)

# Retrain the shipped demo model (deterministic; its card, models/demo/README.md, gives the time).
train-demo-model: install
	$(PY) -m scripts.train_demo_model --out models/demo
