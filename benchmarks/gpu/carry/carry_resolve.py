"""The wheels a lent GPU host needs carried for benchmarks/gpu/gpu_check.sh, resolved, not listed.

The roots are the project's requirements the check runs on (pyproject.toml: the base dependencies,
the `worker`, `gateway` and `bench` extras, and `pytest` from `dev` for the kernel tests); the host
is what benchmarks/gpu/carry/gpu_host_packages.txt says is installed there. A requirement whose marker holds
for CPython 3.12 on x86-64 Linux is left to the host when the host's version satisfies it (a package
listed without a version is taken to, and the lock names it under `assumed`); otherwise the package
is carried, and every Requires-Dist of its wheel is resolved the same way, recursively. A carried
package shadows the host's copy (it comes first on PYTHONPATH), so every requirement on it, the
host's included, must hold for the carried version; a pick that breaks one is redone with that
requirement added (a few rounds at most). `unsatisfied` and `superfluous` check a finished lock.
"""

from __future__ import annotations

import tomllib
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import NormalizedName, canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[3]
PROJECT = "cbserve"
# The extras of pyproject.toml the check imports, and the test tools it runs (taken from `dev`).
CHECK_EXTRAS = ("worker", "gateway", "bench")
CHECK_TOOLS = ("pytest",)
# The GPU host's interpreter and platform (KINDS.md), for environment markers.
TARGET_ENV = {
    "python_version": "3.12",
    "python_full_version": "3.12.3",
    "implementation_name": "cpython",
    "implementation_version": "3.12.3",
    "platform_python_implementation": "CPython",
    "os_name": "posix",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "platform_release": "",
    "platform_version": "",
}

# name -> its version there, or None: installed at a version nobody has read.
Host = dict[str, Version | None]  # by canonical name


@dataclass(frozen=True, slots=True)
class Wheel:
    name: NormalizedName
    version: str
    filename: str
    size: int
    sha256: str
    requires_dist: tuple[str, ...]  # as its METADATA lists them


# (name, specifier) -> the wheel to carry for it: the first argument's name within the specifier.
WheelSource = Callable[[NormalizedName, SpecifierSet], Wheel]


@dataclass(slots=True)
class Carried:
    wheel: Wheel
    extras: set[str]  # the extras some requirement asked of it (their Requires-Dist are followed)
    why: str


@dataclass(slots=True)
class Lock:
    requirements: list[str]  # the roots
    carry: dict[str, Carried] = field(default_factory=dict)  # by canonical name
    # The requirements left to the host, by package: "requirement (from whom)".
    host: dict[str, list[str]] = field(default_factory=dict)

    def size(self) -> int:
        return sum(c.wheel.size for c in self.carry.values())


class ResolutionError(Exception):
    pass


class _Conflict(Exception):
    def __init__(self, name: NormalizedName, specifier: SpecifierSet) -> None:
        super().__init__(f"{name}{specifier}")
        self.name, self.specifier = name, specifier


def read_host(path: Path) -> Host:
    """`name==version` or a bare `name` per line; `#` starts a comment."""
    host: Host = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            host[canonicalize_name(name)] = Version(version) if version else None
    return host


def check_requirements(pyproject: Path = ROOT / "pyproject.toml") -> list[Requirement]:
    """The roots: base dependencies, CHECK_EXTRAS (with `cbserve[...]` expanded), CHECK_TOOLS."""
    project = tomllib.loads(pyproject.read_text())["project"]
    extras: dict[str, list[str]] = project["optional-dependencies"]

    def expanded(extra: str) -> list[Requirement]:
        found: list[Requirement] = []
        for text in extras[extra]:
            requirement = Requirement(text)
            if canonicalize_name(requirement.name) == PROJECT:
                for inner in sorted(requirement.extras):
                    found += expanded(inner)
            else:
                found.append(requirement)
        return found

    roots = [Requirement(text) for text in project["dependencies"]]
    for extra in CHECK_EXTRAS:
        roots += expanded(extra)
    roots += [r for r in expanded("dev") if canonicalize_name(r.name) in CHECK_TOOLS]
    unique: dict[str, Requirement] = {}
    for requirement in roots:
        unique.setdefault(str(requirement), requirement)
    return list(unique.values())


def applies(requirement: Requirement, extras: Iterable[str] = ()) -> bool:
    """Whether the requirement holds on the GPU host, for a package installed with `extras`."""
    if requirement.marker is None:
        return True
    return any(requirement.marker.evaluate({**TARGET_ENV, "extra": e}) for e in ("", *extras))


def _contains(specifier: SpecifierSet, version: Version | str) -> bool:
    return specifier.contains(version, prereleases=True)


def resolve(roots: list[Requirement], host: Host, source: WheelSource, rounds: int = 8) -> Lock:
    """The carry for `roots` on `host`; raises ResolutionError when it cannot close it."""
    learned: dict[NormalizedName, SpecifierSet] = {}
    for _ in range(rounds):
        try:
            lock = _resolve_once(roots, host, source, learned)
        except _Conflict as conflict:
            learned[conflict.name] = learned.get(conflict.name, SpecifierSet()) & conflict.specifier
            continue
        problems = unsatisfied(lock, host)
        if problems:
            raise ResolutionError("; ".join(problems))
        return lock
    raise ResolutionError(f"no carry satisfies every requirement after {rounds} rounds: {learned}")


def _resolve_once(
    roots: list[Requirement], host: Host, source: WheelSource, learned: dict[NormalizedName, SpecifierSet]
) -> Lock:
    lock = Lock(requirements=[str(r) for r in roots])
    queue: deque[tuple[Requirement, str]] = deque((r, PROJECT) for r in roots if applies(r))
    while queue:
        requirement, by = queue.popleft()
        name = canonicalize_name(requirement.name)
        specifier = requirement.specifier
        carried = lock.carry.get(name)
        if carried is not None:
            if not _contains(specifier, carried.wheel.version):
                raise _Conflict(name, specifier)
            new = requirement.extras - carried.extras
            carried.extras |= new
            if new:
                queue.extend(_requires(carried.wheel, new))
            continue
        on_host = host.get(name)
        if name in host and (on_host is None or _contains(specifier, on_host)):
            if requirement.extras:
                raise ResolutionError(
                    f"{requirement} (from {by}): the host's {name} is asked for extras; "
                    "their requirements are unknown here, resolve them by hand"
                )
            lock.host.setdefault(name, []).append(f"{requirement} (from {by})")
            continue
        wheel = source(name, specifier & learned.get(name, SpecifierSet()))
        if not _contains(specifier, wheel.version):
            raise ResolutionError(f"{name} {wheel.version} was picked for {specifier}")
        for earlier in lock.host.pop(name, []):  # the carried copy shadows the host's: it must hold
            earlier_requirement = Requirement(earlier.rsplit(" (from ", 1)[0])
            if not _contains(earlier_requirement.specifier, wheel.version):
                raise _Conflict(name, earlier_requirement.specifier)
        why = (
            "not on the host" if name not in host else f"the host's {on_host} does not satisfy {requirement}"
        )
        lock.carry[name] = Carried(wheel, set(requirement.extras), f"{why} (from {by})")
        queue.extend(_requires(wheel, requirement.extras))
    return lock


def _requires(wheel: Wheel, extras: Iterable[str]) -> list[tuple[Requirement, str]]:
    extras = tuple(extras)
    found: list[tuple[Requirement, str]] = []
    for text in wheel.requires_dist:
        requirement = Requirement(text)
        if applies(requirement, extras):
            found.append((requirement, wheel.name))
    return found


def _all_requirements(lock: Lock) -> list[tuple[Requirement, str]]:
    """Every requirement that holds on the host: the roots and each carried wheel's."""
    found = [(Requirement(text), PROJECT) for text in lock.requirements]
    found = [(r, by) for r, by in found if applies(r)]
    for carried in lock.carry.values():
        found += _requires(carried.wheel, carried.extras)
    return found


def unsatisfied(lock: Lock, host: Host) -> list[str]:
    """Requirements of the roots or of a carried wheel that neither the carry nor the host meets."""
    problems = []
    for requirement, by in _all_requirements(lock):
        name = canonicalize_name(requirement.name)
        carried, on_host = lock.carry.get(name), host.get(name)
        if carried is not None:
            if not _contains(requirement.specifier, carried.wheel.version):
                problems.append(f"{requirement} (from {by}): carried {carried.wheel.version}")
            elif requirement.extras - carried.extras:
                problems.append(f"{requirement} (from {by}): carried without those extras")
        elif name not in host:
            problems.append(f"{requirement} (from {by}): neither carried nor on the host")
        elif on_host is not None and not _contains(requirement.specifier, on_host):
            problems.append(f"{requirement} (from {by}): the host has {on_host}")
        elif requirement.extras:
            problems.append(f"{requirement} (from {by}): the host's copy, extras unknown")
    return problems


def superfluous(lock: Lock, host: Host) -> list[str]:
    """Carried packages the host would have satisfied: every requirement on them met by its version."""
    on: dict[str, list[Requirement]] = {}
    for requirement, _by in _all_requirements(lock):
        on.setdefault(canonicalize_name(requirement.name), []).append(requirement)
    found = []
    for name in lock.carry:
        if name not in host:
            continue
        version = host[name]
        if all(
            not r.extras and (version is None or _contains(r.specifier, version)) for r in on.get(name, [])
        ):
            found.append(f"{name}: the host's {version or 'copy'} satisfies every requirement on it")
    return found


def assumed(lock: Lock, host: Host) -> list[str]:
    """Host packages the lock relies on whose version is unknown: checked on the host (carry_verify)."""
    return sorted(name for name in lock.host if host.get(name) is None)
