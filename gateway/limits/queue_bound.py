"""Overload protection: refuse new requests (429 + Retry-After) while too many already wait.

Waiting = requests on the requests stream that no batcher has claimed yet (the consumer group's
`lag`) plus the interactive ones the batcher holds in its waiting queue (`num_waiting_interactive` in
its stats hash): waiting Batch API lines do not count, since they are admitted only after every
waiting interactive request. Both are read in one round trip. Several gateways read the same
numbers, so the bound is shared, though soft: gateways admitting at the same instant can overshoot it
by a few requests. Within one gateway, the requests it admitted and has not written yet count too: a
burst whose checks all read the queue before any of them was written would otherwise pass the bound
together (20 was overshot to 106 by one gateway). They count until the caller releases them, which
it does once they are written or refused (gateway/generation/admission.py), and after that for the
readings already in flight.
"""

from __future__ import annotations

from collections import Counter
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
class _Unseen:
    """One cell's requests this gateway admitted that a reading of Redis in flight may miss: those
    not written yet, and those written (released) after the reading was sent. Without the second kind
    a check whose reading was sent before a request's XADD, and answered after its release, counted
    that request nowhere (a burst of 40 passed a bound of 5 as 8 on a loaded host)."""

    admitted: dict[str, int] = field(default_factory=dict)  # req_id -> its choices, until released
    released: list[tuple[int, int]] = field(default_factory=list)  # (release number, choices)
    num_released: int = 0
    readings: Counter[int] = field(default_factory=Counter)  # in flight: releases before each began

    def begin_reading(self) -> int:
        self.readings[self.num_released] += 1
        return self.num_released

    def end_reading(self, began: int) -> int:
        """The reading that began at release number `began` is answered: what it may not show."""
        num = sum(self.admitted.values()) + sum(n for at, n in self.released if at > began)
        self.readings[began] -= 1
        if self.readings[began] == 0:
            del self.readings[began]
        oldest = min(self.readings, default=self.num_released)
        self.released = [(at, n) for at, n in self.released if at > oldest]
        return num

    def release(self, req_id: str) -> None:
        num = self.admitted.pop(req_id, 0)
        if num and self.readings:
            self.num_released += 1
            self.released.append((self.num_released, num))


@dataclass(slots=True)
class QueueBound:
    """GATEWAY_MAX_QUEUED_REQUESTS for one gateway: what Redis says waits, plus what it admitted and
    Redis may not show yet."""

    max_queued: int  # 0: no bound
    _unseen: dict[str, _Unseen] = field(default_factory=dict)  # by cell

    async def check(self, redis: aioredis.Redis, keys: CellKeys, req_id: str, num_new: int) -> None:
        """Raise 429 when admitting `req_id`'s `num_new` requests (one per choice) would exceed the
        bound; else count them as waiting until `release(req_id)`."""
        if self.max_queued <= 0:
            return
        unseen = self._unseen.setdefault(keys.cell, _Unseen())
        began = unseen.begin_reading()
        try:
            queued = await num_queued(redis, keys)
        finally:
            # No await from here on: the count and the admission are one step for this gateway.
            queued_here = unseen.end_reading(began)
        queued += queued_here
        if queued + num_new > self.max_queued:
            raise OpenAIError(
                429,
                f"The server is overloaded: {queued} requests are waiting (limit {self.max_queued}). "
                f"Please retry after {RETRY_AFTER_S}s.",
                type="server_overloaded",
                code="queue_full",
                headers={"Retry-After": str(RETRY_AFTER_S)},
            )
        unseen.admitted[req_id] = num_new

    def release(self, cell: str, req_id: str) -> None:
        """`req_id` was written (or refused after all): Redis counts it in readings sent from now on."""
        if cell in self._unseen:
            self._unseen[cell].release(req_id)


def _s(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
