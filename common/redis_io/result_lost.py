"""Whether a request submitted with `submit_once` can still be followed, once its token stream is gone.

A client that comes back to a request it submitted earlier (a Celery task delivered again after its
worker died) follows the request's token stream. A stream that does not exist is either not started
yet (queued) or finished more than the resume window ago, expired with its tokens. Only the batcher's
consumer group tells the two apart: it acknowledges a request once it has finished, after its last
event was written, and until then the request is unclaimed or pending there.
"""

from __future__ import annotations

import redis.asyncio as aioredis
import redis.exceptions

from common.redis_io.redis_conn import as_str, entry_key
from common.streams import BATCHER_GROUP, cell_keys, cell_of, submitted_key, token_stream


async def _claimed(r: aioredis.Redis, requests: str, entry_id: str) -> bool:
    """Whether the batchers' group has read the entry (pending or acknowledged since)."""
    try:
        groups = await r.xinfo_groups(requests)
    except redis.exceptions.ResponseError:
        return False  # no stream yet
    for group in groups:
        if as_str(group.get("name", b"")) == BATCHER_GROUP:
            return entry_key(entry_id) <= entry_key(as_str(group.get("last-delivered-id", b"0-0")))
    return False


async def result_lost(r: aioredis.Redis, req_id: str) -> bool:
    """True when the submitted request has finished and its token stream expired: nothing to follow.

    False while it may still be followed: its stream exists, or it is queued or running. The checks
    run in an order that needs no transaction: a request is acknowledged only after its stream holds
    its last event, so "acknowledged, and then no stream" can only mean the stream expired.
    """
    marker = await r.get(submitted_key(req_id))
    if marker is None or marker == b"1":
        return False  # not submitted with submit_once (or by an older version that kept no entry id)
    entry_id = as_str(marker)
    requests = cell_keys(cell_of(req_id)).requests
    try:
        pending = await r.xpending_range(requests, BATCHER_GROUP, entry_id, entry_id, 1)
    except redis.exceptions.ResponseError:
        return False  # no group yet: no batcher has read anything
    if pending or not await _claimed(r, requests, entry_id):
        return False
    return not await r.exists(token_stream(req_id))
