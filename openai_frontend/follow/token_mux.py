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

A non-streaming follower (`final_only`) is not fed by that read: the same read also takes the cell's
ended-streams stream, and a stream it announces is read whole once, for its followers that wait for
the end only (openai_frontend/follow/ended_reads.py).

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
from common.redis_io import stream_replies
from common.redis_io.command_packer import pack
from common.redis_io.raw_command import execute_async, raw_capable
from common.redis_io.redis_conn import MAX_BLOCK_MS, entry_key
from common.redis_io.retry import Backoff
from common.redis_io.stream_replies import raw_reply
from common.streams import DEFAULT_CELL, cell_keys, cell_of, token_stream
from openai_frontend.follow.ended_reads import EndedReads, Entry, read_whole
from openai_frontend.follow.stream_watch import StreamWatch

logger = logging.getLogger(__name__)

__all__ = ["CellStreamMux", "Entry", "Subscription", "TokenStreamMux"]

# Entries fetched per stream per XREAD; a burst larger than this is read over several calls.
_READ_COUNT = 256
_WAKE_TTL_S = 3600  # refreshed on every wake; outlives any pause of a live gateway
# How often every follower is handed at least an empty batch (`CellStreamMux._tick`).
TICK_S = MAX_BLOCK_MS / 1000


@dataclass(slots=True, eq=False)
class Subscription:
    req_id: str
    last_id: str  # the newest entry already delivered (or the resume point)
    # Handed its entries only once its stream ended (a non-streaming answer), not at every step.
    final_only: bool = False
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

    async def subscribe(
        self, req_id: str, last_id: str = "0-0", submitted: bool = False, final_only: bool = False
    ) -> Subscription:
        """Follow `req_id`'s token stream after `last_id`; `submitted`: the request was written to
        Redis (its loss is then noticed even before its keys were seen, stream_watch.py);
        `final_only`: hand its entries over only once it ended."""
        cell = cell_of(req_id)
        mux = self._cells.get(cell)
        if mux is None:
            mux = self._cells[cell] = CellStreamMux(self._redis, cell, self.gateway_id)
        return await mux.subscribe(req_id, last_id, submitted, final_only)

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
        self._finals: dict[str, list[Subscription]] = {}  # the final_only ones, by token stream key
        self._ends = EndedReads(cell_keys(cell).ended_streams)
        self._wake_key = cell_keys(cell).gateway_wake(gateway_id or uuid.uuid4().hex)
        self._wake_last = "0-0"
        self._has_subs = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._closed = asyncio.Event()  # set by `close`: wakes a backoff wait
        self.redis_down = False  # the last read failed: Redis is unreachable (followers wait)
        self._watch = StreamWatch(redis, cell)
        self._next_tick = time.monotonic() + TICK_S  # when followers next get an empty batch (`_tick`)

    async def subscribe(
        self, req_id: str, last_id: str = "0-0", submitted: bool = False, final_only: bool = False
    ) -> Subscription:
        sub = Subscription(req_id, last_id, final_only)
        if submitted:
            self._watch.seen.add(req_id)
        key = token_stream(req_id)
        if final_only:
            self._finals.setdefault(key, []).append(sub)
            self._ends.catch_up.add(key)  # it may have ended already
        else:
            self._subs.setdefault(key, []).append(sub)
        self._has_subs.set()
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="token-stream-mux")
            self._task.add_done_callback(self._reader_done)
        else:
            await self._wake()
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        key = token_stream(sub.req_id)
        by_key = self._finals if sub.final_only else self._subs
        subs = by_key.get(key, [])
        if sub in subs:
            subs.remove(sub)
        if not subs:
            by_key.pop(key, None)
            if key not in self._subs and key not in self._finals:
                self._watch.forget(sub.req_id)
        if not self._finals:
            self._ends.forget()
        if not self._subs and not self._finals:
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
            streams: dict[Any, Any] = {key: _oldest(subs) for key, subs in self._subs.items()}
            read_from = dict(streams)
            streams[self._wake_key] = self._wake_last
            try:
                if self._finals:
                    await self._catch_up()
                # The last follower-to-the-end may leave while the catch-up reads (forgetting the
                # position); a new one is caught up by the next turn.
                if self._finals and self._ends.position is not None:
                    streams[self._ends.key] = self._ends.position
                # Bounded BLOCK (MAX_BLOCK_MS): closing and failures are noticed within a second.
                ended = self._dispatch(await self._read(streams), read_from)
                if ended:
                    await self._read_ended(ended)
            except redis.exceptions.RedisError as exc:
                # Followers keep their place and wait (each up to its own deadline); no busy loop.
                if not backoff.failing:
                    logger.warning("token stream read failed, retrying with backoff: %s", exc)
                self.redis_down = True
                self._ends.catch_up.update(self._finals)  # announcements may be missed meanwhile
                await self._wait_ticking(backoff.next_delay())
                continue
            if backoff.failing:
                logger.info("token stream reads resumed after %d failed reads", backoff.num_failures)
                backoff.reset()
                self.redis_down = False
            if self._closing:
                return
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
        for sub in self._all_subs():
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
        for sub in self._all_subs():
            sub.failure = RequestError(req_id=sub.req_id, message="the gateway's token stream reader failed")
            sub.queue.put_nowait([])

    async def _fail_stuck(self) -> None:
        """End the followed requests that can no longer end by themselves (stream_watch.py)."""
        req_ids = {sub.req_id for sub in self._all_subs()}
        for error in await self._watch.failures(req_ids) if req_ids else []:
            key = token_stream(error.req_id)
            for sub in [*self._subs.get(key, []), *self._finals.get(key, [])]:
                sub.failure = error
                sub.queue.put_nowait([])  # wakes a follower waiting for entries

    def _all_subs(self) -> list[Subscription]:
        return [sub for by_key in (self._subs, self._finals) for subs in by_key.values() for sub in subs]

    async def _catch_up(self) -> None:
        """Read whole the followed-to-the-end streams that may have ended unannounced to this reader."""
        await self._ends.start(self._redis, set(self._finals))
        if self._ends.catch_up:
            keys, self._ends.catch_up = self._ends.catch_up, set()
            await self._read_ended(keys)

    async def _read_ended(self, keys: set[str]) -> None:
        """Hand the followers-to-the-end of `keys` their streams' entries, read whole."""
        after = {key: _oldest(self._finals[key]) for key in keys if key in self._finals}
        if not after:
            return
        for key, entries in (await read_whole(self._redis, after)).items():
            _hand_over(self._finals.get(key, []), entries, entry_key(after[key]))

    async def _read(self, streams: dict[str, str]) -> list[tuple[str, list[Any]]]:
        """One blocking XREAD, as (stream, raw entries) pairs: packed once, read as hiredis parses it
        (stream_replies.py), without redis-py's layers and its dict per entry."""
        if not raw_capable(self._redis):  # Redis Cluster: redis-py routes it
            keyed: dict[Any, Any] = dict(streams)
            parsed = await self._redis.xread(keyed, count=_READ_COUNT, block=MAX_BLOCK_MS)
            return stream_replies.streams(raw_reply(parsed))
        command = pack(
            "XREAD", "COUNT", _READ_COUNT, "BLOCK", MAX_BLOCK_MS, "STREAMS", *streams, *streams.values()
        )
        return stream_replies.streams((await execute_async(self._redis, command))[0])

    def _dispatch(self, found: list[tuple[str, list[Any]]], read_from: dict[str, str]) -> set[str]:
        """Hand the streaming followers their entries; the followed streams announced as ended."""
        ended: set[str] = set()
        if self._finals:
            ended = self._ends.ended([])  # read (even with nothing new): the position is fresh
        for key, raw in found:
            if not raw:
                continue
            if key == self._wake_key:
                self._wake_last = raw[-1][0].decode()
            elif key == self._ends.key:
                ended = self._ends.ended(raw)
            elif subs := self._subs.get(key):  # none: unsubscribed while the read was in flight
                _hand_over(subs, stream_replies.entries(raw), entry_key(read_from[key]))
        return ended


def _oldest(subs: list[Subscription]) -> str:
    """Where a read for `subs` starts: the oldest of their positions."""
    return min((sub.last_id for sub in subs), key=entry_key)


def _hand_over(subs: list[Subscription], entries: list[Entry], start: tuple[int, int]) -> None:
    """Give each of `subs` the `entries` (read after `start`) past its own position."""
    for sub in subs:
        after = entry_key(sub.last_id)
        if after < start:
            continue  # subscribed during the read, further back: the next read serves it
        new = entries if after == start else [e for e in entries if entry_key(e[0]) > after]
        if new:
            sub.last_id = new[-1][0]
            sub.queue.put_nowait(new)
