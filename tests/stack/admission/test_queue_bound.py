"""Requests not yet claimed by any batcher count against GATEWAY_MAX_QUEUED_REQUESTS."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis
from redis.asyncio import BlockingConnectionPool

from common.protocol import GenerateRequest, SamplingParams
from common.stream_client import new_req_id, submit_once_async
from common.streams import DEFAULT_CELL, cell_keys
from gateway.limits.queue_bound import QueueBound
from harness.gateway.gateway_server import RunningGateway
from openai_frontend.protocol.errors import OpenAIError

BODY = {"prompt": "hi", "max_tokens": 2}


def test_unclaimed_requests_fill_the_queue(make_gateway: Callable[..., RunningGateway]) -> None:
    gateway = make_gateway(max_queued_requests=3)
    with ThreadPoolExecutor(max_workers=2) as pool:
        first = pool.submit(gateway.client.post, "/v1/completions", json=BODY)
        req = gateway.harness.next_request()
        # Two choices would make four: refused whole, not half-queued.
        refused = gateway.client.post("/v1/completions", json={**BODY, "n": 3})
        assert refused.status_code == 429 and refused.json()["error"]["code"] == "queue_full"
        assert refused.headers["retry-after"].isdigit()
        assert gateway.harness.num_requests() == 1
        second = pool.submit(gateway.client.post, "/v1/completions", json={**BODY, "n": 2})
        others = [gateway.harness.next_request(), gateway.harness.next_request()]
        assert gateway.client.post("/v1/completions", json=BODY).status_code == 429
        for r in [req, *others]:
            gateway.harness.emit_tokens(r.req_id, [300, 301])
        assert first.result(timeout=30).status_code == 200
        assert second.result(timeout=30).status_code == 200


def test_the_bound_can_be_turned_off(make_gateway: Callable[..., RunningGateway]) -> None:
    gateway = make_gateway(max_queued_requests=0)
    with ThreadPoolExecutor(max_workers=1) as pool:
        future = pool.submit(gateway.client.post, "/v1/completions", json={**BODY, "n": 16})
        requests = [gateway.harness.next_request() for _ in range(16)]
        for r in requests:
            gateway.harness.emit_tokens(r.req_id, [300])
        assert future.result(timeout=30).status_code == 200


def test_a_burst_does_not_overshoot_the_bound(make_gateway: Callable[..., RunningGateway]) -> None:
    """Concurrent admissions each read the queue before any was written: before, all of a burst of 40
    passed a bound of 5 (20 was overshot to 106 by one gateway), and on a loaded host 8 passed when
    requests written while a reading was in flight were counted by neither."""
    gateway = make_gateway(max_queued_requests=5)

    async def burst() -> list[int]:
        async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as client:

            async def one() -> int:  # the status only; leaving the stream aborts the request
                async with client.stream("POST", "/v1/completions", json={**BODY, "stream": True}) as r:
                    return r.status_code

            return await asyncio.gather(*(one() for _ in range(40)))

    statuses = asyncio.run(burst())
    # Never more than the bound. Fewer only if a reading sent before a request was admitted were
    # answered after that request was written: the reading counts it without asking Redis.
    admitted = statuses.count(200)
    assert 1 <= admitted <= 5 and statuses.count(429) == 40 - admitted, statuses
    assert gateway.harness.num_requests() == admitted


def test_a_written_request_not_yet_released_counts_once(redis_url: str) -> None:
    """Between a request's write and its release the stream counts it; before, the gateway counted it
    as admitted too, and a bound of 2 refused the second of two requests
    (tests/stack/admission/test_overload.py in a full run)."""

    async def scenario() -> None:
        redis = aioredis.Redis.from_url(redis_url)
        keys = cell_keys(DEFAULT_CELL)
        bound = QueueBound(max_queued=2)
        first, second, third = _request(), _request(), _request()
        await bound.check(redis, keys, first.req_id, [first.req_id])
        await submit_once_async(redis, first)  # on the stream, not released yet
        await bound.check(redis, keys, second.req_id, [second.req_id])  # 1 waiting + 1: room
        with pytest.raises(OpenAIError) as refused:  # 1 on the stream + 1 admitted + 1
            await bound.check(redis, keys, third.req_id, [third.req_id])
        assert refused.value.status == 429 and refused.value.code == "queue_full"
        await redis.aclose()

    asyncio.run(scenario())


def _request() -> GenerateRequest:
    params = SamplingParams(max_tokens=2, temperature=0.0)
    return GenerateRequest(
        req_id=new_req_id(), prompt_token_ids=[1], sampling_params=params, arrival_time=time.time()
    )


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (
            "/v1/messages",
            {"model": "tiny-llama", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]},
        ),
        ("/v1/responses", {"model": "tiny-llama", "max_output_tokens": 2, "input": "hi", "store": True}),
    ],
)
def test_a_written_request_counts_once(
    make_gateway: Callable[..., RunningGateway], path: str, body: dict[str, Any]
) -> None:
    """Once on the stream, a request is counted by the stream alone: before, Messages and Responses
    requests were also counted as admitted-not-written for 2 s, refusing the next one."""
    gateway = make_gateway(max_queued_requests=2)
    with ThreadPoolExecutor(max_workers=2) as pool:
        first = pool.submit(gateway.client.post, path, json=body)
        req = gateway.harness.next_request()
        second = pool.submit(gateway.client.post, "/v1/completions", json=BODY)
        other = gateway.harness.next_request()
        for r in [req, other]:
            gateway.harness.emit_tokens(r.req_id, [300, 301])
        assert first.result(timeout=30).status_code == 200
        assert second.result(timeout=30).status_code == 200


def test_a_request_admitted_during_a_reading_counts_once(redis_url: str) -> None:
    """A reading sent before another request's admission that reaches Redis after that request's
    write sees it on the stream, and counted it again as admitted since: a bound of 2 refused the
    second of two requests (tests/stack/admission/test_overload.py in a full run, where the second
    reading waited for a new connection). The check reads again, with that request in its view."""

    async def scenario() -> None:
        redis = aioredis.Redis.from_url(redis_url)
        # The second request's client: one connection, which a blocking pop holds until released.
        held = aioredis.Redis(connection_pool=BlockingConnectionPool.from_url(redis_url, max_connections=1))
        keys = cell_keys(DEFAULT_CELL)
        bound = QueueBound(max_queued=2)
        first, second = _request(), _request()

        async def hold_connection() -> None:
            await held.blpop(["hold"], timeout=0)

        hold = asyncio.create_task(hold_connection())
        await _until(lambda: _blocked_clients(redis), "the connection to be held")
        check = asyncio.create_task(bound.check(held, keys, second.req_id, [second.req_id]))
        await asyncio.sleep(0)  # one turn of the loop: the check runs until it waits for the connection
        assert not check.done() and bound._unseen[keys.cell].readings  # its reading begun, not sent
        await bound.check(redis, keys, first.req_id, [first.req_id])
        await submit_once_async(redis, first)
        bound.release(keys.cell, first.req_id)
        await redis.lpush("hold", "go")
        await hold
        await check  # 1 waiting + 1: room
        await redis.aclose()
        await held.aclose()

    asyncio.run(scenario())


async def _blocked_clients(redis: aioredis.Redis) -> bool:
    info = await redis.info("clients")
    return int(info["blocked_clients"]) > 0


async def _until(condition: Callable[[], Awaitable[bool]], what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not await condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s}s waiting for {what}")
        await asyncio.sleep(0.01)
