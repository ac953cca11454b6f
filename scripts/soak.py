"""Soak: minutes of steady load with random disconnects, then nothing may be left behind.

    python -m scripts.soak                                   # 5 minutes at 10 requests/s
    python -m scripts.soak --duration 180 --rate 8 --retention 10 --grace 2

Starts a private redis-server, the batcher, one worker and one gateway on the tests' tiny model with
`CBSERVE_RETENTION_S=--retention` and `GATEWAY_RESUME_GRACE_S=--grace`, and runs harness/load/soak_load.py:
a steady rate of streaming and non-streaming requests, some clients hanging up and resuming by id
(`Last-Event-ID`), some abandoning their requests. Every answer read to its end must be whole
(exactly `max_tokens` token ids, no error). Then it waits out the grace and retention windows and
checks that no per-request key, stream entry or pending entry is left, that the batcher has nothing
running or waiting, and that Redis's keys are back within `--keys-slack-kib` of where they started.
Prints a JSON summary (with the gateway's RSS and Redis's memory every 30 s); exits 1 on any failure
or leftover.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import redis

from harness.load.leftovers import Snapshot, batcher_stats, wait_cleared
from harness.load.memory_sampler import MemorySampler
from harness.load.soak_load import soak
from harness.processes.private_stack import private_stack

ROOT = Path(__file__).resolve().parent.parent

_COUNTERS = ("num_finished", "num_aborted", "num_failed", "num_preemptions")


async def run(args: argparse.Namespace, base_url: str, redis_url: str, gateway_pid: int) -> dict[str, Any]:
    r = redis.Redis.from_url(redis_url)
    baseline = Snapshot.take(r, gateway_pid)
    sampler = MemorySampler(redis_url, gateway_pid, period_s=1.0)
    stop = asyncio.Event()
    sampling = asyncio.create_task(sampler.run(stop))
    started = time.monotonic()
    report = await soak(base_url, args.duration, args.rate, args.grace, seed=args.seed)
    load_s = round(time.monotonic() - started, 1)
    stop.set()
    await sampling
    after_load = Snapshot.take(r, gateway_pid)
    # Abandoned streams are aborted after the grace window; then everything goes within retention.
    cleared_after_s = await asyncio.to_thread(wait_cleared, r, args.grace + args.retention + 60)
    after = Snapshot.take(r, gateway_pid)
    keys_growth = after.keys_bytes - baseline.keys_bytes
    return {
        "duration_s": args.duration,
        "load_s": load_s,
        "rate_per_s": args.rate,
        "grace_s": args.grace,
        "retention_s": args.retention,
        **report.summary(),
        "memory_every_30s": sampler.rows,
        "gateway_rss_mib": {
            "baseline": round((baseline.rss_kib or 0) / 1024, 1),
            "peak": round(sampler.peak_rss_kib / 1024, 1),
            "after": round((after.rss_kib or 0) / 1024, 1),
        },
        "redis_used_memory_mib": {
            "baseline": round(baseline.memory["used_memory"] / 2**20, 2),
            "peak": round(sampler.peak_redis.get("used_memory", 0) / 2**20, 2),
            "after": round(after.memory["used_memory"] / 2**20, 2),
        },
        "redis_keys_kib": {"baseline": baseline.keys_bytes // 1024, "after": after.keys_bytes // 1024},
        "redis_step_trace_kib": after.trace_bytes // 1024,
        "leftovers_after_load": {k: v for k, v in after_load.leftovers.items() if v},
        "leftovers_after_retention": {k: v for k, v in after.leftovers.items() if v},
        "cleared_after_s": cleared_after_s,
        "batcher_stats": {k: int(v) for k, v in batcher_stats(r).items() if k in _COUNTERS},
        "ok": not report.failures
        and cleared_after_s is not None
        and keys_growth < args.keys_slack_kib * 1024,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--duration", type=float, default=300.0, help="seconds of load")
    parser.add_argument("--rate", type=float, default=10.0, help="requests started per second")
    parser.add_argument("--grace", type=float, default=2.0, help="GATEWAY_RESUME_GRACE_S")
    parser.add_argument("--retention", type=int, default=10, help="CBSERVE_RETENTION_S")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", type=Path, help="model directory (default: build the tests' tiny model)")
    parser.add_argument(
        "--keys-slack-kib", type=int, default=64, help="Redis keys may end this much above baseline"
    )
    args = parser.parse_args()
    env = {"CBSERVE_RETENTION_S": str(args.retention)}
    with private_stack(args.model, env=env, gateway_env={"GATEWAY_RESUME_GRACE_S": str(args.grace)}) as stack:
        summary = asyncio.run(run(args, stack.base_url, stack.redis_url, stack.procs["gateway"].pid))
    print(json.dumps(summary, indent=2))
    sys.exit(0 if summary["ok"] else 1)


if __name__ == "__main__":
    main()
