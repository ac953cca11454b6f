"""How many cells, Redis shards and gateways a load needs, and which part runs out first.

    python -m benchmarks.pipeline.capacity --gpus 10,100,1000 --batch 64 --step-ms 20

Every control-plane process's CPU time per step is a fixed part plus a part per request in the step,
fitted to the CPU columns of `python -m benchmarks.pipeline.control_plane` (docs/benchmarks.md, "Control-plane
cost per iteration"; `--costs FILE` takes other measurements). A cell's batcher is one thread that
plans every step of every worker in the cell; a discrete-event simulation of that thread gives the
step period each worker sees, hence how many workers one cell keeps busy. Redis shards and gateways
are sized from the CPU the token rate costs them. docs/scaling.md explains the model and its limits.
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
from dataclasses import dataclass
from pathlib import Path

# CPU ms per iteration of each process at batch sizes 1, 16, 64, async scheduling, from
# `python -m benchmarks.pipeline.control_plane --model models/demo --batch-sizes 1,16,64 --output-len 300`
# (docs/benchmarks.md, the 2-core AMD EPYC host, all four processes on the same two cores).
MEASURED: dict[str, dict[int, float]] = {
    "redis": {1: 0.43, 16: 0.56, 64: 1.05},
    "batcher": {1: 0.73, 16: 1.02, 64: 1.64},
    "worker": {1: 0.87, 16: 1.25, 64: 2.37},
    "gateway": {1: 0.90, 16: 2.48, 64: 5.66},
}


@dataclass(frozen=True, slots=True)
class Cost:
    """CPU ms per step: `per_step` + `per_request` x the requests in the step."""

    per_step: float
    per_request: float

    def at(self, batch: int) -> float:
        return self.per_step + self.per_request * batch


def fit(points: dict[int, float]) -> Cost:
    """Least-squares line through (batch, ms) points."""
    xs, ys = list(points), list(points.values())
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    return Cost(per_step=my - slope * mx, per_request=slope)


@dataclass(frozen=True, slots=True)
class CellRun:
    workers: int
    period_ms: float  # mean time between two steps of one worker
    gpu_busy: float  # share of that period the GPU computes
    batcher_busy: float  # share of the time the batcher thread works


def simulate_cell(
    workers: int,
    step_ms: float,
    worker_ms: float,
    batcher_ms: float,
    async_scheduling: bool,
    steps: int = 400,
) -> CellRun:
    """One batcher thread (first come, first served) planning the steps of `workers` workers.

    A worker step takes `step_ms` on the GPU plus `worker_ms` of its own CPU (inputs, publish). In sync
    mode a worker's next step is planned only after its result arrives; with async scheduling step N+1
    is planned while step N runs (one step ahead, as BATCHER_ASYNC_SCHEDULING does), so the worker
    waits only when planning takes longer than the step. Worker starts are staggered over one step.
    """
    # Events: (time, seq, kind, worker). Kinds: "ask" (a plan is requested), "done" (a step ended).
    events: list[tuple[float, int, str, int]] = []
    seq = 0

    def push(t: float, kind: str, w: int) -> None:
        nonlocal seq
        heapq.heappush(events, (t, seq, kind, w))
        seq += 1

    batcher_free = 0.0
    batcher_work = 0.0
    plan_ready: dict[int, float] = {}  # worker -> when its next step's plan is in its stream
    running: dict[int, bool] = {}
    finished_steps = [0] * workers
    last_end = 0.0
    for w in range(workers):
        push(w * (step_ms + worker_ms) / workers, "ask", w)
        running[w] = False

    def start(w: int, now: float) -> None:
        running[w] = True
        push(now + step_ms + worker_ms, "done", w)
        if async_scheduling:
            push(now, "ask", w)  # plan the step after this one while it runs

    while events:
        now, _, kind, w = heapq.heappop(events)
        if kind == "ask":
            begin = max(now, batcher_free)
            batcher_free = begin + batcher_ms
            batcher_work += batcher_ms
            plan_ready[w] = batcher_free
            if not running[w]:
                push(batcher_free, "plan", w)
        elif kind == "plan":
            if not running[w] and w in plan_ready and plan_ready[w] <= now:
                del plan_ready[w]
                start(w, now)
        else:  # done
            running[w] = False
            finished_steps[w] += 1
            last_end = max(last_end, now)
            if finished_steps[w] >= steps:
                continue
            if async_scheduling and w in plan_ready:
                push(max(now, plan_ready[w]), "plan", w)
            elif not async_scheduling:
                push(now, "ask", w)
    period = last_end / steps
    return CellRun(workers, period, step_ms / period, min(1.0, batcher_work / last_end))


def workers_per_cell(
    step_ms: float,
    worker_ms: float,
    batcher_ms: float,
    async_scheduling: bool,
    min_gpu_busy: float,
    max_batcher_busy: float,
) -> tuple[int, CellRun]:
    """The most workers one cell keeps at least `min_gpu_busy` as busy as a cell of one worker, with
    its batcher at most `max_batcher_busy` busy (headroom for admission, aborts, recovery).
    Doubling, then bisection."""
    ideal = simulate_cell(1, step_ms, worker_ms, batcher_ms, async_scheduling).gpu_busy

    def ok(n: int) -> tuple[bool, CellRun]:
        run = simulate_cell(n, step_ms, worker_ms, batcher_ms, async_scheduling)
        return run.gpu_busy >= min_gpu_busy * ideal and run.batcher_busy <= max_batcher_busy, run

    good, good_run = 1, ok(1)[1]
    high = 2
    while ok(high)[0]:
        good, good_run = high, ok(high)[1]
        high *= 2
        if high > 1 << 16:
            return good, good_run
    low = good
    while high - low > 1:
        mid = (low + high) // 2
        passed, run = ok(mid)
        if passed:
            low, good_run = mid, run
        else:
            high = mid
    return low, good_run


@dataclass(frozen=True, slots=True)
class Plan:
    gpus: int
    tokens_per_s: float
    counts: dict[str, int]  # cells (one batcher each), Redis shards, gateway processes
    fullest: dict[str, float]  # each part's busiest instance, as a share of what it may take


def plan(
    gpus: int, batch: int, cell: CellRun, max_workers: int, per_gpu: dict[str, float], max_busy: float
) -> Plan:
    """The fewest of each part that serve `gpus` workers, and how full each then is."""
    loads = {"redis": gpus * per_gpu["redis"], "gateway": gpus * per_gpu["gateway"]}
    counts = {"cells": math.ceil(gpus / max_workers)}
    counts.update({name: math.ceil(load / max_busy) for name, load in loads.items()})
    fullest = {"cells": gpus / counts["cells"] / max_workers}
    fullest.update({name: load / counts[name] / max_busy for name, load in loads.items()})
    return Plan(gpus, gpus * 1000.0 / cell.period_ms * batch, counts, fullest)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--gpus", default="10,100,1000", help="deployment sizes, one worker per GPU")
    parser.add_argument("--batch", type=int, default=64, help="requests per worker step")
    parser.add_argument("--step-ms", type=float, default=20.0, help="the GPU's forward time per step")
    parser.add_argument("--sync", action="store_true", help="plan each step after the last result")
    parser.add_argument("--max-busy", type=float, default=0.7, help="most a single-threaded part may work")
    parser.add_argument("--min-gpu-busy", type=float, default=0.95, help="what a cell must leave its GPUs")
    parser.add_argument("--costs", type=Path, help="JSON {process: {batch: cpu_ms}} in place of MEASURED")
    parser.add_argument(
        "--cpu-scale", type=float, default=1.0, help="multiply every CPU cost (a faster host)"
    )
    args = parser.parse_args()

    raw = MEASURED if args.costs is None else json.loads(args.costs.read_text())
    costs = {
        name: Cost(
            fit({int(b): v for b, v in pts.items()}).per_step * args.cpu_scale,
            fit({int(b): v for b, v in pts.items()}).per_request * args.cpu_scale,
        )
        for name, pts in raw.items()
    }
    print("CPU ms per step = fixed + per request x batch (fitted):")
    for name, cost in costs.items():
        print(
            f"  {name:8s} {cost.per_step:6.3f} + {cost.per_request * 1000:6.1f} us x B"
            f"  -> {cost.at(args.batch):6.2f} ms at B={args.batch}"
        )
    batcher_ms, worker_ms = costs["batcher"].at(args.batch), costs["worker"].at(args.batch)
    max_workers, cell = workers_per_cell(
        args.step_ms, worker_ms, batcher_ms, not args.sync, args.min_gpu_busy, args.max_busy
    )
    mode = "sync" if args.sync else "async"
    print(
        f"\nOne cell ({mode} scheduling, {args.step_ms:g} ms GPU step, B={args.batch}): "
        f"at most {max_workers} workers keep their GPUs >= {args.min_gpu_busy:.0%} as busy as one does "
        f"(step period {cell.period_ms:.2f} ms, batcher {cell.batcher_busy:.0%} busy)."
    )
    steps_per_s = 1000.0 / cell.period_ms  # per GPU
    per_gpu = {name: steps_per_s * costs[name].at(args.batch) / 1000.0 for name in ("redis", "gateway")}
    limits = {
        "one cell's batcher": float(max_workers),
        "one Redis shard": args.max_busy / per_gpu["redis"],
        "one gateway": args.max_busy / per_gpu["gateway"],
    }
    print(
        "GPUs one of each part serves (at most {:.0%} busy): {}".format(
            args.max_busy, ", ".join(f"{k} {v:.1f}" for k, v in limits.items())
        )
    )
    print(f"first to run out: {min(limits, key=lambda k: limits[k])}")
    print(f"\n{'GPUs':>6} {'tok/s':>10} {'cells':>6} {'shards':>7} {'gateways':>9}  fullest part")
    for gpus in (int(g) for g in args.gpus.split(",")):
        p = plan(gpus, args.batch, cell, max_workers, per_gpu, args.max_busy)
        name = max(p.fullest, key=lambda k: p.fullest[k])
        c = p.counts
        print(
            f"{gpus:>6} {p.tokens_per_s:>10.0f} {c['cells']:>6} {c['redis']:>7} {c['gateway']:>9}  "
            f"{name} ({p.fullest[name]:.0%} of its limit)"
        )


if __name__ == "__main__":
    main()
