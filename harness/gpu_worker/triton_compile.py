"""Compile the paged-attention kernels for a GPU target on a machine without one, as the GPU would
run them: the for-loop form of the key loop that Triton's interpreter never runs, every variant flag.

Triton's frontend and the ptxas its wheel ships need no device. Run with TRITON_INTERPRET=0 (under
the interpreter `@triton.jit` makes functions it cannot compile):
`TRITON_INTERPRET=0 python -m harness.gpu_worker.triton_compile`
(tests/stack/services/test_triton_compile.py).
Prints one line per kernel compiled.
"""

from __future__ import annotations

import itertools
import re
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from gpu_worker.kernels.triton import paged_attention, paged_decode

TARGET = GPUTarget("cuda", 90, 32)  # Hopper
INT_POINTERS = ("block_tables_ptr", "seq_lens_ptr", "query_start_loc_ptr")
FLOAT_POINTERS = ("part_out_ptr", "part_m_ptr", "part_l_ptr")  # the split decode's scratch
FLOATS = ("qk_scale", "softcap")
SHARED = {"QUERIES_PER_KV": 4, "HEAD_DIM": 64, "BLOCK_SIZE": 16, "HEAD_DIM_PAD": 64, "TILE": 32}
# The decode kernel as Llama-3-8B's shape gets it (4-way GQA, 8 kv heads: 4 a program, 8 keys each
# a step), checked to spill no register (it spilled 8 KB with 32 keys each).
DECODE = {"NUM_HEADS": 32, "GROUPS": 4, "BLOCK_M": 16, "TILE": 8, "HEAD_DIM": 128, "HEAD_DIM_PAD": 128}
# The prefill launch of the attention kernel, and the decode kernel over one segment and over eight.
KERNELS: dict[str, tuple[Any, dict[str, Any]]] = {
    "prefill": (paged_attention._paged_attention_kernel, {"BLOCK_M": 64, "BLOCK_Q": 16}),
    "decode": (paged_decode._paged_decode_kernel, {**DECODE, "NUM_SEGMENTS": 1}),
    "decode_split": (paged_decode._paged_decode_kernel, {**DECODE, "NUM_SEGMENTS": 8}),
}
MERGE = {"NUM_HEADS": 32, "HEAD_DIM": 64, "HEAD_DIM_PAD": 64, "NUM_SEGMENTS": 8, "SEGMENTS_PAD": 8}


def signature(kernel: Any, constants: dict[str, Any]) -> dict[str, str]:
    """bf16 pools and activations, int32 tables and lengths, float32 scalars, int32 strides."""

    def kind(name: str) -> str:
        if name in constants:
            return "constexpr"
        if name.endswith("_ptr"):
            return "*i32" if name in INT_POINTERS else "*fp32" if name in FLOAT_POINTERS else "*bf16"
        return "fp32" if name in FLOATS else "i32"

    return {name: kind(name) for name in kernel.arg_names}


def spilled_bytes(ptx: str) -> int:
    """The bytes of registers spilled to memory (stores), as the wheel's ptxas reports them."""
    ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "kernel.ptx"
        source.write_text(ptx)
        done = subprocess.run(
            [str(ptxas), "-v", "--gpu-name=sm_90a", str(source), "-o", str(Path(tmp) / "kernel.cubin")],
            capture_output=True,
            text=True,
            check=True,
        )
    found = re.search(r"(\d+) bytes spill stores", done.stderr)
    assert found is not None, done.stderr
    return int(found.group(1))


def main() -> None:
    for (name, (kernel, own)), flags in itertools.product(
        KERNELS.items(), itertools.product([False, True], repeat=3)
    ):
        window, softcap, sinks = flags
        constants = {
            **SHARED,
            **own,
            "DOT_PRECISION": "tf32",
            "WHILE_LOOP": False,
            "HAS_WINDOW": window,
            "HAS_SOFTCAP": softcap,
            "HAS_SINKS": sinks,
        }
        compiled = triton.compile(ASTSource(kernel, signature(kernel, constants), constants), target=TARGET)
        assert compiled.asm["cubin"], name
        if kernel is paged_decode._paged_decode_kernel:
            assert spilled_bytes(compiled.asm["ptx"]) == 0, f"{name} {flags} spills registers"
        print(f"compiled {name} window={window} softcap={softcap} sinks={sinks}")
    merge = paged_decode._merge_kernel
    assert triton.compile(ASTSource(merge, signature(merge, MERGE), MERGE), target=TARGET).asm["cubin"]
    print("compiled merge")


if __name__ == "__main__":
    main()
