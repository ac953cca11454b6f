"""Compile the LoRA shrink / expand kernels (gpu_worker/kernels/triton/lora.py) for a Hopper GPU on a
machine without one, as harness/gpu_worker/triton_compile.py does the attention kernels: bfloat16 and
float32 factors, a Llama-8B-sized layer. Run with TRITON_INTERPRET=0: `TRITON_INTERPRET=0 python -m
harness.gpu_worker.triton_compile_lora` (tests/stack/services/test_triton_compile.py). Prints one line per
kernel compiled.
"""

from __future__ import annotations

from typing import Any

import triton
from triton.compiler import ASTSource

from gpu_worker.kernels.triton import lora
from harness.gpu_worker.triton_compile import TARGET

INT_POINTERS = ("order_ptr", "starts_ptr", "counts_ptr")
FLOAT32_POINTERS = ("scale_ptr", "xa_ptr")  # and the shrink's output
RANK = 16


def signature(kernel: Any, constants: dict[str, Any], dtype: str, shrink: bool) -> dict[str, str]:
    """int32 token order and slot runs, float32 scales and shrink results, `dtype` activations and factors."""

    def kind(name: str) -> str:
        if name in constants:
            return "constexpr"
        if name in INT_POINTERS:
            return "*i32"
        if name in FLOAT32_POINTERS or (shrink and name == "out_ptr"):
            return "*fp32"
        return f"*{dtype}" if name.endswith("_ptr") else "i32"

    return {name: kind(name) for name in kernel.arg_names}


def main() -> None:
    tiles: dict[str, Any] = {"BLOCK_M": lora.BLOCK_M, "BLOCK_N": lora.BLOCK_N}
    for dtype, precision in (("bf16", "tf32"), ("fp32", "ieee")):
        shrink: dict[str, Any] = {
            **tiles,
            "IN_FEATURES": 4096,
            "N": 3 * RANK,
            "RANK": RANK,
            "BLOCK_K": lora.BLOCK_K,
        }
        expand: dict[str, Any] = {**tiles, "OUT_FEATURES": 14336, "RANK": RANK, "RANK_PAD": RANK}
        for name, kernel, constants in (
            ("shrink", lora._lora_shrink_kernel, shrink),
            ("expand", lora._lora_expand_kernel, expand),
        ):
            constants = {**constants, "DOT_PRECISION": precision}
            source = ASTSource(kernel, signature(kernel, constants, dtype, name == "shrink"), constants)
            compiled = triton.compile(source, target=TARGET)
            assert compiled.asm["cubin"], name
            print(f"compiled lora {name} {dtype}")


if __name__ == "__main__":
    main()
