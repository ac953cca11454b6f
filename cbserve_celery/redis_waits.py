"""A Celery task's call repeated, in the task, while Redis (the store and the broker) fails it.

Celery's own `self.retry()` publishes the retry through the broker: with Redis away that publish fails,
Celery turns the failure into `Reject(requeue=False)`, and the task's message is gone. So a task
rides the outage out where it runs, with the services' backoff (0.1 s doubling to 2 s,
common/redis_io/retry.py), and gives up only after `within_s` of failures.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

import kombu.exceptions
import redis.exceptions

from common.redis_io.retry import Backoff

logger = logging.getLogger(__name__)

T = TypeVar("T")

# Redis down, restarting, loading its AOF or refusing writes, seen by our own client or by kombu's
# publish (which wraps the connection error in OperationalError after its own few retries).
REDIS_FAILED: tuple[type[Exception], ...] = (redis.exceptions.RedisError, kombu.exceptions.OperationalError)


def retry_while_redis_fails(call: Callable[[], T], within_s: float, what: str) -> T:
    """`call()` until it returns; again after a backoff delay while Redis fails it, for up to
    `within_s` from the first failure; then its last error. Only for calls safe to repeat."""
    backoff = Backoff()
    deadline: float | None = None
    while True:
        try:
            result = call()
        except REDIS_FAILED as exc:
            delay = backoff.next_delay()
            now = time.monotonic()
            if deadline is None:
                deadline = now + within_s
                logger.warning("%s: Redis failed it (%s); trying again for up to %.0f s", what, exc, within_s)
            if now + delay > deadline:
                logger.error("%s: Redis failed it for %.0f s; giving up", what, within_s)
                raise
            time.sleep(delay)
            continue
        if deadline is not None:
            logger.info("%s: done after Redis came back", what)
        return result
