"""Code run in a fresh interpreter from the repository root, as a service's process starts: which heavy
libraries (torch, transformers) it loaded. Only the worker may load them; a process that imports one
by accident pays seconds and gigabytes at every start."""

from __future__ import annotations

import ast
import subprocess
import sys

from harness.processes.services import ROOT

HEAVY = ("torch", "transformers")
_REPORT = f"\nimport sys as _sys\nprint('heavy:', sorted(m for m in {HEAVY!r} if m in _sys.modules))\n"


def heavy_imports(code: str, *argv: str, timeout: float = 120.0) -> list[str]:
    """The heavy libraries loaded once `code` (given `argv`) has run; the run must succeed."""
    done = subprocess.run(
        [sys.executable, "-c", code + _REPORT, *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    report = next(line for line in done.stdout.splitlines() if line.startswith("heavy: "))
    return list(ast.literal_eval(report.removeprefix("heavy: ")))
