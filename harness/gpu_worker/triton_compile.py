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
from typing import Any

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from gpu_worker.kernels.triton import paged_attention

TARGET = GPUTarget("cuda", 90, 32)  # Hopper
INT_POINTERS = ("block_tables_ptr", "seq_lens_ptr", "query_start_loc_ptr")
FLOATS = ("qk_scale", "softcap")
SHARED = {"QUERIES_PER_KV": 4, "HEAD_DIM": 64, "BLOCK_SIZE": 16, "HEAD_DIM_PAD": 64, "TILE": 32}
# The attention kernel as the decode and the prefill launches size it.
KERNELS: dict[str, tuple[Any, dict[str, Any]]] = {
    "decode": (paged_attention._paged_attention_kernel, {"BLOCK_M": 16, "BLOCK_Q": 4}),
    "prefill": (paged_attention._paged_attention_kernel, {"BLOCK_M": 64, "BLOCK_Q": 16}),
}


def signature(kernel: Any, constants: dict[str, Any]) -> dict[str, str]:
    """bf16 pools and activations, int32 tables and lengths, float32 scalars, int32 strides."""

    def kind(name: str) -> str:
        if name in constants:
            return "constexpr"
        if name.endswith("_ptr"):
            return "*i32" if name in INT_POINTERS else "*bf16"
        return "fp32" if name in FLOATS else "i32"

    return {name: kind(name) for name in kernel.arg_names}


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
        print(f"compiled {name} window={window} softcap={softcap} sinks={sinks}")


if __name__ == "__main__":
    main()
