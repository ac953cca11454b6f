"""openai_frontend/follow/stream_watch.py on a real Redis: a request subscribed while a check is in
flight is judged lost when Redis loses it; one no longer followed is not judged. In a full run
tests/stack/redis/test_redis_lost.py lost one request so: its follower subscribed during the check
before the restart, the check then dropped it from the requests seen, and it waited out the test."""

from __future__ import annotations

import asyncio

import redis.asyncio as aioredis

from common.streams import DEFAULT_CELL, submitted_key
from openai_frontend.follow.stream_watch import StreamWatch


async def _judged_lost(redis_url: str) -> list[str]:
    redis = aioredis.Redis.from_url(redis_url)
    try:
        watch = StreamWatch(redis, DEFAULT_CELL)
        for req_id in ("early", "late", "gone"):
            await redis.set(submitted_key(req_id), 1)  # submitted by its follower
        watch.seen.update(("early", "gone"))
        await redis.execute_command("CLIENT", "PAUSE", 300, "ALL")  # holds the check's round trips
        check = asyncio.create_task(watch.failures(["early", "gone"]))
        while watch.checked_at == float("-inf"):  # the check has started
            await asyncio.sleep(0)
        watch.seen.add("late")  # subscribed meanwhile, as CellStreamMux.subscribe does
        assert not check.done()
        assert await check == []
        watch.forget("gone")  # its follower stopped (CellStreamMux.unsubscribe)
        await redis.flushall()  # Redis restarted without its data
        return [error.req_id for error in await watch.failures(["early", "late"])]
    finally:
        await redis.aclose()


def test_requests_subscribed_during_a_check_are_judged_lost(redis_url: str) -> None:
    assert sorted(asyncio.run(_judged_lost(redis_url))) == ["early", "late"]
