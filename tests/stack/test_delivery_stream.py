"""Delivery streams against a real redis-server: the worker's fenced publish and the batcher's errors
write them, the gateway's mux reads one key per cell for its own requests, whatever their number.

The mux's client records the keys of each XREAD it sends (a subclass of redis-py's client that only
notes them); everything else is the shipped code talking to Redis.
"""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis

from batcher.outbox import Outbox
from batcher.request import Request
from common.delivery import append_event_args
from common.protocol import FIELD, SamplingParams, TokenEvent, WorkerInfo, encode
from common.redis_conn import connect_async
from common.streams import cell_keys, token_stream
from gpu_worker.fence import Fence, TokenWrite
from openai_frontend.follow.delivery_reader import QUIET_S
from openai_frontend.follow.token_mux import TokenStreamMux
from openai_frontend.follow.token_stream import RequestFailed, follow_token_stream
from tests.harness.redis_process import RedisProcess
from tests.stack.test_token_mux import collect

KEYS = cell_keys()
WORKER = "w0"
NUM_REQUESTS = 60
NUM_STEPS = 4


class RecordingRedis(aioredis.Redis):
    """Notes the keys of every XREAD, then sends it as redis-py does."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.xread_keys: list[list[str]] = []

    async def xread(self, streams: Any, *args: Any, **kwargs: Any) -> Any:
        self.xread_keys.append([k.decode() if isinstance(k, bytes) else str(k) for k in streams])
        return await super().xread(streams, *args, **kwargs)


@pytest.fixture()
def writer(redis_url: str) -> Any:
    client = redis.Redis.from_url(redis_url)
    info = WorkerInfo(
        worker_id=WORKER, model="m", num_blocks=8, block_size=16, max_model_len=64, started_at=0.0
    )
    client.hset(KEYS.workers, WORKER, encode(info))  # the worker's write permit
    yield client
    client.close()


def _publish(client: Any, events: list[tuple[str, int, str]]) -> None:
    """One worker step through the worker's fenced script: (req_id, index, deliver_to) per request."""
    tokens = [
        TokenWrite(
            token_stream(req_id),
            encode(TokenEvent(req_id=req_id, index=index, token_id=100 + index, attempt=0)),
            False,
            req_id,
            KEYS.delivery(gateway_id) if gateway_id else "",
        )
        for req_id, index, gateway_id in events
    ]
    steps = KEYS.worker_steps(WORKER)
    published = Fence(client, KEYS).publish(
        client, WORKER, steps, tokens, b"result", inbox_min_id="0-0", steps_min_id="0-0", token_ttl_s=60
    )
    assert published


def _stream_ids(client: Any, req_id: str) -> list[str]:
    return [entry_id.decode() for entry_id, _ in client.xrange(token_stream(req_id))]


def test_own_requests_are_read_through_one_key_per_cell(redis_url: str, writer: Any) -> None:
    async def scenario() -> None:
        client = RecordingRedis.from_url(redis_url)
        mux = TokenStreamMux(client, delivery=True)
        req_ids = [f"req{i}" for i in range(NUM_REQUESTS)]
        gateway_ids = {mux.deliver_to(req_id) for req_id in req_ids}
        assert gateway_ids == {mux.gateway_id}
        subs = [await mux.subscribe(req_id) for req_id in req_ids]
        for step in range(NUM_STEPS):
            _publish(writer, [(req_id, step, mux.gateway_id) for req_id in req_ids])
        received = await asyncio.gather(*(collect(sub, NUM_STEPS) for sub in subs))
        for req_id, entries in zip(req_ids, received, strict=True):
            # The token streams' own entry ids: what the SSE ids are, and resume from.
            assert [entry_id for entry_id, _ in entries] == _stream_ids(writer, req_id)
            assert [fields[FIELD] for _, fields in entries] == [
                fields[FIELD] for _, fields in writer.xrange(token_stream(req_id))
            ]
        assert client.xread_keys, "the mux read nothing"
        assert all(keys == [KEYS.delivery(mux.gateway_id)] for keys in client.xread_keys), client.xread_keys
        await mux.close()
        assert not await client.exists(KEYS.delivery(mux.gateway_id))  # nothing left behind
        await client.aclose()

    asyncio.run(scenario())


def test_a_replay_joins_a_live_request_and_misses_nothing(redis_url: str, writer: Any) -> None:
    """A resume from the start on the gateway that follows the request: it reads the token stream,
    then takes over from the delivery stream while steps keep coming, each event once, in order."""

    async def scenario() -> None:
        client = aioredis.Redis.from_url(redis_url)
        mux = TokenStreamMux(client, delivery=True)
        gateway_id = mux.deliver_to("r")
        live = await mux.subscribe("r")
        for index in range(3):
            _publish(writer, [("r", index, gateway_id)])
        assert len(await collect(live, 3)) == 3
        replay = await mux.subscribe("r")
        for index in range(3, 6):  # written while the replay's read may be out: every order is fine
            _publish(writer, [("r", index, gateway_id)])
            await asyncio.sleep(0)
        ids = _stream_ids(writer, "r")
        assert [e[0] for e in await collect(replay, 6)] == ids
        assert [e[0] for e in await collect(live, 3)] == ids[3:]
        await mux.close()
        await client.aclose()

    asyncio.run(scenario())


def test_entries_lost_from_the_delivery_stream_come_from_the_token_stream(
    redis_url: str, writer: Any
) -> None:
    """The delivery stream is emptied under the reader (as a cap would trim it past a stalled one):
    the next entry names a predecessor the reader never saw, and the follower reads its token stream."""

    async def scenario() -> None:
        client = aioredis.Redis.from_url(redis_url)
        mux = TokenStreamMux(client, delivery=True)
        gateway_id = mux.deliver_to("r")
        sub = await mux.subscribe("r")
        _publish(writer, [("r", 0, gateway_id)])
        assert len(await collect(sub, 1)) == 1
        # The loop does not run between these writes: the reader cannot read what is trimmed.
        _publish(writer, [("r", 1, gateway_id)])
        _publish(writer, [("r", 2, gateway_id)])
        writer.xtrim(KEYS.delivery(gateway_id), maxlen=0)
        _publish(writer, [("r", 3, gateway_id)])
        assert [e[0] for e in await collect(sub, 3)] == _stream_ids(writer, "r")[1:]
        await mux.close()
        await client.aclose()

    asyncio.run(scenario())


def test_a_writer_that_does_not_deliver_is_still_followed(redis_url: str, writer: Any) -> None:
    """A worker older than the gateway ignores `deliver_to`: its events reach the follower anyway,
    from the token stream once the follower has heard nothing for a while."""

    async def scenario() -> None:
        client = aioredis.Redis.from_url(redis_url)
        mux = TokenStreamMux(client, delivery=True)
        mux.deliver_to("r")
        sub = await mux.subscribe("r")
        await asyncio.sleep(0.2)  # the first catch-up read found an empty stream
        _publish(writer, [("r", 0, "")])
        started = time.monotonic()
        assert [e[0] for e in await collect(sub, 1, timeout_s=QUIET_S + 5)] == _stream_ids(writer, "r")
        assert time.monotonic() - started < QUIET_S + 3
        await mux.close()
        await client.aclose()

    asyncio.run(scenario())


def test_a_failure_the_batcher_writes_reaches_the_follower_through_delivery(
    redis_url: str, writer: Any
) -> None:
    async def scenario() -> None:
        client = aioredis.Redis.from_url(redis_url)
        mux = TokenStreamMux(client, delivery=True)
        gateway_id = mux.deliver_to("r")
        _publish(writer, [("r", 0, gateway_id)])
        req = Request(
            req_id="r",
            prompt_token_ids=[1],
            sampling_params=SamplingParams(),
            arrival_time=0.0,
            entry_id="1-0",
        )
        req.deliver_to, req.finish_reason, req.error = gateway_id, "error", "boom"
        followed: list[str] = []

        async def follow() -> None:
            async for batch in follow_token_stream(mux, "r", deadline=time.monotonic() + 30):
                followed.extend(entry_id for entry_id, _ in batch)

        task = asyncio.create_task(follow())
        while not followed:
            await asyncio.sleep(0.01)
        started = time.monotonic()
        pipe = writer.pipeline(transaction=False)
        Outbox(pipe, 60, KEYS).finished([req])
        pipe.execute()
        with pytest.raises(RequestFailed) as failed:
            await asyncio.wait_for(task, 10)
        assert time.monotonic() - started < QUIET_S  # delivered, not found by a quiet follower's read
        assert failed.value.error.message == "boom"
        assert failed.value.entry_id == _stream_ids(writer, "r")[-1]
        await mux.close()
        await client.aclose()

    asyncio.run(scenario())


def test_a_follower_resumes_after_redis_restarts(tmp_path: Path) -> None:
    """Redis stops and starts again empty: the delivery stream begins anew (its first entry names no
    predecessor the reader knows), so the follower reads its token stream from its place and gets
    exactly the events written after the restart."""
    server = RedisProcess(tmp_path / "redis")
    server.start()

    async def scenario() -> None:
        client = connect_async(server.url)
        writer = redis.Redis.from_url(server.url)
        mux = TokenStreamMux(client, delivery=True)
        delivery = KEYS.delivery(mux.deliver_to("r"))

        def append(value: bytes) -> str:
            return writer.eval(*append_event_args(token_stream("r"), delivery, "r", value, 60)).decode()

        sub = await mux.subscribe("r")
        append(b"0")
        assert [f[FIELD] for _, f in await collect(sub, 1)] == [b"0"]
        server.stop(signal.SIGTERM)
        async with asyncio.timeout(10):
            while not mux.redis_down:
                await asyncio.sleep(0.01)
        await asyncio.to_thread(server.start)
        ids = [append(b"1"), append(b"2")]
        assert [e[0] for e in await collect(sub, 2)] == ids
        assert not mux.redis_down
        await mux.close()
        await client.aclose()
        writer.close()

    try:
        asyncio.run(scenario())
    finally:
        server.stop(signal.SIGKILL)
