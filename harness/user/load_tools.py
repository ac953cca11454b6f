"""guidellm and aiperf, the load-testing tools docs/api.md gives commands for, in a venv of their own.

Their pins conflict with the dev venv's (aiperf wants older transformers, pandas, huggingface_hub,
rich, ...), so they get a venv without the system's site packages, kept in build/load-tools/<key> (the
key a hash of the pins and the torch build): a second test run reuses it, a clean clone builds it once
(about 70 s here, pip's cache warm). guidellm requires torch: the dev venv's own build (`+cpu` here) is
installed first, by its exact version, so that no resolver picks the multi-GB CUDA one from PyPI.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path

from harness.processes.services import ROOT

TOOLS = ("guidellm==0.8.1", "aiperf==0.13.0")
VENVS = ROOT / "build" / "load-tools"
BUILD_TIMEOUT_S = 900.0
MARKER = ".installed"  # written once every install finished


def venv_key(torch: str) -> str:
    return hashlib.sha256("\n".join([*TOOLS, torch]).encode()).hexdigest()[:16]


def pip(venv: Path, *args: str) -> None:
    done = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-compile", *args],
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
    )
    assert done.returncode == 0, f"pip install {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"


def load_tools_bin() -> Path:
    """The venv's bin folder, holding `guidellm` and `aiperf`; one process at a time builds it."""
    torch = f"torch=={version('torch')}"  # e.g. torch==2.13.0+cpu: that build or none
    index = os.environ.get("TORCH_INDEX_URL")  # as the Makefile's, where the build comes from there
    VENVS.mkdir(parents=True, exist_ok=True)
    venv = VENVS / venv_key(torch)
    with (VENVS / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for old in VENVS.iterdir():
            if old.is_dir() and old != venv:
                shutil.rmtree(old)
        if not (venv / MARKER).exists():
            shutil.rmtree(venv, ignore_errors=True)  # a build cut short starts again from nothing
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
            pip(venv, torch, *(["--index-url", index] if index else []))
            pip(venv, *TOOLS)
            (venv / MARKER).touch()
    return venv / "bin"


@contextlib.contextmanager
def tool_session(
    args: list[str], cwd: Path, env: dict[str, str], log: Path
) -> Iterator[subprocess.Popen[bytes]]:
    """A tool's process in a session of its own: aiperf runs a process per service, all ended with it."""
    with log.open("wb") as out:
        proc = subprocess.Popen(
            args, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            yield proc
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def run_tool(args: list[str], env: dict[str, str], log: Path, timeout_s: float) -> str:
    """Runs a tool from the repository root (where the docs' `models/demo` is) until it exits; its output."""
    with tool_session(args, ROOT, env, log) as proc:
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            code = None
    output = log.read_text(errors="replace")
    status = f"still running after {timeout_s} s" if code is None else f"exited {code}"
    assert code == 0, f"{args[0]} {status}:\n{output[-6000:]}"
    return output
