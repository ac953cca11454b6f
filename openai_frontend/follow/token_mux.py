"""One blocking XREAD for every token stream this gateway follows, instead of one per request.

With B requests in flight, a worker step appends one event to each of B token streams. Reading each
stream with its own blocking XREAD costs B Redis round trips, B connections and B wake-ups per step;
the mux reads all of them with one XREAD (as vLLM's frontend has one output loop for all requests)
and hands each request its entries through an asyncio queue.

A request that subscribes while the shared XREAD is blocked must not wait for that read's timeout:
the mux also reads a small wake stream of its own, and `subscribe` appends to it, which ends the
blocked read at once. The wake stream has a TTL, so a gateway that dies leaves nothing behind.

Several followers of one stream (a resumed client and the original one, or a fetch by id) each get
their own subscription; the read starts at the oldest of their positions and each gets only the
entries past its own. A follower that subscribed while a read was in flight, from a point before
where that read started, gets nothing from it: the next read starts at its position, so no entry
between the two is skipped.

On Redis Cluster one XREAD may only name keys of one slot: a request's token stream is in its cell's
slot (common/streams.py), so the mux runs one such read per cell it follows (`CellStreamMux`), each
with a wake stream in that cell's slot.

A failed read (Redis restarting, unreachable) is retried with backoff (common/redis_io/retry.py) and fails no
follower: each keeps its place (the last entry id it was given) and resumes from there once Redis is
back, so an SSE stream survives a Redis restart. A follower gives up only at its own deadline
(openai_frontend/follow/token_stream.py). Entry ids grow with the clock, so even a stream that lost its
last entries in the restart (AOF everysec) gets new entries after a follower's last id.

Every few seconds the reader also asks whether its followed requests can still end
(openai_frontend/follow/stream_watch.py): one whose state Redis lost, or whose cell has had no batcher
for a while, is ended with an error after the entries already handed over, instead of waiting out
the request timeout.

Each read names one key per request followed. Following a gateway's own requests through one
delivery stream per cell instead (one key however many are in flight) cost the gateway more CPU per
token at 16 and 64 in flight (docs/benchmarks.md, issue 24), and was removed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis
import redis.exceptions

from common.protocol import RequestError
from common.redis_io.redis_conn import MAX_BLOCK_MS, entry_key
from common.redis_io.retry import Backoff
from common.streams import DEFAULT_CELL, cell_keys, cell_of, token_stream
from openai_frontend.follow.stream_watch import StreamWatch

logger = logging.getLogger(__name__)

__all__ = ["CellStreamMux", "Entry", "Subscription", "TokenStreamMux"]

# Entries fetched per stream per XREAD; a burst larger than this is read over several calls.
_READ_COUNT = 256
_WAKE_TTL_S = 3600  # refreshed on every wake; outlives any pause of a live gateway
# How often every follower is handed at least an empty batch (`CellStreamMux._tick`).
TICK_S = MAX_BLOCK_MS / 1000


Entry = tuple[str, dict[bytes, bytes]]  # (token stream entry id, fields)


@dataclass(slots=True, eq=False)
class Subscription:
    req_id: str
    last_id: str  # the newest entry already delivered (or the resume point)
    queue: asyncio.Queue[list[Entry]] = field(default_factory=asyncio.Queue)
    # Set when the request can no longer end by itself (stream_watch.py): the follower raises it once
    # it has taken every entry queued before.
    failure: RequestError | None = None


class TokenStreamMux:
    """The token streams this gateway follows, in every cell: one shared read per cell."""

    def __init__(self, redis: aioredis.Redis) -> None:
        self._redis = redis
        self.gateway_id = uuid.uuid4().hex
        self._cells: dict[str, CellStreamMux] = {}

    async def subscribe(self, req_id: str, last_id: str = "0-0", submitted: bool = False) -> Subscription:
        """Follow `req_id`'s token stream after `last_id`; `submitted`: the request was written to
        Redis (its loss is then noticed even before its keys were seen, stream_watch.py)."""
        cell = cell_of(req_id)
        mux = self._cells.get(cell)
        if mux is None:
            mux = self._cells[cell] = CellStreamMux(self._redis, cell, self.gateway_id)
        return await mux.subscribe(req_id, last_id, submitted)

    def unsubscribe(self, sub: Subscription) -> None:
        mux = self._cells.get(cell_of(sub.req_id))
        if mux is not None:
            mux.unsubscribe(sub)

    async def close(self) -> None:
        await asyncio.gather(*(mux.close() for mux in self._cells.values()))

    @property
    def redis_down(self) -> bool:
        """The last read of some cell failed: Redis (or that cell's shard) is unreachable."""
        return any(mux.redis_down for mux in self._cells.values())


class CellStreamMux:
    """One blocking XREAD for every followed token stream of one cell (one slot on a cluster)."""

    def __init__(self, redis: aioredis.Redis, cell: str = DEFAULT_CELL, gateway_id: str = "") -> None:
        self._redis = redis
        self._subs: dict[str, list[Subscription]] = {}  # by token stream key
        self._wake_key = cell_keys(cell).gateway_wake(gateway_id or uuid.uuid4().hex)
        self._wake_last = "0-0"
        self._has_subs = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._closed = asyncio.Event()  # set by `close`: wakes a backoff wait
        self.redis_down = False  # the last read failed: Redis is unreachable (followers wait)
        self._watch = StreamWatch(redis, cell)
        self._next_tick = time.monotonic() + TICK_S  # when followers next get an empty batch (`_tick`)

    async def subscribe(self, req_id: str, last_id: str = "0-0", submitted: bool = False) -> Subscription:
        sub = Subscription(req_id, last_id)
        if submitted:
            self._watch.seen.add(req_id)
        self._subs.setdefault(token_stream(req_id), []).append(sub)
        self._has_subs.set()
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="token-stream-mux")
            self._task.add_done_callback(self._reader_done)
        else:
            await self._wake()
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        key = token_stream(sub.req_id)
        subs = self._subs.get(key, [])
        if sub in subs:
            subs.remove(sub)
        if not subs:
            self._subs.pop(key, None)
            self._watch.forget(sub.req_id)
        if not self._subs:
            self._has_subs.clear()

    async def close(self) -> None:
        # Ask the loop to stop and wake its read: redis-py does not give up a blocked XREAD promptly
        # when its task is cancelled, so cancelling is only the fallback.
        self._closing = True
        self._closed.set()
        self._has_subs.set()
        if self._task is not None and not self._task.done():
            await self._wake()
            try:
                await asyncio.wait_for(asyncio.shield(self._task), timeout=2 * MAX_BLOCK_MS / 1000)
            except TimeoutError:
                self._task.cancel()
        with contextlib.suppress(redis.exceptions.RedisError):
            await self._redis.delete(self._wake_key)

    async def _wake(self) -> None:
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.xadd(self._wake_key, {b"w": b"1"}, maxlen=16, approximate=True)
                pipe.expire(self._wake_key, _WAKE_TTL_S)
                await pipe.execute()
        except redis.exceptions.RedisError as exc:
            # The new subscriber is then served when the current read times out (about a second).
            logger.warning("could not wake the token stream reader: %s", exc)

    async def _run(self) -> None:
        backoff = Backoff()
        while True:
            await self._has_subs.wait()
            if self._closing:
                return
            streams: dict[Any, Any] = {
                key: min((sub.last_id for sub in subs), key=entry_key) for key, subs in self._subs.items()
            }
            read_from = dict(streams)
            streams[self._wake_key] = self._wake_last
            try:
                # Bounded BLOCK (MAX_BLOCK_MS): closing and failures are noticed within a second.
                reply = await self._redis.xread(streams, count=_READ_COUNT, block=MAX_BLOCK_MS)
            except redis.exceptions.RedisError as exc:
                # Followers keep their place and wait (each up to its own deadline); no busy loop.
                if not backoff.failing:
                    logger.warning("token stream read failed, retrying with backoff: %s", exc)
                self.redis_down = True
                await self._wait_ticking(backoff.next_delay())
                continue
            if backoff.failing:
                logger.info("token stream reads resumed after %d failed reads", backoff.num_failures)
                backoff.reset()
                self.redis_down = False
            if self._closing:
                return
            self._dispatch(reply, read_from)
            now = time.monotonic()
            self._tick(now)
            if self._watch.due(now):
                await self._fail_stuck()

    def _tick(self, now: float) -> None:
        """Hand every follower with nothing queued an empty batch, once a TICK_S: followers wait for
        entries with no timer of their own (one per token per request cost the gateway's CPU), and
        still look at their deadline and their client about once a second."""
        if now < self._next_tick:
            return
        self._next_tick = now + TICK_S
        for subs in self._subs.values():
            for sub in subs:
                if sub.queue.empty():
                    sub.queue.put_nowait([])

    async def _wait_ticking(self, delay_s: float) -> None:
        """Wait `delay_s` (less if `close` is called), ticking the followers meanwhile."""
        end = time.monotonic() + delay_s
        while not self._closing and (left := end - time.monotonic()) > 0:
            with contextlib.suppress(TimeoutError):  # `close` ends the wait early
                await asyncio.wait_for(self._closed.wait(), min(left, TICK_S))
            self._tick(time.monotonic())

    def _reader_done(self, task: asyncio.Task[None]) -> None:
        """A reader that died of a bug must not leave its followers waiting with no timer: each
        fails, after the entries it was given."""
        if task.cancelled() or task.exception() is None:
            return
        logger.error("token stream reader failed", exc_info=task.exception())
        for subs in self._subs.values():
            for sub in subs:
                sub.failure = RequestError(
                    req_id=sub.req_id, message="the gateway's token stream reader failed"
                )
                sub.queue.put_nowait([])

    async def _fail_stuck(self) -> None:
        """End the followed requests that can no longer end by themselves (stream_watch.py)."""
        req_ids = {subs[0].req_id for subs in self._subs.values() if subs}
        for error in await self._watch.failures(req_ids) if req_ids else []:
            for sub in self._subs.get(token_stream(error.req_id), []):
                sub.failure = error
                sub.queue.put_nowait([])  # wakes a follower waiting for entries

    def _dispatch(self, reply: Any, read_from: dict[str, str]) -> None:
        # connect_async speaks RESP2: [[stream, [(id, fields), ...]], ...], or [] on timeout.
        for raw_key, raw_entries in reply or []:
            key = raw_key.decode() if isinstance(raw_key, bytes) else str(raw_key)
            entries = [
                (raw_id.decode() if isinstance(raw_id, bytes) else str(raw_id), fields)
                for raw_id, fields in raw_entries
            ]
            if not entries:
                continue
            if key == self._wake_key:
                self._wake_last = entries[-1][0]
                continue
            start = entry_key(read_from[key])
            for sub in self._subs.get(key, []):  # none: unsubscribed while the read was in flight
                after = entry_key(sub.last_id)
                if after < start:
                    continue  # subscribed during the read, further back: the next read serves it
                new = [e for e in entries if entry_key(e[0]) > after]
                if new:
                    sub.last_id = new[-1][0]
                    sub.queue.put_nowait(new)
