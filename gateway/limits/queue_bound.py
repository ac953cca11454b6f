"""Overload protection: refuse new requests (429 + Retry-After) while too many already wait.

Waiting = requests on the requests stream that no batcher has claimed yet (the consumer group's
`lag`) plus the interactive ones the batcher holds in its waiting queue (`num_waiting_interactive` in
its stats hash): waiting Batch API lines do not count, since they are admitted only after every
waiting interactive request. Both are read in one round trip. Several gateways read the same
numbers, so the bound is shared, though soft: gateways admitting at the same instant can overshoot it
by a few requests. Within one gateway, the requests it admitted and has not written yet count too: a
burst whose checks all read the queue before any of them was written would otherwise pass the bound
together (20 was overshot to 106 by one gateway). They count until the caller releases them, which
it does once they are written or refused (gateway/generation/admission.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis

from common.streams import BATCHER_GROUP, CellKeys
from openai_frontend.protocol.errors import OpenAIError

# A queue that is full now is usually not empty a second later; clients back off and try again.
RETRY_AFTER_S = 2


async def num_queued(redis: aioredis.Redis, keys: CellKeys) -> int:
    """The interactive requests waiting in the cell of `keys`."""
    pipe = redis.pipeline(transaction=False)
    pipe.xinfo_groups(keys.requests)
    pipe.xlen(keys.requests)
    pipe.hget(keys.stats, "num_waiting_interactive")
    groups, length, waiting = await pipe.execute(raise_on_error=False)
    if isinstance(length, Exception) or isinstance(waiting, Exception):
        raise length if isinstance(length, Exception) else waiting
    return _unclaimed(groups, int(length)) + (int(float(waiting)) if waiting is not None else 0)


def _unclaimed(groups: Any, length: int) -> int:
    """The group's lag; with no group yet (no batcher ever started), every entry is unclaimed."""
    if isinstance(groups, Exception):
        return length  # no stream yet: length is 0
    for group in groups:
        if _s(group.get("name", b"")) == BATCHER_GROUP:
            lag = group.get("lag")
            # Redis cannot tell the lag after entries inside the range were trimmed; then only the
            # batcher's own count is known.
            return int(lag) if lag is not None else 0
    return length


@dataclass(slots=True)
class QueueBound:
    """GATEWAY_MAX_QUEUED_REQUESTS for one gateway: what Redis says waits, plus what it admitted and
    has not written yet."""

    max_queued: int  # 0: no bound
    # by cell: admitted req_id -> its choices, until `release`
    _admitted: dict[str, dict[str, int]] = field(default_factory=dict)

    async def check(self, redis: aioredis.Redis, keys: CellKeys, req_id: str, num_new: int) -> None:
        """Raise 429 when admitting `req_id`'s `num_new` requests (one per choice) would exceed the
        bound; else count them as waiting until `release(req_id)`."""
        if self.max_queued <= 0:
            return
        queued = await num_queued(redis, keys)
        # No await from here on: the count and the admission are one step for this gateway.
        admitted = self._admitted.setdefault(keys.cell, {})
        queued += sum(admitted.values())
        if queued + num_new > self.max_queued:
            raise OpenAIError(
                429,
                f"The server is overloaded: {queued} requests are waiting (limit {self.max_queued}). "
                f"Please retry after {RETRY_AFTER_S}s.",
                type="server_overloaded",
                code="queue_full",
                headers={"Retry-After": str(RETRY_AFTER_S)},
            )
        admitted[req_id] = num_new

    def release(self, cell: str, req_id: str) -> None:
        """`req_id` was written (or refused after all): Redis counts it from now on."""
        self._admitted.get(cell, {}).pop(req_id, None)


def _s(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
