"""Follow deadlines keep followed requests alive; held in Redis, so that they outlive this process.

Every request a client follows through this gateway (stream, non-streaming wait, resume) has a
deadline in its cell's follow-deadline sorted set (`llm:{cell}:follow:deadlines`), pushed forward every second
while the client is there. When the client leaves, the deadline becomes now + the resume window; a
resuming client, through any gateway, pushes it forward again. If this gateway dies, its deadlines
simply stop moving. Either way the active batcher aborts a request whose deadline has passed, so an abandoned
request stops within the window even when the gateway that saw its client leave is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Coroutine
from typing import Any

import redis.asyncio as aioredis
import redis.exceptions

from common.streams import cell_keys, cell_of

logger = logging.getLogger(__name__)

REFRESH_INTERVAL_S = 1.0
# A deadline is never nearer than this, so a gateway starved of CPU for a moment or retrying through
# a short Redis outage does not lose its requests; it bounds how long a dead gateway's requests run
# on when there is no resume window (GATEWAY_RESUME_GRACE_S=0).
MIN_DEADLINE_S = 10.0
_BATCH = 500  # members per ZADD


class FollowDeadlines:
    def __init__(self, redis: aioredis.Redis, ahead_s: float) -> None:
        self._redis = redis
        self.ahead_s = max(ahead_s, MIN_DEADLINE_S)  # how far ahead a followed request's deadline is kept
        self._held: dict[str, int] = {}  # req_id -> followers in this gateway
        self._ended: set[str] = set()  # held requests a follower here saw end
        self._task: asyncio.Task[None] | None = None
        self._writes: set[asyncio.Task[None]] = set()
        # Writes reach Redis in the order they were asked: a hold's first write and the forget of a
        # request that ended right after must not swap (they could, on two pooled connections).
        self._ordered = asyncio.Lock()

    def hold(self, req_id: str) -> None:
        """A client of this gateway follows `req_id`: keep it alive (first write at once)."""
        self._held[req_id] = self._held.get(req_id, 0) + 1
        self._write(self._extend({req_id: time.time() + self.ahead_s}))
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._refresh_forever())

    def release(self, req_id: str, *, ended: bool, grace_s: float = 0.0) -> None:
        """This follower stopped: the request ended (forget it), or the client left (window of grace_s)."""
        if ended and req_id in self._held:
            self._ended.add(req_id)
        left = self._held.get(req_id, 0) - 1
        if left > 0:
            self._held[req_id] = left
            return  # another client of this gateway still follows it
        self._held.pop(req_id, None)
        # A resumed client may see the end before the one that left notices it is gone: still ended.
        if ended or req_id in self._ended:
            self._ended.discard(req_id)
            self._write(self._forget(req_id))
        else:
            self._write(self._cut(req_id, time.time() + grace_s))

    async def close(self) -> None:
        """Stop refreshing; the deadlines in Redis pass by themselves (a resume elsewhere renews them)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._writes:
            await asyncio.wait(set(self._writes), timeout=5.0)

    async def _refresh_forever(self) -> None:
        while self._held:
            await asyncio.sleep(REFRESH_INTERVAL_S)
            deadline = time.time() + self.ahead_s
            await self._extend(dict.fromkeys(self._held, deadline), create=False)

    async def _extend(self, deadlines: dict[str, float], create: bool = True) -> None:
        # GT: a refresh never moves a deadline back. XX for refreshes: one computed just before its
        # request ended and was forgotten must not bring the deadline back. One ZADD per cell: each
        # cell has its own set.
        by_cell: dict[str, list[tuple[str, float]]] = {}
        for req_id, deadline in deadlines.items():
            by_cell.setdefault(cell_of(req_id), []).append((req_id, deadline))
        try:
            for cell, items in by_cell.items():
                key = cell_keys(cell).follow_deadlines
                for start in range(0, len(items), _BATCH):
                    batch = dict(items[start : start + _BATCH])
                    await self._redis.zadd(key, batch, gt=True, xx=not create)
        except redis.exceptions.RedisError as exc:
            logger.warning("could not renew %d follow deadlines: %s", len(deadlines), exc)

    async def _cut(self, req_id: str, deadline: float) -> None:
        # Not GT: the window starts now. A follower still reading elsewhere pushes it forward again
        # within a refresh interval, before any window of a second or more has run out.
        try:
            await self._redis.zadd(cell_keys(cell_of(req_id)).follow_deadlines, {req_id: deadline}, xx=True)
        except redis.exceptions.RedisError as exc:
            logger.warning("could not start the resume window of %s: %s", req_id, exc)

    async def _forget(self, req_id: str) -> None:
        try:
            await self._redis.zrem(cell_keys(cell_of(req_id)).follow_deadlines, req_id)
        except redis.exceptions.RedisError as exc:
            logger.warning("could not drop the follow deadline of %s: %s", req_id, exc)

    def _write(self, coro: Coroutine[Any, Any, None]) -> None:
        # Fire and forget, but kept referenced: a cancelled stream cannot await in its finally.
        task = asyncio.get_running_loop().create_task(self._in_order(coro))
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    async def _in_order(self, write: Coroutine[Any, Any, None]) -> None:
        async with self._ordered:  # FIFO: tasks reach it in the order they were created
            await write
