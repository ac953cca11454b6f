"""The CPU GEMM paths a worker step could take, side by side at the step's shapes.

    python -m benchmarks.worker_step.gemm_paths --hidden 768 --intermediate 2048 --vocab 32000 --rows 16,512

For each linear shape of a Llama layer (q/k/v merged, o, gate/up merged, down, lm_head) and each row
count: torch's `F.linear` (MKL on this build), oneDNN's packed fp32 linear (the weight reordered once
at load, as inductor's freezing does) and int8 `torch._int_mm` with per-token activation scales (the
worker's WORKER_QUANTIZATION=int8), in one process, rounds alternating; ms per call and GFLOP/s, and
each path's largest difference from `F.linear`.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from gpu_worker.runner.forward.linear import quantize_int8_rows


def _time_ms(call: Callable[[], torch.Tensor], repeats: int) -> float:
    call()
    started = time.perf_counter()
    for _ in range(repeats):
        call()
    return 1000 * (time.perf_counter() - started) / repeats


def paths(x: torch.Tensor, weight: torch.Tensor) -> dict[str, Callable[[], torch.Tensor]]:
    packed = torch.ops.mkldnn._reorder_linear_weight(weight, x.shape[0])
    w8, w_scale = quantize_int8_rows(weight)
    w8_t = w8.t().contiguous()

    def int8() -> torch.Tensor:
        x8, x_scale = quantize_int8_rows(x)
        return torch._int_mm(x8, w8_t).float() * x_scale.view(-1, 1) * w_scale.view(1, -1)

    return {
        "F.linear (mkl)": lambda: torch.nn.functional.linear(x, weight),
        "onednn packed": lambda: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], ""),
        "int8 _int_mm": int8,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.worker_step.gemm_paths", description=__doc__)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--intermediate", type=int, default=2048)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--rows", default="16,512")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    h, i = args.hidden, args.intermediate
    shapes = {
        "qkv": (3 * h, h),
        "o": (h, h),
        "gate_up": (2 * i, h),
        "down": (h, i),
        "lm_head": (args.vocab, h),
    }
    generator = torch.Generator().manual_seed(0)
    print(f"{args.threads} threads; ms per call, median of {args.rounds} rounds [min-max], GFLOP/s")
    for rows in (int(r) for r in args.rows.split(",")):
        for name, (out_features, in_features) in shapes.items():
            x = torch.randn(rows, in_features, generator=generator)
            weight = torch.randn(out_features, in_features, generator=generator) * in_features**-0.5
            calls = paths(x, weight)
            reference = calls["F.linear (mkl)"]()
            times: dict[str, list[float]] = {path: [] for path in calls}
            for r in range(args.rounds):
                for path in calls if r % 2 == 0 else reversed(list(calls)):
                    times[path].append(_time_ms(calls[path], args.repeats))
            flops = 2 * rows * in_features * out_features
            cells = []
            for path, call in calls.items():
                ms = statistics.median(times[path])
                error = (call() - reference).abs().max().item()
                cells.append(
                    f"{path} {ms:.2f} [{min(times[path]):.2f}-{max(times[path]):.2f}] "
                    f"{flops / ms / 1e6:.0f} GF/s (max diff {error:.1e})"
                )
            print(f"{rows:>4} x {name:<8} {in_features}->{out_features}: " + " | ".join(cells))


if __name__ == "__main__":
    main()
