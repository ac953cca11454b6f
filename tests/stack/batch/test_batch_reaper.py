"""The batch reaper on a real Redis and real Celery messages (no worker runs them): it queues again
an active batch that no task holds, only on its second look, and never one with a claim, a queued
message or a delivered, unacknowledged one; it forgets batches that ended."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
import redis
from celery import Celery
from kombu import Connection

from cbserve_celery.batch_reaper import BatchReaper
from cbserve_celery.broker_scan import batches_in_broker
from common.redis_io.redis_conn import connect_async
from common.streams import ACTIVE_BATCHES, BATCH_REAPER_TURN, batch_claim
from openai_frontend.batch.files_store import FileStore
from openai_frontend.batch.objects import RUN_BATCH_TASK, BatchParams
from openai_frontend.batch.store import BatchStore
from openai_frontend.model.served_model import ModelRules


@pytest.fixture()
def app(redis_url: str) -> Iterator[Celery]:
    app = Celery("reaper-test", broker=redis_url, set_as_current=False)
    app.conf.update(task_serializer="json", accept_content=["json"])
    try:
        yield app
    finally:
        app.close()


async def _create(redis_url: str, batch_id: str) -> None:
    redis = connect_async(redis_url)
    try:
        until = int(time.time()) + 3600
        meta = await FileStore(redis).put("alice", "in.jsonl", "batch", b"{}\n", expires_at=until)
        params = BatchParams(
            id=batch_id,
            endpoint="/v1/completions",
            input_file_id=meta.id,
            completion_window="24h",
            created_at=until - 3600,
            expires_at=until,
            retain_until=until,
            owner="alice",
            models=[ModelRules(name="m", max_model_len=64)],
        )
        assert await BatchStore(redis).create(params)
    finally:
        await redis.aclose()


def _look(reaper: BatchReaper, r: redis.Redis) -> list[str]:
    r.delete(BATCH_REAPER_TURN)  # each call is a look of its own, not a worker that lost the turn
    return reaper.tick()


def _queued_batches(redis_url: str, wanted: set[str]) -> set[str]:
    async def scan() -> set[str]:
        client = connect_async(redis_url)
        try:
            return await batches_in_broker(client, ["celery"], wanted)
        finally:
            await client.aclose()

    return asyncio.run(scan())


def test_an_orphaned_batch_is_queued_again_on_the_second_look(app: Celery, redis_url: str) -> None:
    asyncio.run(_create(redis_url, "batch_orphan"))
    r = redis.Redis.from_url(redis_url)
    reaper = BatchReaper(app, redis_url, interval_s=1.0)
    assert _look(reaper, r) == []  # the first look only remembers it
    assert _queued_batches(redis_url, {"batch_orphan"}) == set()
    assert _look(reaper, r) == ["batch_orphan"]
    assert _queued_batches(redis_url, {"batch_orphan"}) == {"batch_orphan"}
    assert _look(reaper, r) == []  # its message is queued now
    assert _look(reaper, r) == []


def test_a_look_is_taken_once_per_interval_across_workers(app: Celery, redis_url: str) -> None:
    asyncio.run(_create(redis_url, "batch_orphan"))
    r = redis.Redis.from_url(redis_url)
    first, second = BatchReaper(app, redis_url, 3600.0), BatchReaper(app, redis_url, 3600.0)
    assert first.tick() == []  # takes the turn for an hour: its first look
    assert second.tick() == [] and r.pttl(BATCH_REAPER_TURN) > 3_000_000
    assert _look(second, r) == ["batch_orphan"]  # the turn gone: the second look


def test_a_batch_held_by_a_task_is_left_alone(app: Celery, redis_url: str) -> None:
    for batch_id in ("batch_claimed", "batch_queued", "batch_delivered"):
        asyncio.run(_create(redis_url, batch_id))
    r = redis.Redis.from_url(redis_url)
    r.set(batch_claim("batch_claimed"), "token", px=60_000)  # a task runs it
    app.send_task(RUN_BATCH_TASK, args=["batch_queued"])
    app.send_task(RUN_BATCH_TASK, args=["batch_delivered"])
    with Connection(redis_url) as conn:
        queue = conn.SimpleQueue("celery", no_ack=False)
        # A worker takes the oldest first and holds it unacknowledged (a running or an ETA task).
        delivered = queue.get(timeout=5)
        assert delivered.headers["argsrepr"] == "['batch_queued']"
        reaper = BatchReaper(app, redis_url, interval_s=1.0)
        assert _look(reaper, r) == [] and _look(reaper, r) == []
        assert r.hlen("unacked") == 1 and r.llen("celery") == 1
        queue.close()


def test_ended_batches_are_forgotten(app: Celery, redis_url: str) -> None:
    asyncio.run(_create(redis_url, "batch_done"))
    r = redis.Redis.from_url(redis_url)

    async def complete() -> None:
        client = connect_async(redis_url)
        try:
            assert await BatchStore(client).transition("batch_done", ["validating"], "failed")
        finally:
            await client.aclose()

    asyncio.run(complete())
    reaper = BatchReaper(app, redis_url, interval_s=1.0)
    assert _look(reaper, r) == [] and _look(reaper, r) == []
    assert r.zcard(ACTIVE_BATCHES) == 0
