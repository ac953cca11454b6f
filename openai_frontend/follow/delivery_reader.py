"""Follows this gateway's requests in one cell through its delivery stream: one key per cell.

Workers copy each event of a request submitted with `deliver_to` into the delivery stream of that
gateway (common/delivery.py). One blocking XREAD on that stream serves every such request of the cell
however many are in flight, where the per-request path (token_mux.CellStreamMux) names one key each.

The cursor is kept from the reader's start, so nothing written after it is missed; a follower's
earlier part (a replay from the start, or what came before it subscribed) is read from its token
stream once, by a catch-up read, pipelined for every follower waiting for one. The handover between
the two is `DeliveryFollowers`. Each delivery entry names its predecessor: a reader whose cursor is
not that (entries trimmed under a stalled reader, lost in a Redis restart) has every follower catch
up again. Failed reads are retried with backoff; followers keep their place (as in token_mux).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import msgspec
import redis.asyncio as aioredis
import redis.exceptions

from common.delivery import decode_delivery
from common.protocol import FIELD
from common.redis_conn import MAX_BLOCK_MS
from common.retry import Backoff
from common.streams import cell_keys, token_stream
from openai_frontend.follow.delivery_followers import DeliveryFollowers, Entry, Subscription

logger = logging.getLogger(__name__)

_READ_COUNT = 256  # delivery entries per XREAD, and token stream entries per catch-up page
_WAKE = b"w"  # the field of the entry `close` appends to end the blocked read
# A follower that heard nothing for this long reads its token stream (see DeliveryFollowers.audit_quiet).
QUIET_S = 2.0


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class CellDelivery:
    """This gateway's delivery stream in one cell, and the followers it serves."""

    def __init__(self, redis: aioredis.Redis, cell: str, gateway_id: str) -> None:
        self._redis = redis
        self.key = cell_keys(cell).delivery(gateway_id)
        self.followers = DeliveryFollowers()
        self._cursor = "0-0"
        self._ready = asyncio.Event()  # the cursor is set: catch-up reads may start
        self._catch_up_wanted = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._closing = False
        self._closed = asyncio.Event()
        self._warned = False
        self.redis_down = False

    def subscribe(self, req_id: str, last_id: str = "0-0") -> Subscription:
        sub = Subscription(req_id, last_id)
        self.followers.add(sub, time.monotonic())
        if not self._tasks:
            loop = asyncio.get_running_loop()
            self._tasks = [
                loop.create_task(self._read_loop(), name="delivery-reader"),
                loop.create_task(self._catch_up_loop(), name="delivery-catch-up"),
            ]
        self._catch_up_wanted.set()
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        self.followers.remove(sub)

    async def close(self) -> None:
        self._closing = True
        self._closed.set()
        self._catch_up_wanted.set()
        self._ready.set()
        if self._tasks:
            # End the blocked read now (redis-py does not give it up promptly when cancelled).
            with contextlib.suppress(redis.exceptions.RedisError):
                await self._redis.xadd(self.key, {_WAKE: b"1"})
            _, pending = await asyncio.wait(self._tasks, timeout=2 * MAX_BLOCK_MS / 1000)
            for task in pending:  # a blocked XREAD ends within MAX_BLOCK_MS; cancelling is the fallback
                task.cancel()
        # Requests still running (resumable elsewhere) may write it again; it then expires on its own.
        with contextlib.suppress(redis.exceptions.RedisError):
            await self._redis.delete(self.key)

    async def _retrying(self, call: Callable[[], Awaitable[Any]], what: str) -> tuple[bool, Any]:
        """(True, reply), or (False, None) once closing; a failed call is retried with backoff."""
        backoff = Backoff()
        while not self._closing:
            try:
                reply = await call()
            except redis.exceptions.RedisError as exc:
                if not backoff.failing:
                    logger.warning("%s failed, retrying with backoff: %s", what, exc)
                self.redis_down = True
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._closed.wait(), backoff.next_delay())
                continue
            self.redis_down = False
            return True, reply
        return False, None

    async def _read_loop(self) -> None:
        # Start after the stream's newest entry: a follower's earlier events come from its catch-up,
        # which reads only once this cursor is set.
        ok, last = await self._retrying(lambda: self._redis.xrevrange(self.key, count=1), "delivery start")
        if not ok:
            return
        self._cursor = _text(last[0][0]) if last else "0-0"
        self._ready.set()
        audited_at = time.monotonic()
        while True:
            ok, reply = await self._retrying(
                lambda: self._redis.xread({self.key: self._cursor}, count=_READ_COUNT, block=MAX_BLOCK_MS),
                "delivery stream read",
            )
            if not ok or self._closing:
                return
            now = time.monotonic()
            self.dispatch(reply, now)
            if now - audited_at >= QUIET_S / 4:  # not after every read: it looks at every follower
                audited_at = now
                self.followers.audit_quiet(now, QUIET_S)
            if self.followers.catching_up:
                self._catch_up_wanted.set()

    def dispatch(self, reply: Any, now: float) -> None:
        # RESP2: [[stream, [(id, fields), ...]]], or [] when the read timed out.
        for _, raw_entries in reply or []:
            for raw_id, fields in raw_entries:
                self._dispatch_entry(_text(raw_id), fields, now)

    def _dispatch_entry(self, entry_id: str, fields: dict[bytes, bytes], now: float) -> None:
        if _WAKE in fields:
            self._cursor = entry_id
            return
        try:
            delivery = decode_delivery(fields)
        except (KeyError, msgspec.DecodeError, msgspec.ValidationError) as exc:
            logger.warning("unreadable delivery stream entry %s: %s", entry_id, exc)
            self.followers.catch_up_all(now)  # its events are in their token streams
            self._cursor = entry_id
            return
        if delivery.prev_id != self._cursor:
            # Entries between the cursor and this one are gone: the token streams still hold them.
            logger.warning("delivery stream %s lost entries after %s", self.key, self._cursor)
            self.followers.catch_up_all(now)
        self._cursor = entry_id
        by_request: dict[str, list[Entry]] = {}
        for req_id, event_id, event in delivery.events:
            by_request.setdefault(req_id, []).append((event_id, {FIELD: event}))
        for req_id, entries in by_request.items():
            self.followers.deliver(req_id, entries, now)

    async def _catch_up_loop(self) -> None:
        await self._ready.wait()
        while not self._closing:
            await self._catch_up_wanted.wait()
            self._catch_up_wanted.clear()
            subs = list(self.followers.catching_up)
            if not subs or self._closing:
                continue
            generations = [sub.generation for sub in subs]
            ok, pages = await self._retrying(partial(self._read_token_streams, subs), "catch-up read")
            if not ok:
                return
            now = time.monotonic()
            for sub, generation, page in zip(subs, generations, pages, strict=True):
                entries = [(_text(raw_id), fields) for raw_id, fields in page]
                complete = len(entries) < _READ_COUNT
                if self.followers.caught_up(sub, entries, complete=complete, generation=generation, now=now):
                    self._missed(sub.req_id)
            if self.followers.catching_up:
                self._catch_up_wanted.set()  # a further page, or followers that came meanwhile

    def _missed(self, req_id: str) -> None:
        if not self._warned:
            self._warned = True
            logger.warning(
                "request %s had events its delivery stream did not bring: is a worker or batcher older "
                "than this gateway? (such followers read their token streams every %.0f s)",
                req_id,
                QUIET_S,
            )

    async def _read_token_streams(self, subs: list[Subscription]) -> list[Any]:
        async with self._redis.pipeline(transaction=False) as pipe:
            for sub in subs:
                pipe.xrange(token_stream(sub.req_id), f"({sub.last_id}", count=_READ_COUNT)
            return list(await pipe.execute())
