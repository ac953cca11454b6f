"""The gateway's shared token-stream reader against a real redis-server."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis
import redis.asyncio as aioredis

from common.redis_io.ended_streams import announce_end
from common.redis_io.redis_conn import as_str, connect_async
from common.streams import token_stream
from harness.processes.redis_process import RedisProcess
from harness.processes.redis_server import free_port
from openai_frontend.follow.token_mux import TICK_S, CellStreamMux, Entry, Subscription, TokenStreamMux
from openai_frontend.follow.token_stream import RequestTimedOut, follow_token_stream

NUM_REQUESTS = 40
NUM_STEPS = 5


async def collect(sub: Subscription, count: int, timeout_s: float = 10.0) -> list[Entry]:
    got: list[Entry] = []
    async with asyncio.timeout(timeout_s):
        while len(got) < count:
            got.extend(await sub.queue.get())
    return got


@contextlib.asynccontextmanager
async def mux_over(client: aioredis.Redis) -> AsyncIterator[TokenStreamMux]:
    """A mux reading through `client`; both closed after, whether the test passed or not."""
    mux = TokenStreamMux(client)
    try:
        yield mux
    finally:
        await mux.close()
        await client.aclose()


async def _xread_calls(client: aioredis.Redis) -> int:
    stats = await client.info("commandstats")
    return int(stats.get("cmdstat_xread", {}).get("calls", 0))


def test_every_follower_gets_its_own_entries_from_one_shared_read(redis_url: str) -> None:
    async def scenario() -> None:
        client = aioredis.Redis.from_url(redis_url)
        mux = TokenStreamMux(client)
        subs = [await mux.subscribe(f"req{i}") for i in range(NUM_REQUESTS)]
        before = await _xread_calls(client)
        sent: dict[str, list[bytes]] = {f"req{i}": [] for i in range(NUM_REQUESTS)}
        for step in range(NUM_STEPS):
            # One "worker step": an event on every stream at once, then wait until all arrived.
            async with client.pipeline(transaction=False) as pipe:
                for req_id, values in sent.items():
                    value = f"{req_id}:{step}".encode()
                    values.append(value)
                    pipe.xadd(token_stream(req_id), {b"m": value})
                await pipe.execute()
            received = await asyncio.gather(*(collect(sub, 1) for sub in subs))
            for sub, entries in zip(subs, received, strict=True):
                assert [message for _, message in entries] == [sent[sub.req_id][step]]
        calls = await _xread_calls(client) - before
        # One read per step, plus a few when a step's writes straddle a read; never one per stream.
        assert calls < NUM_REQUESTS, calls
        for sub in subs:
            mux.unsubscribe(sub)
        await mux.close()
        assert not await client.keys("llm:{*}:gateway:wake:*")  # nothing left behind
        await client.aclose()

    asyncio.run(scenario())


def test_a_late_subscriber_reads_from_its_resume_point(redis_url: str) -> None:
    async def scenario() -> None:
        client = aioredis.Redis.from_url(redis_url)
        async with mux_over(client) as mux:
            busy = await mux.subscribe("busy")  # the shared read is now running (and blocked)
            ids = [await client.xadd(token_stream("late"), {b"m": str(i).encode()}) for i in range(3)]
            late = await mux.subscribe("late", last_id=ids[0].decode())
            entries = await collect(late, 2)
            assert [message for _, message in entries] == [b"1", b"2"]
            # Nothing of late's reached busy: at most the reader's tick, an empty batch.
            while not busy.queue.empty():
                assert busy.queue.get_nowait() == []

    asyncio.run(scenario())


def test_followers_outlive_failed_reads_until_their_own_deadline() -> None:
    """Redis unreachable: the shared read retries with backoff and fails nobody; each follower gives
    up only when its own deadline passes."""

    async def scenario() -> None:
        async with mux_over(connect_async(f"redis://127.0.0.1:{free_port()}/0")) as mux:  # nothing listens
            started = time.monotonic()
            deadlines = [started + 0.6, started + 1.5]

            async def follow(req_id: str, deadline: float) -> float:
                with pytest.raises(RequestTimedOut):
                    async for _ in follow_token_stream(mux, req_id, deadline=deadline):
                        pass
                return time.monotonic()

            ended = await asyncio.gather(*(follow(f"req{i}", d) for i, d in enumerate(deadlines)))
            assert mux.redis_down
            for end, deadline in zip(ended, deadlines, strict=True):
                assert deadline - 0.01 <= end < deadline + 0.5  # not before its deadline, and not long after

    asyncio.run(scenario())


def test_two_followers_of_one_stream_each_get_their_entries(redis_url: str) -> None:
    """A resumed client (or a fetch) follows a stream its first client still follows on this gateway."""

    async def run() -> None:
        redis = aioredis.Redis.from_url(redis_url)
        async with mux_over(redis) as mux:
            key = token_stream("shared")
            first_id = (await redis.xadd(key, {b"m": b"0"})).decode()
            early = await mux.subscribe("shared")
            assert [e[0] for e in await collect(early, 1)] == [first_id]
            late = await mux.subscribe("shared")  # from the start, as a replay does
            second_id = (await redis.xadd(key, {b"m": b"1"})).decode()
            assert [e[0] for e in await collect(late, 2)] == [first_id, second_id]
            assert [e[0] for e in await collect(early, 1)] == [second_id]
            mux.unsubscribe(late)
            third_id = (await redis.xadd(key, {b"m": b"2"})).decode()
            assert [e[0] for e in await collect(early, 1)] == [third_id]

    asyncio.run(run())


def _blocked_xreads(client: redis.Redis) -> int:
    return sum(c["cmd"] == "xread" and "b" in c["flags"] for c in client.client_list())


def test_a_replay_that_subscribes_during_a_read_misses_no_entry(redis_url: str) -> None:
    """The first client follows at the stream's end; a replay from the start subscribes just as the
    shared read (which started at the first client's position) is answered. That answer must not
    move the replay past the entries it never saw."""

    async def run() -> None:
        client = aioredis.Redis.from_url(redis_url)
        writer = redis.Redis.from_url(redis_url)  # blocking: the loop does not run while it writes
        try:
            async with mux_over(client) as mux:
                key = token_stream("raced")
                ids = [(await client.xadd(key, {b"m": str(i).encode()})).decode() for i in range(3)]
                first = await mux.subscribe("raced", last_id=ids[-1])
                async with asyncio.timeout(10):
                    while _blocked_xreads(writer) == 0:
                        await asyncio.sleep(0.01)
                ids.append(writer.xadd(key, {b"m": b"3"}).decode())
                deadline = time.monotonic() + 10
                while _blocked_xreads(writer) > 0:  # answered: the reply waits in the mux's socket
                    assert time.monotonic() < deadline
                replay = await mux.subscribe("raced")  # the loop now reads that reply first
                assert [e[0] for e in await collect(replay, 4)] == ids
                assert [e[0] for e in await collect(first, 1)] == ids[-1:]
        finally:
            writer.close()

    asyncio.run(run())


def test_a_follower_resumes_after_redis_restarts(tmp_path: Path) -> None:
    """Redis stops and starts again on the same port: the follower keeps its place and gets exactly
    the entries written after the restart, on the same subscription."""
    server = RedisProcess(tmp_path / "redis")
    server.start()

    async def scenario() -> None:
        client = connect_async(server.url)
        async with mux_over(client) as mux:
            sub = await mux.subscribe("req")
            await client.xadd(token_stream("req"), {b"m": b"0"})
            assert [m for _, m in await collect(sub, 1)] == [b"0"]
            server.stop(signal.SIGTERM)
            async with asyncio.timeout(10):
                while not mux.redis_down:
                    await asyncio.sleep(0.01)
            await asyncio.to_thread(server.start)
            for i in (1, 2):
                await client.xadd(token_stream("req"), {b"m": str(i).encode()})
            assert [m for _, m in await collect(sub, 2)] == [b"1", b"2"]
            assert not mux.redis_down

    try:
        asyncio.run(scenario())
    finally:
        server.stop(signal.SIGKILL)


def test_a_follower_with_nothing_to_read_is_handed_an_empty_batch_each_tick(redis_url: str) -> None:
    """Followers wait with no timer of their own: the reader wakes each, about once a TICK_S, so it
    can look at its deadline and its client."""

    async def scenario() -> None:
        client = aioredis.Redis.from_url(redis_url)
        async with mux_over(client) as mux:
            quiet = await mux.subscribe("quiet")
            started = time.monotonic()
            for _ in range(2):
                async with asyncio.timeout(3 * TICK_S):
                    assert await quiet.queue.get() == []
            assert time.monotonic() - started >= TICK_S  # ticks, not a busy loop

    asyncio.run(scenario())


def test_a_final_only_follower_gets_its_stream_whole_once_it_is_announced_as_ended(redis_url: str) -> None:
    """A non-streaming answer's follower is not fed step by step: the shared read never names its
    stream, and it gets every entry in one batch after the writer announced the end."""

    async def scenario() -> None:
        client = aioredis.Redis.from_url(redis_url)
        async with mux_over(client) as mux:
            key = token_stream("whole")
            sub = await mux.subscribe("whole", final_only=True)
            async with asyncio.timeout(3 * TICK_S):  # a tick: the stream, empty, was read whole before it
                assert await sub.queue.get() == []
            ids = [as_str(await client.xadd(key, {b"m": str(i).encode()})) for i in range(3)]
            async with asyncio.timeout(3 * TICK_S):  # only ticks while it runs
                assert await sub.queue.get() == []
            async with client.pipeline(transaction=True) as pipe:
                pipe.xadd(key, {b"m": b"3"})
                announce_end(pipe, "whole")
                last_id = (await pipe.execute())[0].decode()
            got = await collect(sub, 4)
            assert [entry_id for entry_id, _ in got] == [*ids, last_id]
            assert [m for _, m in got] == [b"0", b"1", b"2", b"3"]

    asyncio.run(scenario())


def test_a_final_only_follower_of_a_stream_that_already_ended_reads_it_whole(redis_url: str) -> None:
    """The end was announced before the follower subscribed (a fetch of a finished request, or one
    that ended at once): it is read whole when it subscribes, beside a follower already waiting."""

    async def scenario() -> None:
        client = aioredis.Redis.from_url(redis_url)
        lister = redis.Redis.from_url(redis_url)
        async with mux_over(client) as mux:
            waiting = await mux.subscribe("waiting", final_only=True)  # the reader runs, blocked
            async with client.pipeline(transaction=True) as pipe:
                pipe.xadd(token_stream("done"), {b"m": b"0"})
                pipe.xadd(token_stream("done"), {b"m": b"1"})
                announce_end(pipe, "done")
                await pipe.execute()
            # The announcement ended the reader's blocked read; blocked again, it has passed it by.
            async with asyncio.timeout(10):
                while _blocked_xreads(lister) == 0:
                    await asyncio.sleep(0.01)
            lister.close()
            late = await mux.subscribe("done", final_only=True)
            assert [m for _, m in await collect(late, 2)] == [b"0", b"1"]
            while not waiting.queue.empty():
                assert waiting.queue.get_nowait() == []

    asyncio.run(scenario())


def test_the_last_final_only_follower_leaving_during_a_catch_up_stops_no_reader(redis_url: str) -> None:
    """Leaving forgets the announcements' position while the catch-up still reads the follower's
    stream; the reader goes on (it used to die of it, failing every follower it had)."""
    caught_up = asyncio.Event()

    class LeavingMux(CellStreamMux):
        leaving: Subscription | None = None

        async def _read_ended(self, keys: set[str]) -> None:
            if self.leaving is not None:  # the follower's client hangs up at this very moment
                self.unsubscribe(self.leaving)
                self.leaving = None
            await super()._read_ended(keys)
            caught_up.set()

    async def scenario() -> None:
        client = aioredis.Redis.from_url(redis_url)
        mux = LeavingMux(client)
        try:
            mux.leaving = await mux.subscribe("leaving", final_only=True)  # its catch-up: the next turn
            async with asyncio.timeout(10):
                while not caught_up.is_set():
                    assert mux._task is not None
                    if mux._task.done():
                        raise AssertionError(f"the reader died: {mux._task.exception()!r}")
                    await asyncio.sleep(0.01)
            assert mux._task is not None and not mux._task.done()
            live = await mux.subscribe("live")
            await client.xadd(token_stream("live"), {b"m": b"0"})
            assert [m for _, m in await collect(live, 1)] == [b"0"]
        finally:
            await mux.close()
            await client.aclose()

    asyncio.run(scenario())
