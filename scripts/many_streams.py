"""1,000 concurrent SSE streams against one gateway process; memory bounded; nothing left behind.

    python -m scripts.many_streams                                  # 1,000 streams x 2 waves
    python -m scripts.many_streams --streams 200 --waves 1 --max-tokens 16
    python -m scripts.many_streams --base-url http://127.0.0.1:8000 --redis-url redis://127.0.0.1:6379/0 \
        --gateway-pid 1234 --retention 900                          # a running stack instead

Unless given a running stack, starts a private redis-server, the batcher, one worker and ONE
gateway process (as the tests do) on the tests' tiny model, with `CBSERVE_RETENTION_S` set to
`--retention`. Each wave opens `--streams` streaming completions at once (greedy, `ignore_eos`,
`--max-tokens` each) and checks that every one ends with `[DONE]`, no error, and exactly
`--max-tokens` token ids. Meanwhile it samples the gateway's RSS (/proc/PID/status) and Redis's
`INFO memory`. After the last wave it waits for the retention window to pass and for every
per-request key, stream entry and pending entry to be gone, then measures memory again: Redis's
keys (`MEMORY USAGE` summed) must be back within `--keys-slack-kib` of where they started. Prints a
JSON summary; exits 1 if a stream was not whole or anything was left behind.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import resource
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import redis

from harness.load.leftovers import Snapshot, rss_kib, wait_cleared
from harness.load.load_clients import Outcome, completion_body, stream
from harness.load.memory_sampler import MemorySampler
from harness.processes.private_stack import private_stack

ROOT = Path(__file__).resolve().parent.parent

MIB = 1024 * 1024


@dataclass
class Target:
    base_url: str
    redis_url: str
    gateway_pid: int | None


def raise_fd_limit() -> int:
    """1,000 streams are 1,000 sockets in this process and in the gateway (which inherits it)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


@contextlib.contextmanager
def own_stack(args: argparse.Namespace) -> Iterator[Target]:
    # The queue bound would refuse part of a burst this size: the point here is to hold it.
    gateway_env = {"GATEWAY_MAX_QUEUED_REQUESTS": "0"}
    env = {
        "CBSERVE_RETENTION_S": str(args.retention),
        "WORKER_MAX_NUM_SEQS": str(args.max_num_seqs),
        "WORKER_MAX_NUM_BATCHED_TOKENS": str(max(2048, args.max_num_seqs)),
    }
    with private_stack(args.model, env=env, gateway_env=gateway_env) as stack:
        yield Target(stack.base_url, stack.redis_url, stack.procs["gateway"].pid)


async def wave(base_url: str, prompts: list[list[int]], max_tokens: int) -> tuple[list[Outcome], int]:
    """Open every stream at once; returns what each client saw and the most open at one time."""
    num_open = peak = 0

    async def one(client: httpx.AsyncClient, prompt: list[int]) -> Outcome:
        nonlocal num_open, peak
        num_open += 1
        peak = max(peak, num_open)
        try:
            return await stream(client, completion_body(prompt, max_tokens, stream=True))
        except httpx.HTTPError as exc:
            return Outcome(errors=[repr(exc)])
        finally:
            num_open -= 1

    limits = httpx.Limits(max_connections=len(prompts) + 16, max_keepalive_connections=len(prompts) + 16)
    timeout = httpx.Timeout(600.0, connect=60.0, pool=60.0)
    async with httpx.AsyncClient(base_url=base_url, limits=limits, timeout=timeout) as client:
        outcomes = await asyncio.gather(*(one(client, p) for p in prompts))
    return list(outcomes), peak


def _mib(kib: int | None) -> float | None:
    return None if kib is None else round(kib / 1024, 1)


async def run(args: argparse.Namespace, target: Target) -> dict[str, Any]:
    r = redis.Redis.from_url(target.redis_url)
    rng = random.Random(0)
    prompts = [[rng.randrange(3, 500) for _ in range(rng.randrange(4, 24))] for _ in range(args.streams)]
    pid = target.gateway_pid
    baseline = Snapshot.take(r, pid)
    sampler = MemorySampler(target.redis_url, pid)
    stop = asyncio.Event()
    sampling = asyncio.create_task(sampler.run(stop))
    waves: list[dict[str, Any]] = []
    not_whole: list[Outcome] = []
    for _ in range(args.waves):
        started = time.monotonic()
        outcomes, peak_open = await wave(target.base_url, prompts, args.max_tokens)
        bad = [o for o in outcomes if not o.is_whole(args.max_tokens)]
        not_whole += bad
        seconds = round(time.monotonic() - started, 2)
        rss = _mib(rss_kib(pid)) if pid else None
        waves.append({"seconds": seconds, "whole": len(outcomes) - len(bad), "peak_open_streams": peak_open})
        waves[-1]["gateway_rss_mib_after"] = rss
    stop.set()
    await sampling
    after_load = Snapshot.take(r, pid)
    # Everything a request leaves expires or is trimmed one retention window after it ended.
    cleared_after_s = await asyncio.to_thread(wait_cleared, r, args.retention + 30)
    after = Snapshot.take(r, pid)
    keys_growth = after.keys_bytes - baseline.keys_bytes
    return {
        "streams": args.streams,
        "max_tokens": args.max_tokens,
        "waves": waves,
        "not_whole": len(not_whole),
        "not_whole_examples": [
            {"status": o.status, "tokens": len(o.token_ids), "errors": o.errors[:1]} for o in not_whole[:5]
        ],
        "retention_s": args.retention,
        "gateway_rss_mib": {
            "baseline": _mib(baseline.rss_kib),
            "peak": _mib(sampler.peak_rss_kib) if pid else None,
            "after_retention": _mib(after.rss_kib),
        },
        "redis_used_memory_mib": {
            "baseline": round(baseline.memory["used_memory"] / MIB, 2),
            "peak": round(sampler.peak_redis.get("used_memory", 0) / MIB, 2),
            "after_load": round(after_load.memory["used_memory"] / MIB, 2),
            "after_retention": round(after.memory["used_memory"] / MIB, 2),
        },
        # MEMORY USAGE of every key: the data alone, without the gateway's pooled connections.
        "redis_keys_kib": {
            "baseline": baseline.keys_bytes // 1024,
            "after_retention": after.keys_bytes // 1024,
        },
        "redis_step_trace_kib": after.trace_bytes // 1024,
        "redis_clients": {
            "peak": sampler.peak_redis.get("connected_clients", 0),
            "after_retention": after.memory["connected_clients"],
        },
        "leftovers_after_load": {k: v for k, v in after_load.leftovers.items() if v},
        "leftovers_after_retention": {k: v for k, v in after.leftovers.items() if v},
        "cleared_after_s": cleared_after_s,
        "ok": not not_whole and cleared_after_s is not None and keys_growth < args.keys_slack_kib * 1024,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument(
        "--waves", type=int, default=2, help="run the burst this many times (memory must not grow)"
    )
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--retention", type=int, default=10, help="CBSERVE_RETENTION_S of the stack started")
    parser.add_argument("--max-num-seqs", type=int, default=256, help="WORKER_MAX_NUM_SEQS")
    parser.add_argument("--model", type=Path, help="model directory (default: build the tests' tiny model)")
    parser.add_argument("--base-url", help="a running gateway instead of starting a stack")
    parser.add_argument("--redis-url", help="its Redis (with --base-url)")
    parser.add_argument("--gateway-pid", type=int, help="its pid, to sample RSS (with --base-url)")
    parser.add_argument(
        "--keys-slack-kib", type=int, default=64, help="Redis keys may end this much above baseline"
    )
    args = parser.parse_args()
    fd_limit = raise_fd_limit()
    if args.base_url:
        if not args.redis_url:
            parser.error("--base-url needs --redis-url")
        summary = asyncio.run(run(args, Target(args.base_url, args.redis_url, args.gateway_pid)))
    else:
        with own_stack(args) as target:
            summary = asyncio.run(run(args, target))
    summary["fd_limit"] = fd_limit
    print(json.dumps(summary, indent=2))
    sys.exit(0 if summary["ok"] else 1)


if __name__ == "__main__":
    main()
