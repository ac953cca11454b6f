"""The CPU decode-attention kernel alone (`cbserve_cpu.paged_decode_attention`), against a copy.

    python -m benchmarks.worker_step.decode_attention --threads 2 --rounds 7

Times decode attention over batches of sequences whose K/V lie in random blocks of a float32 pool,
in the order the worker passes them (longest context first), one call per layer of `--layers` (each
its own pool, as in a model, so that the K/V come from memory, not from the last-level cache), and
reports the K/V bytes read per second next to a large tensor copy measured in the same process. The
batches: equal contexts, contexts spread over a wide range (where splitting the work evenly by count
leaves one thread the long ones), a few sequences, and one.
"""

from __future__ import annotations

import argparse
import itertools
import random
import statistics
import time
from collections.abc import Callable

import torch

from benchmarks.worker_step.decode_roofline import copy_bandwidth

BLOCK_SIZE = 16


def batches(seed: int) -> dict[str, list[int]]:
    rng = random.Random(seed)
    return {
        "16 x 200": [200] * 16,
        "16 in [50, 700]": sorted((rng.randint(50, 700) for _ in range(16)), reverse=True),
        "16 in [500, 2000]": sorted((rng.randint(500, 2000) for _ in range(16)), reverse=True),
        "4 in [300, 600]": [600, 500, 400, 300],
        "1 x 500": [500],
    }


def kernel_call(lens: list[int], heads: int, kv_heads: int, head_dim: int) -> Callable[[], None]:
    """One layer's decode attention over `lens`, its blocks scattered over its own pool."""
    num_blocks = [-(-n // BLOCK_SIZE) for n in lens]
    total = sum(num_blocks)
    k_pool = torch.randn(total, BLOCK_SIZE, kv_heads, head_dim)
    v_pool = torch.randn(total, BLOCK_SIZE, kv_heads, head_dim)
    scattered = torch.randperm(total).to(torch.int32)
    tables = torch.zeros(len(lens), max(num_blocks), dtype=torch.int32)
    start = 0
    for b, n in enumerate(num_blocks):
        tables[b, :n] = scattered[start : start + n]
        start += n
    query = torch.randn(len(lens), heads, head_dim)
    out = torch.empty_like(query)
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    query_start_loc = torch.arange(len(lens) + 1, dtype=torch.int32)
    scale = head_dim**-0.5
    op = torch.ops.cbserve_cpu.paged_decode_attention
    return lambda: op(out, query, k_pool, v_pool, tables, seq_lens, query_start_loc, scale)


def in_turn(calls: list[Callable[[], None]]) -> Callable[[], None]:
    """One call of `calls` at a time, each in turn."""
    turn = itertools.cycle(calls)
    return lambda: next(turn)()


def time_call(call: Callable[[], None], rounds: int, calls: int) -> float:
    """Median seconds per call over `rounds` rounds of `calls` calls."""
    for _ in range(calls):
        call()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            call()
        times.append((time.perf_counter() - start) / calls)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.worker_step.decode_attention", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=50, help="calls per round")
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--layers", type=int, default=8, help="pools the calls go round (a model's layers)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    from gpu_worker.kernels import cpu as cpu_kernels

    if not cpu_kernels.load():
        raise SystemExit("the CPU kernels did not build (see the warning above)")
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    copy = copy_bandwidth(torch.device("cpu"), 256 << 20, repeats=5)
    print(f"copy {copy / 1e9:.1f} GB/s ({args.threads} threads); {args.heads} heads of {args.head_dim}")
    print(f"{'contexts':20s} {'us/layer':>9s} {'K/V GB/s':>9s} {'of copy':>8s}")
    for name, lens in batches(args.seed).items():
        layers = [kernel_call(lens, args.heads, args.kv_heads, args.head_dim) for _ in range(args.layers)]
        seconds = time_call(in_turn(layers), args.rounds, args.calls)
        rate = sum(lens) * args.kv_heads * args.head_dim * 4 * 2 / seconds
        print(f"{name:20s} {seconds * 1e6:9.1f} {rate / 1e9:9.1f} {rate / copy:8.0%}")


if __name__ == "__main__":
    main()
