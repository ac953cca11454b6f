"""Heartbeats for the deliveries a Celery worker holds, so that a short visibility timeout is safe.

kombu's Redis transport keeps each unacknowledged delivery in the sorted set `unacked_index`, scored by
the time it was delivered, and hands back to the queue every delivery older than the visibility
timeout. Alone, that timeout must outlast the longest task, or a running task is delivered again; and
a task whose worker died waits out all of it (an hour). This thread moves the score of every delivery
this worker holds (running, or reserved: an ETA task) to now, every `interval_s`: a live worker's
tasks are never delivered again, a dead worker's come back one timeout after its last beat.
"""

from __future__ import annotations

import logging
import threading
import time

import redis
from celery.worker import state

logger = logging.getLogger(__name__)

# kombu's name for the sorted set (its `unacked_index_key` transport option).
UNACKED_INDEX_KEY = "unacked_index"


def held_delivery_tags() -> list[str]:
    """The delivery tags of the requests this worker process has reserved or is running."""
    requests = [*state.reserved_requests, *state.active_requests]  # weak sets: copy before iterating
    tags = {r.message.delivery_tag for r in requests if r.message is not None}
    return sorted(str(tag) for tag in tags if tag is not None)


class DeliveryHeartbeat:
    def __init__(self, client: redis.Redis, interval_s: float, key: str = UNACKED_INDEX_KEY) -> None:
        self._client = client
        self._interval_s = interval_s
        self._key = key
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="delivery-heartbeat", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5.0)

    def beat(self) -> int:
        """Move every held delivery's score to now; XX: one acked or handed back meanwhile stays gone."""
        tags = held_delivery_tags()
        if not tags:
            return 0
        now = time.time()
        return int(self._client.zadd(self._key, dict.fromkeys(tags, now), xx=True, ch=True) or 0)

    def _run(self) -> None:
        failing = False
        while not self._stop.wait(self._interval_s):
            try:
                self.beat()
                if failing:
                    logger.info("delivery heartbeats restored")
                failing = False
            except redis.RedisError as exc:  # the broker is away: the consumer reconnects on its own
                if not failing:
                    logger.warning("delivery heartbeat failed: %s", exc)
                failing = True
