"""The layering rules, read from the source: services never import one another; libraries no service.

`common` and `openai_frontend` are libraries: `common` is what every process shares (the protocol,
stream names, Redis helpers), `openai_frontend` turns OpenAI requests into queued requests and their
tokens back into responses, for the gateway and the Celery batch task alike. Each service runs as its
own process and talks to the others only through Redis, so none imports another's code.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ("gateway", "batcher", "gpu_worker", "cbserve_celery", "cbserve")
# Each library and the top-level packages it may import, besides itself and third-party ones.
LIBRARIES: dict[str, tuple[str, ...]] = {"common": (), "openai_frontend": ("common",)}
PROJECT = (*SERVICES, *LIBRARIES, "benchmarks", "scripts", "tests", "models")


def _imported_packages(path: Path) -> set[str]:
    """The project's top-level packages this file imports, at any depth (function-level imports too)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        found.update(top for name in names if (top := name.split(".")[0]) in PROJECT)
    return found


def _violations(package: str, allowed: tuple[str, ...]) -> list[str]:
    return [
        f"{path.relative_to(ROOT)} imports {other}"
        for path in sorted((ROOT / package).rglob("*.py"))
        for other in sorted(_imported_packages(path) - {package, *allowed})
    ]


@pytest.mark.parametrize("library", sorted(LIBRARIES))
def test_a_library_imports_no_service(library: str) -> None:
    assert _violations(library, LIBRARIES[library]) == []


@pytest.mark.parametrize("service", SERVICES)
def test_a_service_imports_no_other_service(service: str) -> None:
    assert _violations(service, tuple(LIBRARIES)) == []


def test_the_rules_see_an_import() -> None:
    """The scan finds imports at module and function level, so an empty list above means something."""
    assert {"common", "openai_frontend"} <= _imported_packages(ROOT / "cbserve_celery" / "batch_runner.py")
    assert "openai_frontend" in _imported_packages(ROOT / "cbserve_celery" / "app.py")
