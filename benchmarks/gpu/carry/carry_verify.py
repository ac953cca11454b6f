"""Before any step of benchmarks/gpu/gpu_check.sh: is the carry whole on this host?

    python -m benchmarks.gpu.carry.carry_verify [--carried] [--lock benchmarks/gpu/carry/gpu_carry.lock.json]

1. Every requirement the lock leaves to the host is checked against the version installed here
   (those the lock could only assume are printed with the version read, for gpu_host_packages.txt);
   a missing or older package is reported, not fatal: the imports below decide.
2. With `--carried` (after the wheels were installed), each carried package must be the lock's
   version: a different copy earlier on sys.path would shadow it.
3. Every module the steps import, third-party first, then the project's entry points. The first that
   fails to import ends the run: it is printed as `cannot import MODULE (Error: message)` on
   stderr and the exit status is 1, so the script stops before spending its budget on steps that
   cannot start. Otherwise the versions of torch, transformers, triton and numpy are printed.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import json
import sys
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement

LOCK = Path(__file__).resolve().parent / "gpu_carry.lock.json"
# What the steps import: the kernels (pytest, triton), parity and decode (the worker), the e2e
# runs (the gateway, batcher and worker processes, and the load generator), the control plane.
MODULES = (
    "torch",
    "triton",
    "numpy",
    "transformers",
    "tokenizers",
    "safetensors",
    "msgspec",
    "redis",
    "hiredis",
    "pydantic",
    "pydantic_settings",
    "fastapi",
    "uvicorn",
    "multipart",
    "prometheus_client",
    "jinja2",
    "httpx",
    "aiohttp",
    "tqdm",
    "xgrammar",
    "pytest",
    "gpu_worker.service.worker",
    "batcher.service.loop",
    "gateway.app",
    "benchmarks.serve",
    "benchmarks.gpu.gpu_parity",
    "benchmarks.worker_step.decode_roofline",
    "benchmarks.pipeline.control_plane",
    "benchmarks.workloads.make_model",
)


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def host_problems(lock: dict[str, Any]) -> list[str]:
    problems = []
    for name, requirements in lock["host"].items():
        version = _version(name)
        for text in requirements:
            requirement = Requirement(text.rsplit(" (from ", 1)[0])
            if requirement.marker is not None and not requirement.marker.evaluate():
                continue
            if version is None:
                problems.append(f"{text}: {name} is not installed here")
            elif not requirement.specifier.contains(version, prereleases=True):
                problems.append(f"{text}: this host has {name} {version}")
    return problems


def carried_problems(lock: dict[str, Any]) -> list[str]:
    problems = []
    for entry in lock["carry"]:
        version = _version(entry["name"])
        if version != entry["version"]:
            problems.append(
                f"{entry['name']}: {version or 'none'} found, the carried {entry['version']} expected"
            )
    return problems


def first_failed_import(modules: tuple[str, ...] | None = None) -> str | None:
    """`MODULE (Error: message)` for the first module that does not import, else None."""
    for module in MODULES if modules is None else modules:
        try:
            importlib.import_module(module)
        except Exception as exc:  # any failure to import ends the run, whatever its kind
            return f"{module} ({type(exc).__name__}: {exc})"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu.carry.carry_verify", description=__doc__)
    parser.add_argument("--lock", type=Path, default=LOCK)
    parser.add_argument("--carried", action="store_true", help="the lock's wheels are installed: check them")
    args = parser.parse_args(argv)
    lock = json.loads(args.lock.read_text())
    read = {name: _version(name) for name in lock["assumed"]}
    print(
        "carry_verify: assumed host packages, as read here:", " ".join(f"{n}=={v}" for n, v in read.items())
    )
    problems = host_problems(lock) + (carried_problems(lock) if args.carried else [])
    for problem in problems:
        print(f"carry_verify: unmet: {problem}", file=sys.stderr)
    failed = first_failed_import()
    if failed is not None:
        print(f"carry_verify: cannot import {failed}", file=sys.stderr)
        return 1
    print(f"carry_verify: {len(MODULES)} modules import; {len(problems)} unmet requirements")
    import torch

    versions = " ".join(f"{n} {_version(n)}" for n in ("torch", "transformers", "triton", "numpy"))
    print(f"carry_verify: {versions}; cuda {torch.cuda.is_available()}; python {sys.version.split()[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
