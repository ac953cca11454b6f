"""Control-plane cost per iteration: the whole pipeline with a null model (no forward pass).

With `--real-model` the forward runs too, which shows how much of that cost async scheduling hides.
With `--device-step-ms N` the null model's steps take N ms of a simulated device's time, during which
the host is free (WORKER_NULL_MODEL_STEP_MS): how much of the host's work runs beside a GPU's.

    python -m benchmarks.pipeline.control_plane --model models/tiny-llama --batch-sizes 1,16,64 \
        --output-len 200

For each batch size B it starts the pipeline (redis-server, batcher, one worker with
WORKER_NULL_MODEL=true, gateway), sends B concurrent requests of `--output-len` tokens (ignore_eos),
and reads the batcher's counters before and after: wall time per iteration (the client's, and the
steady state's: the step counter's rate in the middle of the run), the worker's time per
step (input building and bookkeeping, no model), how long the worker waited between steps, and the
CPU time each process (gateway, batcher, worker, redis) spent per iteration, once with synchronous
scheduling and once with async scheduling (step N+1 sent while step N runs).

With `--cells 8 --workers-per-cell 4` (batch size = per worker) it runs 8 cells of 4 null workers on
one Redis behind `--gateways` gateways and reports CPU per step and per token by cell
(benchmarks/pipeline/control_plane_cells.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import redis

from benchmarks.load.specs import LaunchSpec
from benchmarks.load.systems import (
    CLOCK_TICKS_PER_S,
    ProcessGroup,
    cpu_seconds,
    free_port,
    http_ok,
    wait_until,
)
from benchmarks.pipeline import control_plane_cells
from common import streams


class _StepSampler(threading.Thread):
    """Polls the batcher's step counter during the load, for the steady-state iteration period.

    The client's wall time per step also counts submitting B requests and collecting B responses,
    which happen once, not per iteration; the middle of the run has only iterations in it.
    """

    def __init__(self, redis_url: str, interval_s: float = 0.02) -> None:
        super().__init__(daemon=True)
        self._redis = redis.Redis.from_url(redis_url)
        self._interval_s = interval_s
        self._done = threading.Event()
        self.samples: list[tuple[float, float]] = []  # (perf_counter, num_steps)

    def run(self) -> None:
        while not self._done.wait(self._interval_s):
            steps = self._redis.hget(streams.BATCHER_STATS, "num_steps")
            self.samples.append((time.perf_counter(), float(steps or 0)))

    def finish(self) -> float:
        """Stops polling; ms per iteration between 20% and 80% of the steps taken."""
        self._done.set()
        self.join()
        if len(self.samples) < 2:
            return float("nan")  # a load shorter than two polls
        first, last = self.samples[0][1], self.samples[-1][1]
        low, high = first + 0.2 * (last - first), first + 0.8 * (last - first)
        window = [(t, s) for t, s in self.samples if low <= s <= high] or self.samples
        (t0, s0), (t1, s1) = window[0], window[-1]
        return 1000 * (t1 - t0) / (s1 - s0) if s1 > s0 else float("nan")


def _stats(redis_url: str) -> dict[str, float]:
    raw: Any = redis.Redis.from_url(redis_url).hgetall(streams.BATCHER_STATS)
    return {k.decode(): float(v) for k, v in raw.items() if not k.startswith(b"num_steps:")}


async def _load(base_url: str, batch_size: int, output_len: int) -> float:
    body = {"prompt": [7, 8, 9, 10], "max_tokens": output_len, "temperature": 0, "ignore_eos": True}
    async with httpx.AsyncClient(base_url=base_url, timeout=600) as client:
        start = time.perf_counter()
        responses = await asyncio.gather(
            *(client.post("/v1/completions", json=body) for _ in range(batch_size))
        )
        elapsed = time.perf_counter() - start
    for r in responses:
        r.raise_for_status()
    return elapsed


def measure(
    model: str,
    batch_size: int,
    output_len: int,
    async_scheduling: bool,
    null_model: bool,
    log_dir: Path,
    device: str = "cpu",
    num_gateways: int = 1,
    device_step_ms: float = 0.0,
) -> dict[str, Any]:
    from benchmarks.load.systems import _start_cbserve

    env = {
        "WORKER_NULL_MODEL": "true" if null_model else "false",
        "WORKER_NUM_THREADS": "1",
        "WORKER_MAX_NUM_SEQS": str(max(batch_size, 1)),
        "WORKER_MAX_NUM_BATCHED_TOKENS": str(max(batch_size * 4, 64)),
        "BATCHER_ASYNC_SCHEDULING": "true" if async_scheduling else "false",
        "WORKER_NULL_MODEL_STEP_MS": str(device_step_ms),
    }
    if device != "cpu":
        env["WORKER_NUM_BLOCKS"] = "4096"  # plenty for B x output_len; no need to claim the whole GPU
    group = ProcessGroup(f"null-b{batch_size}-{'async' if async_scheduling else 'sync'}", log_dir, env)
    port = free_port()
    try:
        options = {"workers": 1, "device": device, "gateways": num_gateways}
        _start_cbserve(group, LaunchSpec(kind="cbserve", options=options), model, port)
        base_url = f"http://127.0.0.1:{port}"
        wait_until(lambda: http_ok(f"{base_url}/health"), 120, "/health", group)
        assert group.redis_url is not None
        asyncio.run(_load(base_url, batch_size, 4))  # warm-up: connections, first allocations
        before = _stats(group.redis_url)
        cpu_before = cpu_seconds(group)
        sampler = _StepSampler(group.redis_url)
        sampler.start()
        elapsed = asyncio.run(_load(base_url, batch_size, output_len))
        steady_ms = sampler.finish()
        cpu_after = cpu_seconds(group)
        after = _stats(group.redis_url)
    finally:
        group.stop()
    steps = after["num_steps"] - before["num_steps"]
    return {
        "null_model": null_model,
        "device": device,
        "device_step_ms": device_step_ms,
        "batch_size": batch_size,
        "gateways": num_gateways,
        "async_scheduling": async_scheduling,
        "steps": int(steps),
        "tokens": batch_size * output_len,
        "ms_per_iteration": 1000 * elapsed / steps,
        "steady_ms_per_iteration": steady_ms,
        "worker_step_ms": 1000 * (after["worker_busy_s"] - before["worker_busy_s"]) / steps,
        "worker_idle_ms_per_step": 1000 * (after["worker_idle_s"] - before["worker_idle_s"]) / steps,
        # Steps the worker launched while the one before still ran on the device.
        "steps_overlapped": int(after.get("num_steps_overlapped", 0) - before.get("num_steps_overlapped", 0)),
        "tokens_per_s": batch_size * output_len / elapsed,
        # Over the whole load (submission and collection included), per iteration.
        "cpu_ms_per_iteration": {
            name: 1000 * (cpu_after[name] - seconds) / steps
            for name, seconds in cpu_before.items()
            if name in cpu_after
        },
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.pipeline.control_plane", description=__doc__)
    parser.add_argument(
        "--model", required=True, help="any model directory (only its tokenizer and config matter)"
    )
    parser.add_argument("--batch-sizes", default="1,16,64")
    parser.add_argument("--output-len", type=int, default=200)
    parser.add_argument(
        "--real-model",
        action="store_true",
        help="run the model's forward too: shows how much of that cost async scheduling hides",
    )
    parser.add_argument("--device", default="cpu", help="the worker's device with --real-model (cpu, cuda)")
    parser.add_argument(
        "--device-step-ms",
        type=float,
        default=0.0,
        help="the null model's steps take this long on a simulated device, the host free meanwhile",
    )
    parser.add_argument(
        "--scheduling", choices=["both", "sync", "async"], default="both", help="which modes to measure"
    )
    parser.add_argument(
        "--cells", type=int, default=1, help="> 1: that many cells on one Redis (control_plane_cells.py)"
    )
    parser.add_argument("--workers-per-cell", type=int, default=1, help="null workers per cell, with --cells")
    parser.add_argument(
        "--gateways",
        type=int,
        default=None,
        help="gateways: on one port for one cell (default 1), each placing in all cells with --cells "
        "(default 2)",
    )
    parser.add_argument("--result-file", default=None)
    parser.add_argument("--log-dir", default=None, help="keep the processes' logs here (default: a temp dir)")
    args = parser.parse_args(argv)
    if args.cells > 1 and args.real_model:
        parser.error("--cells measures the null-model worker only")
    if args.device_step_ms and (args.real_model or args.cells > 1):
        parser.error("--device-step-ms simulates the device of one cell's null-model worker")
    # A SIGTERM must still stop the pipeline each measurement started (their `finally`).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    rows = []
    with tempfile.TemporaryDirectory(prefix="control-plane-") as tmp_dir:
        tmp = args.log_dir or tmp_dir
        for batch_size in (int(b) for b in args.batch_sizes.split(",")):
            modes = {"both": (False, True), "sync": (False,), "async": (True,)}[args.scheduling]
            for async_scheduling in modes:
                if args.cells > 1:
                    rows.append(
                        control_plane_cells.measure_cells(
                            args.model,
                            args.cells,
                            args.workers_per_cell,
                            args.gateways or 2,
                            batch_size,
                            args.output_len,
                            async_scheduling,
                            Path(tmp),
                        )
                    )
                    control_plane_cells.print_report(rows[-1])
                    continue
                null = not args.real_model
                rows.append(
                    measure(
                        args.model,
                        batch_size,
                        args.output_len,
                        async_scheduling,
                        null,
                        Path(tmp),
                        args.device,
                        args.gateways or 1,
                        args.device_step_ms,
                    )
                )
    if args.result_file:
        Path(args.result_file).write_text(json.dumps(rows, indent=2))
    if args.cells > 1:
        return  # each printed as it finished
    columns = [("batch", 5), ("scheduling", 10), ("steps", 6), ("ms/iter", 8), ("steady", 7)]
    columns += [("worker ms", 9), ("idle ms", 8), ("tok/s", 8)]
    print(" ".join(f"{name:>{width}}" for name, width in columns))
    for r in rows:
        mode = "async" if r["async_scheduling"] else "sync"
        print(
            f"{r['batch_size']:>5} {mode:>10} {r['steps']:>6} {r['ms_per_iteration']:>8.3f} "
            f"{r['steady_ms_per_iteration']:>7.3f} "
            f"{r['worker_step_ms']:>9.3f} {r['worker_idle_ms_per_step']:>8.3f} {r['tokens_per_s']:>8.0f}"
        )
    # A share below one clock tick per load reads as 0.
    tick_ms = 1000 / CLOCK_TICKS_PER_S
    print(f"CPU ms per iteration, by process (the load's CPU time / its steps; {tick_ms:.0f} ms ticks):")
    for r in rows:
        mode = "async" if r["async_scheduling"] else "sync"
        shares = "  ".join(f"{name} {ms:.2f}" for name, ms in r["cpu_ms_per_iteration"].items())
        print(f"{r['batch_size']:>5} {mode:>10}  {shares}")


if __name__ == "__main__":
    main()
