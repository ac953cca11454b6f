"""A gateway's follow deadlines in a real Redis, when two of its clients follow one request."""

from __future__ import annotations

import asyncio
import time

import redis.asyncio as aioredis

from common.streams import FOLLOW_DEADLINES
from openai_frontend.follow.deadlines import FollowDeadlines


def test_the_end_seen_by_a_resumed_client_outlasts_the_one_that_left(redis_url: str) -> None:
    """The first client left but its stream notices only after the resumed one saw the request end:
    the request ended, so no resume window may start after that."""

    async def run() -> float | None:
        client = aioredis.Redis.from_url(redis_url)
        deadlines = FollowDeadlines(client, ahead_s=10.0)
        deadlines.hold("r")  # the first client
        deadlines.hold("r")  # the resumed client
        deadlines.release("r", ended=True)  # the resumed client read the last token
        deadlines.release("r", ended=False, grace_s=30.0)  # the first one's stream notices it is gone
        await deadlines.close()
        score = await client.zscore(FOLLOW_DEADLINES, "r")
        await client.aclose()
        return score

    assert asyncio.run(run()) is None


def test_a_client_that_left_alone_starts_the_window(redis_url: str) -> None:
    async def run() -> float | None:
        client = aioredis.Redis.from_url(redis_url)
        deadlines = FollowDeadlines(client, ahead_s=10.0)
        deadlines.hold("r")
        async with asyncio.timeout(10):  # the first write is in
            while await client.zscore(FOLLOW_DEADLINES, "r") is None:
                await asyncio.sleep(0.01)
        deadlines.release("r", ended=False, grace_s=30.0)
        await deadlines.close()
        score = await client.zscore(FOLLOW_DEADLINES, "r")
        await client.aclose()
        return score

    score = asyncio.run(run())
    assert score is not None and time.time() + 25 < score <= time.time() + 30
