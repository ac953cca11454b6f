"""The token streams a cell's reader follows only to their end (vLLM's `RequestOutputKind.FINAL_ONLY`).

A non-streaming answer needs no token before the last one, so its follower is not fed by the shared
per-step read (token_mux.py): that costs the gateway a reply parse, a queue hand-off and a wake-up per
request per step. Instead the cell's reader also reads the cell's ended-streams stream
(common/redis_io/ended_streams.py), which the last event's writer appends to in the same write, and
reads each announced stream it follows this way whole, once, with XRANGE.

Nothing is missed: a stream that ended before its follower subscribed, or while the reader could not
read (Redis down, a position older than the announcements' retention), is read whole anyway
(`catch_up`), after the follower is registered. A stream whose announced end the reader rules drop (a
stale attempt's late write) is read again at the next announcement, from the follower's position.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis

from common.redis_io import stream_replies
from common.redis_io.command_packer import pack_all
from common.redis_io.ended_streams import ENDED_FIELD, ENDED_RETENTION_S
from common.redis_io.raw_command import execute_async, raw_capable
from common.redis_io.redis_conn import as_str
from common.redis_io.stream_replies import StreamEntry, raw_entries

# Entries per XRANGE call; a longer stream is read over several.
_RANGE_COUNT = 1024
# A reader whose last read of the announcements is older than this reads every followed stream whole.
_STALE_S = ENDED_RETENTION_S / 2

Entry = StreamEntry  # (token stream entry id, its message)


@dataclass(slots=True)
class EndedReads:
    """Where a cell's reader is in its ended-streams stream, and which streams it must read whole."""

    key: str  # the cell's ended-streams stream
    position: str | None = None  # last announcement read; None: not known (nothing followed this way)
    read_at: float = 0.0  # time.monotonic() of the last read of the announcements
    # Token streams to read whole before the next read: newly followed, or possibly missed.
    catch_up: set[str] = field(default_factory=set)

    def forget(self) -> None:
        """Nothing is followed to its end any more: the next follower starts from the stream's end."""
        self.position = None
        self.catch_up.clear()

    async def start(self, redis: aioredis.Redis, followed: set[str]) -> None:
        """Take the announcements' newest entry as the position, if it is not known or stale; every
        followed stream is then read whole (what was announced before is not looked at)."""
        now = time.monotonic()
        if self.position is not None and now - self.read_at < _STALE_S:
            return
        newest: Any = await redis.xrevrange(self.key, count=1)
        self.position = as_str(newest[0][0]) if newest else "0-0"
        self.read_at = now
        self.catch_up |= followed

    def ended(self, raw: list[Any]) -> set[str]:
        """The token streams named by `raw`, entries of the ended-streams stream (an XREAD reply's)."""
        self.read_at = time.monotonic()
        if not raw:
            return set()
        found = stream_replies.entries(raw, ENDED_FIELD)
        self.position = found[-1][0]
        return {key.decode() for _, key in found if key is not None}


async def read_whole(redis: aioredis.Redis, after: dict[str, str]) -> dict[str, list[Entry]]:
    """Each stream's entries after the given id (exclusive), in pipelined XRANGE calls."""
    found: dict[str, list[Entry]] = {key: [] for key in after}
    pending = dict(after)
    while pending:
        more: dict[str, str] = {}
        for key, raw in zip(pending, await _ranges(redis, pending), strict=True):
            entries = stream_replies.entries(raw)
            found[key] += entries
            if len(entries) == _RANGE_COUNT:
                more[key] = entries[-1][0]
        pending = more
    return found


async def _ranges(redis: aioredis.Redis, after: dict[str, str]) -> list[Any]:
    """One XRANGE per stream after the given id, as hiredis parses their replies."""
    if raw_capable(redis):
        ranges = [
            ("XRANGE", key, f"({last_id}", "+", "COUNT", _RANGE_COUNT) for key, last_id in after.items()
        ]
        return await execute_async(redis, pack_all(ranges), len(ranges))
    async with redis.pipeline(transaction=False) as pipe:  # Redis Cluster: every key in the cell's slot
        for key, last_id in after.items():
            pipe.xrange(key, min=f"({last_id}", count=_RANGE_COUNT)
        return [raw_entries(reply) for reply in await pipe.execute()]
