"""Cursor pages over one API key's files or batches: a sorted set of ids scored by creation time.

The objects themselves expire on their own (a TTL on their hash); their ids are dropped from the set
when a listing meets them gone, so the set never holds more than the live objects plus a few.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import redis.asyncio as aioredis

from common.redis_io.redis_conn import as_str

T = TypeVar("T")

_SCAN = 100  # ids read from the set per round trip

# ids -> their objects, None for those that expired
Load = Callable[[list[str]], Awaitable[list[T | None]]]


async def page(
    redis: aioredis.Redis,
    index_key: str,
    load: Load[T],
    *,
    after: str | None,
    limit: int,
    newest_first: bool = True,
    keep: Callable[[T], bool] = lambda _: True,
) -> tuple[list[T], bool]:
    """Up to `limit` objects after the id `after` (exclusive), and whether more follow."""
    start = 0
    if after:
        find = redis.zrevrank if newest_first else redis.zrank
        rank: Any = await find(index_key, after)
        if rank is None:
            return [], False  # an unknown cursor (expired or never ours) ends the listing
        start = int(rank) + 1
    found: list[T] = []
    while len(found) <= limit:
        end = start + _SCAN - 1
        raw: Any = await (
            redis.zrevrange(index_key, start, end) if newest_first else redis.zrange(index_key, start, end)
        )
        if not raw:
            break
        ids = [as_str(i) for i in raw]
        objects = await load(ids)
        gone = [i for i, obj in zip(ids, objects, strict=True) if obj is None]
        if gone:
            await redis.zrem(index_key, *gone)
        found += [obj for obj in objects if obj is not None and keep(obj)]
        start += len(ids) - len(gone)  # removing the gone ones moved the later ranks up
    return found[:limit], len(found) > limit
