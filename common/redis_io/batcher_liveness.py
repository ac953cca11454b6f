"""Is a cell's batcher alive? Read by the gateway's /health, its admission and its followers.

The active batcher refreshes `updated_at` in its stats hash twice a second and holds its lease (a key
with a TTL of a few seconds, renewed with PEXPIRE even while Redis is full). A cell is:

- `live`: stats refreshed within `BATCHER_SILENT_S`, or a lease held (a leader that cannot write its
  stats because Redis refuses writes, or a new leader that has not written them yet);
- `gone`: stats older than that and no lease, or no stats at all while workers are registered in the
  cell (they wait for a batcher that never came: a gateway or workers started in the wrong cell);
- `unknown`: no stats, no lease, no registered worker: a new Redis, one restarted without AOF, or a
  test driving the protocol by hand. Not judged.
"""

from __future__ import annotations

import time
from typing import Any, Literal

import redis.asyncio as aioredis

from common.streams import cell_keys

# A batcher whose stats are this old and that holds no lease is gone. A live leader renews its lease
# every few seconds whatever it is doing, so this only has to outlast the lease TTL (5 s) after a
# death: /health says so within this many seconds of the last stats.
BATCHER_SILENT_S = 6.0

BatcherState = Literal["live", "gone", "unknown"]


async def batcher_state(redis: aioredis.Redis, cell: str) -> BatcherState:
    """The state of `cell`'s batcher, from one round trip (the cell's keys share a slot)."""
    keys = cell_keys(cell)
    async with redis.pipeline(transaction=False) as pipe:
        pipe.hget(keys.stats, "updated_at")
        pipe.exists(keys.lease)
        pipe.hlen(keys.workers)
        reply: Any = await pipe.execute()
    updated_at, leased, num_registered = reply
    return judge(updated_at, bool(leased), int(num_registered), time.time())


def judge(updated_at: bytes | str | None, leased: bool, num_registered: int, now: float) -> BatcherState:
    """The rule above, on what Redis answered."""
    if leased or (updated_at is not None and now - float(updated_at) < BATCHER_SILENT_S):
        return "live"
    if updated_at is not None or num_registered > 0:
        return "gone"
    return "unknown"
