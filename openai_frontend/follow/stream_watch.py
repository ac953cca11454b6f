"""Which followed requests will never get another token: their state is gone, or no batcher serves them.

A follower waits for its request's next token event; two faults would leave it waiting out the
request timeout (an hour) with nothing but keep-alives:

- **Redis lost the request** (a restart without AOF, a flush, a failover to a replica that never
  had it): its submit marker and its token stream were seen, and both are gone; nothing will write
  to it again. The marker lives from submission until one retention window after the request ends,
  as the token stream does, so a request followed to its end never looks lost. A request counts as
  seen once its keys were, or from the start when its follower submitted it (the gateway's); one
  never seen (a stream followed by hand, with no marker and no event yet) is not judged.
- **No batcher serves its cell** (common/redis_io/batcher_liveness.py says `gone`) for `NO_BATCHER_FAIL_S`:
  nothing schedules it, nor enforces its queue deadline. It is aborted, so that a batcher started
  later does not run a request whose client was told it failed.

The cell's token-stream reader (openai_frontend/follow/token_mux.py) asks every `WATCH_INTERVAL_S`,
one round trip for the batcher and one for every request followed in the cell, and ends each one
named here with a RequestError, after the events it already read.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis
import redis.exceptions

from common.protocol import RequestError
from common.redis_io.batcher_liveness import BATCHER_SILENT_S, batcher_state
from common.stream_client import abort_async
from common.streams import submitted_key, token_stream

logger = logging.getLogger(__name__)

WATCH_INTERVAL_S = 2.0
# How long a cell's batcher stays `gone` (silent BATCHER_SILENT_S already) before its requests fail:
# longer than a takeover (a lease TTL), short enough that a request placed in a cell whose batcher
# died is failed within 30 s.
NO_BATCHER_FAIL_S = 10.0


def lost_error(req_id: str) -> RequestError:
    message = (
        "the request was lost: Redis no longer holds it (restarted without persistence, or flushed); "
        "please send it again"
    )
    return RequestError(req_id=req_id, message=message, code="request_lost")


def no_batcher_error(req_id: str) -> RequestError:
    silent_s = BATCHER_SILENT_S + NO_BATCHER_FAIL_S
    message = f"no batcher has served this request's queue for {silent_s:g} s: it was aborted, retry later"
    return RequestError(req_id=req_id, message=message, code="no_batcher")


@dataclass(slots=True)
class StreamWatch:
    redis: aioredis.Redis
    cell: str
    checked_at: float = float("-inf")  # time.monotonic() of the last check
    gone_since: float | None = None  # since when the cell's batcher has been seen gone
    # Followed requests whose keys were seen in Redis. Only the follower's own calls change it (`forget`
    # when it stops): a request subscribed while a check is in flight must stay in it.
    seen: set[str] = field(default_factory=set)

    def due(self, now: float) -> bool:
        return now - self.checked_at >= WATCH_INTERVAL_S

    async def failures(self, req_ids: Collection[str]) -> list[RequestError]:
        """The errors to end the followed `req_ids` with now (most often none)."""
        now = time.monotonic()
        self.checked_at = now
        try:
            if await batcher_state(self.redis, self.cell) != "gone":
                self.gone_since = None
            elif self.gone_since is None:
                self.gone_since = now
            if self.gone_since is not None and now - self.gone_since >= NO_BATCHER_FAIL_S:
                logger.warning("no batcher in cell %s: failing %d followed requests", self.cell, len(req_ids))
                await self._abort(req_ids)
                return [no_batcher_error(req_id) for req_id in req_ids]
            lost = await self._lost(req_ids)
        except redis.exceptions.RedisError as exc:  # unreachable: the reader retries, nothing is judged
            logger.debug("stream watch of cell %s skipped: %s", self.cell, exc)
            return []
        if lost:
            logger.warning("redis lost %d followed requests of cell %s", len(lost), self.cell)
        return [lost_error(req_id) for req_id in lost]

    async def _lost(self, req_ids: Collection[str]) -> list[str]:
        """The requests seen before of which Redis now holds neither the submit marker nor the token
        stream."""
        ordered = list(req_ids)
        async with self.redis.pipeline(transaction=False) as pipe:
            for req_id in ordered:  # both keys in the request's cell slot
                pipe.exists(submitted_key(req_id), token_stream(req_id))
            counts: Any = await pipe.execute()
        lost = []
        for req_id, count in zip(ordered, counts, strict=True):
            if int(count):
                self.seen.add(req_id)
            elif req_id in self.seen:
                lost.append(req_id)
        return lost

    def forget(self, req_id: str) -> None:
        """`req_id` is no longer followed."""
        self.seen.discard(req_id)

    async def _abort(self, req_ids: Collection[str]) -> None:
        for req_id in req_ids:
            with contextlib.suppress(redis.exceptions.RedisError):
                await abort_async(self.redis, req_id, "abort")
