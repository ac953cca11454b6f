"""Which cell a new request goes to, for a gateway that places requests in several (GATEWAY_CELLS).

The rule: the least loaded cell, load = the requests waiting and running in its batcher's stats hash,
among cells whose batcher refreshed that hash within `LIVE_WITHIN_S` (a cell whose batchers are all
gone receives nothing); ties go round-robin, so idle cells share the traffic. With no live cell the
first one gets the request, which waits there for a batcher. One round trip per cell, concurrently
(each cell's hash is in its own slot); a gateway of one cell asks nothing.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any

import redis.asyncio as aioredis

from common.streams import cell_keys

# A batcher refreshes its stats at least every worker check (0.5 s); its healthcheck allows 10 s.
LIVE_WITHIN_S = 10.0


class CellRouter:
    def __init__(self, cells: list[str]) -> None:
        self.cells = cells
        self._turn = itertools.count()  # round-robin among equally loaded cells

    async def place(self, redis: aioredis.Redis) -> str:
        """The cell for the next request."""
        if len(self.cells) == 1:
            return self.cells[0]
        loads = await asyncio.gather(*(self._load(redis, cell) for cell in self.cells))
        live = [(load, cell) for load, cell in zip(loads, self.cells, strict=True) if load is not None]
        if not live:
            return self.cells[0]
        least = min(load for load, _ in live)
        tied = [cell for load, cell in live if load == least]
        return tied[next(self._turn) % len(tied)]

    @staticmethod
    async def _load(redis: aioredis.Redis, cell: str) -> float | None:
        """Waiting + running requests of the cell; None when its batcher is not alive."""
        raw: Any = await redis.hmget(cell_keys(cell).stats, ["num_waiting", "num_running", "updated_at"])
        waiting, running, updated_at = raw
        if updated_at is None or time.time() - float(updated_at) > LIVE_WITHIN_S:
            return None
        return float(waiting or 0) + float(running or 0)
