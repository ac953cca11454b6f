"""One Triton kernel launched and checked: whether this host can build and run Triton's launcher.

    python -m benchmarks.gpu.triton_probe --device cuda      # exit 0 and "triton ok" when it can

benchmarks/gpu/toolchain.sh runs it (the C-compiler and Python.h checks come first); on cpu it runs
under TRITON_INTERPRET=1, which checks the script itself, not the launcher.
"""

from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl


@triton.jit
def _add_one(x_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(x_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) + 1, mask=mask)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args(argv)
    x = torch.zeros(100, device=args.device)
    _add_one[(1,)](x, 100, BLOCK=128)
    if args.device.startswith("cuda"):
        torch.cuda.synchronize()
    assert float(x.sum()) == 100.0, "the kernel ran but wrote the wrong values"
    print("triton ok")


if __name__ == "__main__":
    main()
