"""The batch reaper: queues again an active batch that no `cbserve.run_batch` task holds.

A batch runs as a chain of tasks (batch_task.py), each queueing the next before its own message is
acknowledged, and a task rides a Redis outage out where it runs (redis_waits.py). What that leaves
uncovered: a task that gave up after `CBSERVE_CELERY_BATCH_REDIS_WAIT_S` and whose message was then
acknowledged, or a batch recorded by the gateway whose message Redis lost. Such a batch is active with
no claim (no task runs it) and no message in the broker (none queued or delivered: broker_scan.py).
Every `interval_s` one Celery worker looks (the first to set the turn key), and a batch found so on
two looks in a row is queued again. A second task for a batch is harmless: its claim lets one run it.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from typing import Any

import redis.asyncio as aioredis
from celery import Celery

from cbserve_celery.broker_scan import batches_in_broker
from cbserve_celery.redis_waits import REDIS_FAILED
from common.redis_io.periodic import Periodic
from common.redis_io.redis_conn import as_str, connect_async
from common.streams import ACTIVE_BATCHES, BATCH_REAPER_TURN, ORPHANED_BATCHES, batch_claim
from openai_frontend.batch.objects import ACTIVE, RUN_BATCH_TASK
from openai_frontend.batch.store import BatchStore

logger = logging.getLogger(__name__)


class BatchReaper(Periodic):
    def __init__(self, app: Celery, redis_url: str, interval_s: float) -> None:
        super().__init__("batch reaper", interval_s, REDIS_FAILED)
        self._app = app
        self._redis_url = redis_url
        self._queues = [str(app.conf.task_default_queue)]

    def tick(self) -> list[str]:
        """One look, if it is this worker's turn: the ids of the batches it queued again."""
        orphans = asyncio.run(self._look())
        for batch_id in orphans:
            self._app.send_task(RUN_BATCH_TASK, args=[batch_id])
            logger.warning("batch %s: no task held it, queued or running; queued it again", batch_id)
        return orphans

    async def _look(self) -> list[str]:
        redis = connect_async(self._redis_url)
        try:
            turn_ms = int(self._interval_s * 1000)
            if not await redis.set(BATCH_REAPER_TURN, secrets.token_hex(4), nx=True, px=turn_ms):
                return []  # another worker looked less than an interval ago
            return await _orphans_seen_twice(redis, self._queues)
        finally:
            await redis.aclose()


async def _orphans_seen_twice(redis: aioredis.Redis, queues: list[str]) -> list[str]:
    """The active batches no task holds now, nor held at the previous look; it forgets ended ones."""
    raw_ids: Any = await redis.zrange(ACTIVE_BATCHES, 0, -1)
    ids = [as_str(i) for i in raw_ids]
    if not ids:
        return []
    statuses = await BatchStore(redis).statuses(ids)
    active = [i for i, status in zip(ids, statuses, strict=True) if status in ACTIVE]
    ended = [i for i, status in zip(ids, statuses, strict=True) if status not in ACTIVE]
    async with redis.pipeline(transaction=False) as pipe:
        for batch_id in active:
            pipe.exists(batch_claim(batch_id))
        claimed = await pipe.execute()
    unclaimed = {i for i, held in zip(active, claimed, strict=True) if not held}
    orphans = unclaimed - await batches_in_broker(redis, queues, unclaimed) if unclaimed else set()
    seen: Any = await redis.hmget(ORPHANED_BATCHES, sorted(orphans)) if orphans else []
    twice = sorted(i for i, at in zip(sorted(orphans), seen, strict=True) if at is not None)
    async with redis.pipeline(transaction=True) as pipe:
        if ended:
            pipe.zrem(ACTIVE_BATCHES, *ended)
        # Forget what is held now, ended, or queued again below; remember the first look of the rest.
        forget = [i for i in ids if i not in orphans] + twice
        if forget:
            pipe.hdel(ORPHANED_BATCHES, *forget)
        first = [i for i in orphans if i not in twice]
        if first:
            pipe.hset(ORPHANED_BATCHES, mapping={i: time.time() for i in first})
        await pipe.execute()
    return twice
