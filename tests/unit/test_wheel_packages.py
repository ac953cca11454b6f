"""The wheel installs the product's packages and nothing else: benchmarks/, scripts/ and tests/ are run
from the repository root and must not land in site-packages as top-level packages of their own (a
package named `benchmarks` would shadow any other). The package list comes from setuptools' own
reading of pyproject.toml, the discovery `pip wheel .` runs (0.1 s here, against 2 s for the wheel)."""

from __future__ import annotations

from pathlib import Path

from setuptools.config.pyprojecttoml import apply_configuration
from setuptools.dist import Distribution

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = {"common", "openai_frontend", "gateway", "batcher", "gpu_worker", "cbserve", "cbserve_celery"}


def _wheel_packages() -> list[str]:
    dist = apply_configuration(Distribution(), ROOT / "pyproject.toml")
    assert dist.packages, "setuptools found no package in pyproject.toml's configuration"
    return list(dist.packages)


def test_the_wheel_holds_exactly_the_product_packages() -> None:
    assert {name.split(".")[0] for name in _wheel_packages()} == PRODUCT


def test_the_wheel_holds_every_subpackage_of_the_product() -> None:
    """A folder of a product package without `__init__.py` still ships (setuptools finds namespaces)."""
    packages = set(_wheel_packages())
    for top in PRODUCT:
        for folder in (ROOT / top).rglob("*.py"):
            dotted = ".".join(folder.parent.relative_to(ROOT).parts)
            assert dotted in packages, f"{folder.relative_to(ROOT)} is not in the wheel"
