"""Riding out a Redis outage: capped exponential backoff, and a wait until Redis answers again.

Every service treats a Redis that is down, restarting or still loading its AOF as a pause: it retries
with a delay that doubles from 0.1 s to 2 s (no busy loop while Redis is down, and at most 2 s of
extra pause once it is back). redis-py's own retries are off (common/redis_io/redis_conn.py), so an outage
reaches this code, which knows which calls are safe to repeat.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

import redis
import redis.exceptions

# What "Redis is not there right now" looks like; BusyLoadingError (AOF loading) is a ConnectionError.
# On a Redis Cluster, during a master's failover: CLUSTERDOWN (every node refuses commands while a
# slot has no master), TRYAGAIN, and a slot the client's map lacks. None ran the command. redis-py
# retries them for about a second, less than a failover takes.
REDIS_DOWN: tuple[type[Exception], ...] = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    redis.exceptions.ClusterDownError,
    redis.exceptions.TryAgainError,
    redis.exceptions.SlotNotCoveredError,
)

T = TypeVar("T")

INITIAL_DELAY_S = 0.1
MAX_DELAY_S = 2.0


@dataclass(slots=True)
class Backoff:
    """Delays 0.1, 0.2, 0.4 ... capped at 2 s; `reset` once a call succeeds."""

    initial_s: float = INITIAL_DELAY_S
    max_s: float = MAX_DELAY_S
    num_failures: int = field(default=0, init=False)

    def next_delay(self) -> float:
        delay = min(self.max_s, self.initial_s * 2**self.num_failures)
        self.num_failures += 1
        return delay

    def reset(self) -> None:
        self.num_failures = 0

    @property
    def failing(self) -> bool:
        return self.num_failures > 0


def wait_for_redis(
    client: redis.Redis, stop: threading.Event, backoff: Backoff | None = None, key: str | None = None
) -> bool:
    """PING with backoff until Redis answers (True) or `stop` is set (False). With `key`, a read of
    it instead: on a cluster, its slot's master must answer, not any node (a failover in progress)."""
    backoff = backoff or Backoff()
    while not stop.is_set():
        try:
            client.ping() if key is None else client.exists(key)
            return True
        except REDIS_DOWN:
            stop.wait(backoff.next_delay())
    return False


async def retry_async(call: Callable[[], Awaitable[T]], within_s: float) -> T:
    """`call()` again with backoff while Redis is down, for up to `within_s`; then its last error.

    Only for calls that are safe to repeat: a call whose reply was lost may have run already.
    """
    backoff = Backoff()
    deadline = time.monotonic() + within_s
    while True:
        try:
            return await call()
        except REDIS_DOWN:
            delay = backoff.next_delay()
            if time.monotonic() + delay > deadline:
                raise
            await asyncio.sleep(delay)
