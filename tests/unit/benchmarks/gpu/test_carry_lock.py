"""The GPU host's carry (benchmarks/gpu/carry/gpu_carry.lock.json): resolved against the host's packages,
closed under every carried wheel's Requires-Dist for CPython 3.12 on x86-64 Linux, current with
pyproject.toml, and small enough to travel beside the working tree."""

from __future__ import annotations

from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.tags import Tag
from packaging.utils import NormalizedName, canonicalize_name, parse_wheel_filename
from packaging.version import Version

from benchmarks.gpu.carry.carry_lock import HOST, LOCK, load
from benchmarks.gpu.carry.carry_resolve import (
    Host,
    Lock,
    ResolutionError,
    Wheel,
    assumed,
    check_requirements,
    read_host,
    resolve,
    superfluous,
    unsatisfied,
)

MiB = 2**20


@pytest.fixture(scope="module")
def host() -> Host:
    return read_host(HOST)


@pytest.fixture(scope="module")
def locked() -> tuple[Lock, dict]:
    return load(LOCK)


def test_every_requirement_of_the_carry_is_met_by_the_carry_or_the_host(locked, host) -> None:
    lock, _data = locked
    assert lock.carry, "the check needs packages the host lacks (pydantic, fastapi, ...)"
    assert unsatisfied(lock, host) == []


def test_nothing_is_carried_that_the_host_already_satisfies(locked, host) -> None:
    lock, _data = locked
    assert superfluous(lock, host) == []
    # The host's own numpy, transformers, huggingface-hub, pytest stay unshadowed.
    for name in ("numpy", "transformers", "huggingface-hub", "tokenizers", "torch", "pytest"):
        assert name not in lock.carry


def test_the_lock_is_current_with_pyproject_and_the_host_list(locked, host) -> None:
    lock, data = locked
    assert lock.requirements == [str(r) for r in check_requirements()], (
        "run: python -m benchmarks.gpu.carry.carry_lock lock"
    )
    assert data["assumed"] == assumed(lock, host)
    assert set(lock.host) <= set(host)


def test_the_carry_travels_in_under_48_mib(locked) -> None:
    lock, data = locked
    total = sum(c.wheel.size for c in lock.carry.values()) + sum(data["files"].values())
    assert data["total_bytes"] == total
    assert "bin/redis-server" in data["files"]
    assert total < 48 * MiB, f"{total / MiB:.1f} MiB"


def test_each_wheel_is_one_version_for_cpython_312_on_x86_64_linux(locked) -> None:
    lock, _data = locked
    for name, carried in lock.carry.items():
        wheel_name, version, _build, tags = parse_wheel_filename(carried.wheel.filename)
        assert (wheel_name, version) == (name, Version(carried.wheel.version))
        assert any(_runs_on_host(tag) for tag in tags), carried.wheel.filename
        assert len(carried.wheel.sha256) == 64


def _runs_on_host(tag: Tag) -> bool:
    stable_abi = tag.abi == "abi3" and tag.interpreter.startswith("cp3") and int(tag.interpreter[3:]) <= 12
    python = tag.interpreter in {"py3", "cp312", "py312"} or stable_abi
    linux = tag.platform.startswith("manylinux") and tag.platform.endswith("x86_64")
    return python and (tag.platform == "any" or linux)


# ---- the resolver on a made-up index --------------------------------------------------------------


class FakeIndex:
    """Versions and Requires-Dist by name; picks the newest version the specifier allows."""

    def __init__(self, packages: dict[str, dict[str, list[str]]]) -> None:
        self.packages = packages
        self.asked: list[str] = []

    def __call__(self, name: NormalizedName, specifier: SpecifierSet) -> Wheel:
        self.asked.append(f"{name}{specifier}")
        versions = sorted((Version(v) for v in self.packages[name]), reverse=True)
        version = next(v for v in versions if specifier.contains(v, prereleases=True))
        return Wheel(
            name=name,
            version=str(version),
            filename=f"{name}-{version}-py3-none-any.whl",
            size=1000,
            sha256="0" * 64,
            requires_dist=tuple(self.packages[name][str(version)]),
        )


def _host(**versions: str | None) -> Host:
    return {canonicalize_name(n): None if v is None else Version(v) for n, v in versions.items()}


def test_missing_packages_are_carried_with_their_requirements_recursively() -> None:
    index = FakeIndex(
        {
            "pydantic-settings": {"2.16.3": ["pydantic>=2.7", "python-dotenv>=1.2.2"]},
            "pydantic": {"2.14.4": ["typing-extensions>=4.16"]},
            "python-dotenv": {"1.2.4": ["click>=5; extra == 'cli'"]},
        }
    )
    lock = resolve([Requirement("pydantic-settings>=2.3")], _host(**{"typing-extensions": "4.16.0"}), index)
    assert sorted(lock.carry) == ["pydantic", "pydantic-settings", "python-dotenv"]
    assert lock.host == {"typing-extensions": ["typing-extensions>=4.16 (from pydantic)"]}
    assert "click" not in lock.carry  # an extra nobody asked for


def test_the_host_copy_is_used_when_it_satisfies_and_carried_when_it_does_not() -> None:
    index = FakeIndex({"numpy": {"2.4.6": []}, "tokenizers": {"0.23.3": []}})
    host = _host(numpy="2.5.2", tokenizers="0.19.0")
    lock = resolve([Requirement("numpy>=1.26"), Requirement("tokenizers>=0.20")], host, index)
    assert list(lock.carry) == ["tokenizers"]
    assert "the host's 0.19.0 does not satisfy tokenizers>=0.20" in lock.carry["tokenizers"].why
    assert lock.host == {"numpy": ["numpy>=1.26 (from cbserve)"]}
    assert superfluous(lock, host) == []


def test_a_host_package_of_unknown_version_is_assumed_and_named() -> None:
    host = _host(httpx=None)
    lock = resolve([Requirement("httpx>=0.27")], host, FakeIndex({}))
    assert lock.carry == {}
    assert assumed(lock, host) == ["httpx"]


def test_markers_are_those_of_python_312_on_x86_64_linux_and_extras_are_followed() -> None:
    index = FakeIndex(
        {
            "redis": {
                "8.2.0": ["hiredis>=3.0; extra == 'hiredis'", "async-timeout; python_version < '3.11.3'"]
            },
            "hiredis": {"3.5.0": []},
            "uvicorn": {
                "0.55.0": ["colorama; sys_platform == 'win32'", "h11>=0.8", "uvloop; extra == 'standard'"]
            },
        }
    )
    host = _host(h11="0.16.0")
    lock = resolve([Requirement("redis[hiredis]>=5.0"), Requirement("uvicorn")], host, index)
    assert sorted(lock.carry) == ["hiredis", "redis", "uvicorn"]
    assert lock.carry["redis"].extras == {"hiredis"}


def test_a_pick_that_breaks_a_later_requirement_is_redone_within_it() -> None:
    index = FakeIndex(
        {
            "starlette": {"1.10.0": [], "0.48.0": []},
            "fastapi": {"0.120.0": ["starlette<0.49,>=0.40"]},
        }
    )
    lock = resolve([Requirement("starlette"), Requirement("fastapi")], {}, index)
    assert lock.carry["starlette"].wheel.version == "0.48.0"
    assert unsatisfied(lock, {}) == []


def test_a_carried_copy_must_meet_what_the_host_copy_was_asked_for() -> None:
    # anyio 3.0 on the host meets the first requirement; the second needs a carried one that also
    # meets the first, since it shadows the host's for both.
    index = FakeIndex({"anyio": {"4.16.0": [], "5.0.0": []}})
    host = _host(anyio="3.0.0")
    lock = resolve([Requirement("anyio<5"), Requirement("anyio>=4")], host, index)
    assert lock.carry["anyio"].wheel.version == "4.16.0"
    assert lock.host == {}


def test_an_unmet_requirement_is_reported_and_extras_of_a_host_package_refused() -> None:
    index = FakeIndex({"fastapi": {"0.165.0": ["starlette>=1.6"]}, "starlette": {"1.10.0": []}})
    lock = resolve([Requirement("fastapi")], {}, index)
    del lock.carry["starlette"]
    assert unsatisfied(lock, {}) == ["starlette>=1.6 (from fastapi): neither carried nor on the host"]
    with pytest.raises(ResolutionError, match="extras"):
        resolve([Requirement("transformers[serving]")], _host(transformers="5.17.0"), FakeIndex({}))


def test_the_roots_are_the_base_dependencies_the_checks_extras_and_pytest() -> None:
    names = {canonicalize_name(r.name) for r in check_requirements()}
    assert {"msgspec", "pydantic-settings", "transformers", "fastapi", "aiohttp", "pytest"} <= names
    assert not names & {"cbserve", "openai", "ruff", "mypy", "celery", "torch"}


def test_the_host_list_reads_versions_and_unknowns(tmp_path: Path) -> None:
    path = tmp_path / "host.txt"
    path.write_text("# comment\ntorch==2.11.0\nhuggingface_hub==1.33.0  # seen\nhttpx\n")
    assert read_host(path) == _host(torch="2.11.0", **{"huggingface-hub": "1.33.0"}, httpx=None)
