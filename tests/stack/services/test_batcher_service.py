"""The batcher process against a real redis-server, before any worker exists."""

from __future__ import annotations

import time
from collections.abc import Callable

import redis

from batcher.service.inbox import READ_COUNT
from common import streams
from common.protocol import FIELD, GenerateRequest, SamplingParams, encode
from harness.processes.services import Stack, wait_for


def submit(client: redis.Redis, num: int, prefix: str) -> None:
    pipe = client.pipeline(transaction=False)
    for i in range(num):
        msg = GenerateRequest(
            req_id=f"{prefix}{i}",
            prompt_token_ids=[5, 6],
            sampling_params=SamplingParams(),
            arrival_time=time.time(),
        )
        pipe.xadd(streams.REQUESTS_STREAM, {FIELD: encode(msg)})
    pipe.execute()


def test_a_burst_larger_than_one_read_is_claimed_whole(make_stack: Callable[[], Stack]) -> None:
    stack = make_stack()
    client = redis.Redis.from_url(stack.redis_url)
    # Queued before the batcher starts: its first claim must not stop at one read's worth.
    burst = READ_COUNT + 88
    submit(client, burst, "early-")
    stack.start_batcher()
    wait_for(lambda: stack.stats().get("num_waiting") == burst, 30, f"all {burst} early requests to wait")
    submit(client, 7, "late-")
    wait_for(lambda: stack.stats().get("num_waiting") == burst + 7, 30, "the later requests to wait")
    # Nothing is acknowledged before it finishes: all of them sit in the group's pending list.
    info = client.xpending(streams.REQUESTS_STREAM, streams.BATCHER_GROUP)
    assert info["pending"] == burst + 7  # type: ignore[index]
