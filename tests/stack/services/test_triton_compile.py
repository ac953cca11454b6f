"""The Triton kernels compile for a GPU, every variant flag on and off, on this machine without one.

The CPU suite runs the kernels under Triton's interpreter, which takes the while-loop form of the key
loop and forgives what the compiler refuses (a kernel reading a plain Python global, say); this
compiles the form the GPU runs (harness/gpu_worker/triton_compile.py; the LoRA kernels:
harness/gpu_worker/triton_compile_lora.py), in a process of its own because the interpreter is on in
this one. In tests/stack/ as the compiled forward is: compiling all twenty-five takes about
half a minute on two cores."""

from __future__ import annotations

import os
import subprocess
import sys

from harness.processes.services import ROOT


def compile_in_a_process(module: str) -> list[str]:
    """The lines `python -m <module>` prints with the interpreter off."""
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    done = subprocess.run(
        [sys.executable, "-m", module], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stdout.splitlines()


def test_kernels_compile_for_a_hopper_gpu() -> None:
    compiled = compile_in_a_process("harness.gpu_worker.triton_compile")
    # The prefill kernel and the decode kernel over one segment and over eight, every flag, and the merge.
    assert len(compiled) == 3 * 8 + 1 and all(line.startswith("compiled ") for line in compiled)
    assert "compiled prefill window=True softcap=True sinks=True" in compiled
    assert "compiled decode_split window=True softcap=True sinks=True" in compiled
    assert compiled[-1] == "compiled merge"


def test_lora_kernels_compile_for_a_hopper_gpu() -> None:
    assert compile_in_a_process("harness.gpu_worker.triton_compile_lora") == [
        f"compiled lora {kernel} {dtype}" for dtype in ("bf16", "fp32") for kernel in ("shrink", "expand")
    ]
