"""The venv a user's `make run` makes, built by the Makefile's own target (`make install-serve VENV=...`),
so that the docs' examples run in the interpreter the README names and with what it installs, never
with the dev venv's test toolchain.

It is kept in build/readme-venv/<key>, the key a hash of pyproject.toml and the Makefile: a second
test run reuses it, a change to either file builds a new one (the older ones are removed), and a
clean clone builds it once per run (about a minute here with pip's cache warm).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
from pathlib import Path

from harness.processes.services import ROOT

VENVS = ROOT / "build" / "readme-venv"
BUILD_TIMEOUT_S = 900.0  # torch, transformers, FastAPI, Celery, xgrammar and the SDKs, from pip's cache
MARKER = ".installed-serve"  # the Makefile's: written once the install finished


def venv_key() -> str:
    """What the venv is built from: the install recipe (Makefile) and what it installs (pyproject)."""
    digest = hashlib.sha256()
    for name in ("pyproject.toml", "Makefile"):
        digest.update((ROOT / name).read_bytes())
    return digest.hexdigest()[:16]


def user_env() -> dict[str, str]:
    """This process's environment as a user's shell has it: the dev venv neither active nor on PATH,
    and no stack settings a test run may have exported."""
    dev_bins = {str(ROOT / ".venv" / "bin"), os.environ.get("VIRTUAL_ENV", "") + "/bin"}
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "REDIS_URL", "MODEL")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p not in dev_bins)
    return env


def readme_venv() -> Path:
    """The venv's directory, made (or brought up to date) by `make install-serve VENV=<it>`; one
    process at a time builds it, the others wait for it."""
    VENVS.mkdir(parents=True, exist_ok=True)
    venv = VENVS / venv_key()
    with (VENVS / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for old in VENVS.iterdir():
            if old.is_dir() and old != venv:
                shutil.rmtree(old)
        if venv.exists() and not (venv / MARKER).exists():
            shutil.rmtree(venv)  # a build cut short: start again from an empty folder
        done = subprocess.run(
            ["make", "install-serve", f"VENV={venv}"],
            cwd=ROOT,
            env=user_env(),
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT_S,
        )
        assert done.returncode == 0, f"make install-serve failed:\n{done.stdout}\n{done.stderr}"
    return venv
