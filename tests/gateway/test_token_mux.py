"""The gateway's shared token-stream reader against a real redis-server."""

from __future__ import annotations

import asyncio

import redis.asyncio as aioredis
import redis.exceptions

from common.streams import token_stream
from gateway.token_mux import Entry, Subscription, TokenStreamMux
from tests.conftest import free_port

NUM_REQUESTS = 40
NUM_STEPS = 5


async def _collect(sub: Subscription, count: int, timeout_s: float = 10.0) -> list[Entry]:
    got: list[Entry] = []
    async with asyncio.timeout(timeout_s):
        while len(got) < count:
            item = await sub.queue.get()
            assert not isinstance(item, BaseException), item
            got.extend(item)
    return got


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
            received = await asyncio.gather(*(_collect(sub, 1) for sub in subs))
            for sub, entries in zip(subs, received, strict=True):
                assert [fields[b"m"] for _, fields in entries] == [sent[sub.req_id][step]]
        calls = await _xread_calls(client) - before
        # One read per step, plus a few when a step's writes straddle a read; never one per stream.
        assert calls < NUM_REQUESTS, calls
        for sub in subs:
            mux.unsubscribe(sub)
        await mux.close()
        assert not await client.keys("llm:gateway:wake:*")  # nothing left behind
        await client.aclose()

    asyncio.run(scenario())


def test_a_late_subscriber_reads_from_its_resume_point(redis_url: str) -> None:
    async def scenario() -> None:
        client = aioredis.Redis.from_url(redis_url)
        mux = TokenStreamMux(client)
        busy = await mux.subscribe("busy")  # the shared read is now running (and blocked)
        ids = [await client.xadd(token_stream("late"), {b"m": str(i).encode()}) for i in range(3)]
        late = await mux.subscribe("late", last_id=ids[0].decode())
        entries = await _collect(late, 2)
        assert [fields[b"m"] for _, fields in entries] == [b"1", b"2"]
        assert busy.queue.empty()
        await mux.close()
        await client.aclose()

    asyncio.run(scenario())


def test_a_failed_read_reaches_every_follower() -> None:
    async def scenario() -> None:
        client = aioredis.Redis.from_url(f"redis://127.0.0.1:{free_port()}/0")  # nothing listens there
        mux = TokenStreamMux(client)
        subs = [await mux.subscribe(f"req{i}") for i in range(3)]
        for sub in subs:
            async with asyncio.timeout(10):
                item = await sub.queue.get()
            assert isinstance(item, redis.exceptions.ConnectionError)
        await mux.close()
        await client.aclose()

    asyncio.run(scenario())


def test_two_followers_of_one_stream_each_get_their_entries(redis_url: str) -> None:
    """A resumed client (or a fetch) follows a stream its first client still follows on this gateway."""

    async def run() -> None:
        redis = aioredis.Redis.from_url(redis_url)
        mux = TokenStreamMux(redis)
        try:
            key = token_stream("shared")
            first_id = (await redis.xadd(key, {b"m": b"0"})).decode()
            early = await mux.subscribe("shared")
            assert [e[0] for e in await _collect(early, 1)] == [first_id]
            late = await mux.subscribe("shared")  # from the start, as a replay does
            second_id = (await redis.xadd(key, {b"m": b"1"})).decode()
            assert [e[0] for e in await _collect(late, 2)] == [first_id, second_id]
            assert [e[0] for e in await _collect(early, 1)] == [second_id]
            mux.unsubscribe(late)
            third_id = (await redis.xadd(key, {b"m": b"2"})).decode()
            assert [e[0] for e in await _collect(early, 1)] == [third_id]
        finally:
            await mux.close()
            await redis.aclose()

    asyncio.run(run())
