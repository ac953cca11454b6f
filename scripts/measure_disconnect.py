"""How many steps a request still takes after its client hangs up, with no resume window.

    python -m scripts.measure_disconnect                        # 50 disconnects, 16 background streams
    python -m scripts.measure_disconnect --async-scheduling --disconnects 100

Starts a private redis-server, the batcher, one worker and the gateway (`GATEWAY_RESUME_GRACE_S=0`,
vLLM's immediate abort) on the tests' tiny model. `--background` greedy streams keep the batch busy
throughout. Then, one at a time, a streaming client reads a random number of tokens and closes its
connection; the batcher's inbox, where the gateway's abort lands among the workers' step results
(harness/load/disconnect_probe.py), says how many steps still computed the request after the hang-up and
after the abort reached the batcher, and how many ms those took. Prints a JSON summary (p50, p90,
max); exits 1 if a request took a step scheduled after its abort was read (more steps after the abort
than can be in flight: 1, or 2 with async scheduling).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
from pathlib import Path
from typing import Any

import httpx
import redis

from harness.load.disconnect_probe import Departure, aborted, inbox_tail_id, settle, trace
from harness.load.load_clients import completion_body, stream
from harness.processes.private_stack import private_stack
from harness.processes.services import wait_for

ROOT = Path(__file__).resolve().parent.parent

MAX_TOKENS = 400


async def keep_busy(base_url: str, prompt: list[int], stop: asyncio.Event) -> int:
    """One background client: stream request after request until told to stop; returns how many."""
    num = 0
    async with httpx.AsyncClient(base_url=base_url, timeout=120) as client:
        while not stop.is_set():
            await stream(client, completion_body(prompt, 200, stream=True))
            num += 1
    return num


async def depart(args: argparse.Namespace, base_url: str, r: redis.Redis, rng: random.Random) -> Departure:
    since = inbox_tail_id(r)
    prompt = [rng.randrange(3, 500) for _ in range(rng.randrange(4, 24))]
    async with httpx.AsyncClient(base_url=base_url, timeout=120) as client:
        body = completion_body(prompt, MAX_TOKENS, stream=True)
        out = await stream(client, body, hang_up_after=rng.randrange(1, args.max_tokens_before))
    assert out.left_at is not None, f"the stream ended before the hang-up: {out}"
    await asyncio.to_thread(wait_for, lambda: aborted(r, out.req_id), 60, "the abort", 0.005)
    await asyncio.to_thread(settle, r)
    return trace(r, out.req_id, out.left_at, since)


def _percentiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "p50": statistics.median(ordered),
        "p90": ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))],
        "max": ordered[-1],
    }


async def measure(args: argparse.Namespace, base_url: str, redis_url: str) -> dict[str, Any]:
    r = redis.Redis.from_url(redis_url)
    rng = random.Random(0)
    stop = asyncio.Event()
    background = [
        asyncio.create_task(keep_busy(base_url, [rng.randrange(3, 500) for _ in range(8)], stop))
        for _ in range(args.background)
    ]
    departures = [await depart(args, base_url, r, rng) for _ in range(args.disconnects)]
    stop.set()
    await asyncio.gather(*background)
    in_flight = 2 if args.async_scheduling else 1
    abort_ms = [float(d.abort_after_ms) for d in departures if d.abort_after_ms is not None]
    last_ms = [float(d.last_step_after_ms) for d in departures if d.last_step_after_ms is not None]
    return {
        "disconnects": len(departures),
        "background_streams": args.background,
        "async_scheduling": args.async_scheduling,
        "steps_after_hang_up": _percentiles([float(d.steps_after_leaving) for d in departures]),
        "steps_after_abort_read": _percentiles([float(d.steps_after_abort) for d in departures]),
        "ms_hang_up_to_abort_in_inbox": _percentiles(abort_ms),
        "ms_hang_up_to_last_step": _percentiles(last_ms),
        "ms_per_step": _percentiles([d.step_ms for d in departures if d.step_ms is not None]),
        "steps_in_flight_bound": in_flight,
        "ok": len(abort_ms) == len(departures) and all(d.steps_after_abort <= in_flight for d in departures),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--disconnects", type=int, default=50)
    parser.add_argument("--background", type=int, default=16, help="streams keeping the batch busy")
    parser.add_argument("--max-tokens-before", type=int, default=40, help="hang up after 1..this tokens")
    parser.add_argument("--async-scheduling", action="store_true", help="BATCHER_ASYNC_SCHEDULING=true")
    parser.add_argument("--model", type=Path, help="model directory (default: build the tests' tiny model)")
    args = parser.parse_args()
    batcher_env = {"BATCHER_ASYNC_SCHEDULING": str(args.async_scheduling).lower()}
    gateway_env = {"GATEWAY_RESUME_GRACE_S": "0"}
    with private_stack(args.model, batcher_env=batcher_env, gateway_env=gateway_env) as stack:
        summary = asyncio.run(measure(args, stack.base_url, stack.redis_url))
    print(json.dumps(summary, indent=2))
    sys.exit(0 if summary["ok"] else 1)


if __name__ == "__main__":
    main()
