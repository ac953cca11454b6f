"""`python -m gpu_worker` with a model its forward cannot run exits at once with a code and one clear
message naming the architecture and the reason.

Before, Falcon and StableLM (whose decoder layers drop the attention context) and a DeepSeek-V3 model
with values as wide as its keys' RoPE part passed the load check, loaded their weights and crashed in
the profiling step, after one traceback per profiled request and advice to lower WORKER_MAX_NUM_SEQS.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.gpu_worker.test_model_support import REFUSED, save_tiny

ROOT = Path(__file__).resolve().parents[3]
# A deadline for the process, not a timing: loading torch and transformers takes seconds on a busy
# host, the profiling step it no longer reaches took minutes.
EXIT_DEADLINE_S = 120
MAX_OUTPUT_LINES = 20


@pytest.mark.parametrize("case", ["falcon", "stablelm", "deepseek-v3-mla"])
def test_the_worker_refuses_the_model_and_exits(tmp_path: Path, redis_url: str, case: str) -> None:
    make_config, named = REFUSED[case]
    model_dir = save_tiny(tmp_path / case, make_config())
    env = {**os.environ, "REDIS_URL": redis_url, "WORKER_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "gpu_worker", "--model", str(model_dir), "--device", "cpu"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=EXIT_DEADLINE_S,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 2, output
    assert "cannot start worker" in output and "not supported" in output, output
    for words in named:
        assert words in output, output
    assert "Traceback" not in output and len(output.splitlines()) <= MAX_OUTPUT_LINES, output
