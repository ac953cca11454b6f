"""What GET /health checks: 200 only while the gateway's requests can be served.

Redis answers and takes writes (a small SET: a full Redis under `noeviction`, a read-only replica or a
failed RDB save refuse it) and has the headroom admission keeps (GATEWAY_REDIS_MEMORY_HEADROOM of its
`maxmemory` free), and for every model served, a batcher of one of its cells has published its stats
recently or holds its lease (common/redis_io/batcher_liveness.py), and a worker of them heartbeats.
Each failure is a 503 naming which, never an internal address. A cell with no batcher stats, no lease
and no registered worker (a new Redis, one restarted without AOF, a test driving the protocol by hand)
is not judged on its batcher.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import redis.exceptions

from common.redis_io.batcher_liveness import BATCHER_SILENT_S, batcher_state
from common.redis_io.redis_refusal import refuses_writes
from common.streams import cell_keys
from gateway.app_state import GatewayState
from gateway.limits.redis_memory import memory_use
from openai_frontend.protocol.errors import RETRY_AFTER_S

__all__ = ["BATCHER_SILENT_S", "Health", "check"]

# A probe must answer quickly even when Redis hangs.
REDIS_TIMEOUT_S = 2.0


@dataclass(frozen=True, slots=True)
class Health:
    status_code: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)


def unavailable(status: str, reason: str, message: str) -> Health:
    """A 503 naming what is missing; every one says when to look again, as the API's 503s do."""
    headers = {"Retry-After": str(RETRY_AFTER_S)}
    return Health(503, {"status": status, "reason": reason, "message": message}, headers)


async def check(state: GatewayState) -> Health:
    try:
        async with asyncio.timeout(REDIS_TIMEOUT_S):
            return await _check(state)
    except redis.exceptions.ResponseError as exc:
        if not refuses_writes(exc):
            raise
        message = "redis refuses writes (full under maxmemory, or read-only): new requests are refused"
        return unavailable("unavailable", "redis_refuses_writes", message)
    except (redis.exceptions.RedisError, TimeoutError):
        return unavailable("degraded", "redis_unreachable", "degraded: redis unreachable")


async def _check(state: GatewayState) -> Health:
    for router in state.routers.values():
        await router.refresh(state.redis)
    cells = state.cells
    await state.redis.set(cell_keys(cells[0]).gateway_health(), "1", px=5000)
    now = time.time()
    timeout_s = state.settings.heartbeat_timeout_s
    cutoff_ms = int((now - timeout_s) * 1000)
    alive: dict[str, int] = {}  # per cell: workers heartbeating
    batchers: dict[str, str] = {}  # per cell: the state of its batcher
    memory = []  # per cell: its Redis lacks the headroom admission keeps
    for cell in cells:  # every cell it places in
        keys = cell_keys(cell)
        alive[cell] = int(await state.redis.zcount(keys.heartbeat, f"({cutoff_ms}", "+inf"))
        batchers[cell] = await batcher_state(state.redis, cell)
        memory.append((await memory_use(state.redis, cell)).over(state.settings.redis_memory_headroom))
    if all(memory):
        message = "redis is nearly full (less than its headroom of maxmemory free): new requests are refused"
        return unavailable("unavailable", "redis_nearly_full", message)
    # Each model is judged on its own cells: one whose cells have no batcher or no worker cannot serve.
    several = len(state.routers) > 1
    for name, router in state.routers.items():
        of_model = f" for model {name!r}" if several else ""
        states = {batchers[c] for c in router.cells}
        if "gone" in states and "live" not in states:
            message = f"no batcher has published{of_model} in the last {BATCHER_SILENT_S:g} s"
            return unavailable("unavailable", "no_batcher", message)
        if not sum(alive[c] for c in router.cells):
            message = f"no worker heartbeat{of_model} in the last {timeout_s:g} s"
            return unavailable("unavailable", "no_worker", message)
    return Health(200, {"status": "ok", "num_workers": sum(alive.values())})
