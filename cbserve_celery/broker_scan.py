"""Which batches have a `cbserve.run_batch` message in Celery's Redis broker, queued or delivered.

kombu's Redis transport keeps a queue as a list (`LPUSH`ed, `BRPOP`ed; one list per priority step) and
every delivered, unacknowledged message in the hash `unacked` until it is acknowledged (a running task,
an ETA task a worker holds). The queue is read before `unacked`: a message taken off it meanwhile is
in `unacked` by then. One moving at that moment (popped and not yet recorded, or handed back to the
queue) can be missed; the reaper acts only on a batch missed on two looks in a row.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable
from typing import Any

import redis.asyncio as aioredis

from cbserve_celery.visibility import UNACKED_KEY
from openai_frontend.batch.objects import RUN_BATCH_TASK

# kombu's Redis transport: its priority steps, and the separator of a priority's list name.
_PRIORITY_STEPS = (0, 3, 6, 9)
_PRIORITY_SEP = "\x06\x16"
_CHUNK = 500  # messages read per round trip


def queue_lists(queue: str) -> list[str]:
    """The Redis lists of one Celery queue (kombu's `_q_for_pri`)."""
    return [queue if pri == 0 else f"{queue}{_PRIORITY_SEP}{pri}" for pri in _PRIORITY_STEPS]


def batch_of(raw_message: Any) -> str | None:
    """The batch id a run_batch message (kombu's JSON envelope, body base64) is for; None otherwise."""
    try:
        headers = raw_message.get("headers") or {}
        if headers.get("task") != RUN_BATCH_TASK:
            return None
        body = raw_message["body"]
        if raw_message.get("properties", {}).get("body_encoding") == "base64":
            body = base64.b64decode(body)
        args = json.loads(body)[0]
        return str(args[0]) if args else None
    except (ValueError, TypeError, KeyError, IndexError, AttributeError):
        return None  # not a message of ours: nothing to find in it


async def batches_in_broker(redis: aioredis.Redis, queues: Iterable[str], wanted: set[str]) -> set[str]:
    """Those of `wanted` with a run_batch message in `queues` or in kombu's `unacked` hash."""
    found: set[str] = set()
    marker = RUN_BATCH_TASK.encode()
    for name in (name for queue in queues for name in queue_lists(queue)):
        start = 0
        while found != wanted:
            chunk: Any = await redis.lrange(name, start, start + _CHUNK - 1)
            if not chunk:
                break
            found |= {b for b in (batch_of(json.loads(m)) for m in chunk if marker in m) if b in wanted}
            start += len(chunk)
    cursor = 0
    while found != wanted:
        reply: Any = await redis.hscan(UNACKED_KEY, cursor, count=_CHUNK)
        cursor, entries = reply
        for raw in entries.values():
            if marker in raw:  # a delivery: [message, exchange, routing key]
                batch_id = batch_of(json.loads(raw)[0])
                if batch_id in wanted:
                    found.add(batch_id)
        if cursor == 0:
            break
    return found
