"""A builder of the CPU kernels killed mid-build (a SIGKILLed worker) must not stop every later start:
torch leaves its `lock` file behind, and waits on it for ever."""

from __future__ import annotations

import subprocess
import sys

from gpu_worker.kernels import cpu as cpu_kernels
from harness.processes.services import ROOT


def test_a_lock_left_by_a_killed_builder_does_not_hold_up_the_next() -> None:
    directory = cpu_kernels.build_directory()
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "lock").touch()  # what torch's FileBaton leaves when its holder is killed
    done = subprocess.run(
        [sys.executable, "-m", "gpu_worker.kernels.cpu"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "built" in done.stdout
    assert not (directory / "lock").exists()
