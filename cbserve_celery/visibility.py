"""Heartbeats for the deliveries a Celery worker holds, so that a short visibility timeout is safe.

kombu's Redis transport keeps each unacknowledged delivery in the sorted set `unacked_index`, scored by
the time it was delivered, and hands back to the queue every delivery older than the visibility
timeout. Alone, that timeout must outlast the longest task, or a running task is delivered again; and
a task whose worker died waits out all of it (an hour). This thread moves the score of every delivery
this worker holds (running, or reserved: an ETA task) to now, every `interval_s`: a live worker's
tasks are never delivered again, a dead worker's come back one timeout after its last beat.
"""

from __future__ import annotations

import time

import redis
from celery.worker import state

from cbserve_celery.redis_waits import REDIS_FAILED
from common.redis_io.periodic import Periodic

# kombu's names for the sorted set and for the hash of the deliveries themselves (its
# `unacked_index_key` and `unacked_key` transport options).
UNACKED_INDEX_KEY = "unacked_index"
UNACKED_KEY = "unacked"


def held_delivery_tags() -> list[str]:
    """The delivery tags of the requests this worker process has reserved or is running."""
    requests = [*state.reserved_requests, *state.active_requests]  # weak sets: copy before iterating
    tags = {r.message.delivery_tag for r in requests if r.message is not None}
    return sorted(str(tag) for tag in tags if tag is not None)


class DeliveryHeartbeat(Periodic):
    def __init__(self, client: redis.Redis, interval_s: float, key: str = UNACKED_INDEX_KEY) -> None:
        super().__init__("delivery-heartbeat", interval_s, REDIS_FAILED)
        self._client = client
        self._key = key

    def tick(self) -> int:
        """Move every held delivery's score to now; XX: one acked or handed back meanwhile stays gone."""
        tags = held_delivery_tags()
        if not tags:
            return 0
        now = time.time()
        return int(self._client.zadd(self._key, dict.fromkeys(tags, now), xx=True, ch=True) or 0)
