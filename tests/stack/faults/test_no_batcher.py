"""No batcher serves the queue: requests already placed fail with `no_batcher`, new ones are refused.

Before, a request placed after the batcher died was accepted and waited in silence for as long as the
client did (its queue deadline is the batcher's to enforce, and the batcher was gone), and one sent
once /health said `no_batcher` was accepted all the same.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections.abc import Callable
from typing import Any

import httpx

from common.redis_io.batcher_liveness import BATCHER_SILENT_S
from harness.processes.services import Stack, wait_for
from openai_frontend.follow.stream_watch import NO_BATCHER_FAIL_S, WATCH_INTERVAL_S

BODY = {"prompt": [5, 6, 7], "max_tokens": 8, "temperature": 0}
# A request is failed once the batcher has been silent BATCHER_SILENT_S and then gone NO_BATCHER_FAIL_S.
FAILED_WITHIN_S = BATCHER_SILENT_S + NO_BATCHER_FAIL_S + 2 * WATCH_INTERVAL_S + 2


async def _stream_error(client: httpx.AsyncClient) -> tuple[dict[str, Any], float]:
    """The error event a streamed request ends with, and when it came (time.monotonic())."""
    async with client.stream("POST", "/v1/completions", json={**BODY, "stream": True}) as response:
        assert response.status_code == 200, await response.aread()
        async for line in response.aiter_lines():
            if line.startswith("data: {"):
                event = json.loads(line[len("data: ") :])
                assert "error" in event, event  # no token: nothing schedules the request
                return event["error"], time.monotonic()
    raise AssertionError("the stream ended without an error event")


async def _collected_error(client: httpx.AsyncClient) -> tuple[int, dict[str, Any], float]:
    response = await client.post("/v1/completions", json=BODY)
    # A 503 says when to retry, also when the request failed after it was placed.
    assert int(response.headers.get("Retry-After", "0")) > 0, response.headers
    return response.status_code, response.json()["error"], time.monotonic()


async def _placed_after_the_batcher_died(base_url: str) -> float:
    async with httpx.AsyncClient(base_url=base_url, timeout=60) as client:
        sent_at = time.monotonic()
        streams = asyncio.gather(*(_stream_error(client) for _ in range(2)))
        status, error, collected_at = await _collected_error(client)
        stream_errors = await streams
    assert status == 503 and error["code"] == "no_batcher", (status, error)
    assert all(e["code"] == "no_batcher" for e, _ in stream_errors), stream_errors
    return max([collected_at] + [at for _, at in stream_errors]) - sent_at


def test_requests_fail_and_are_refused_without_a_batcher(make_stack: Callable[[], Stack]) -> None:
    stack = make_stack().start_all()
    batcher = stack.procs.pop("batcher")
    batcher.send_signal(signal.SIGKILL)
    batcher.wait()
    killed_at = time.monotonic()

    # Placed while /health still says ok (the batcher's stats are fresh): accepted, then failed.
    waited_s = asyncio.run(_placed_after_the_batcher_died(stack.base_url))
    assert waited_s < FAILED_WITHIN_S, waited_s

    def health() -> httpx.Response:
        return httpx.get(f"{stack.base_url}/health", timeout=10)

    wait_for(lambda: health().status_code == 503, 5, "/health to say no batcher")
    assert health().json()["reason"] == "no_batcher"
    assert time.monotonic() - killed_at < FAILED_WITHIN_S
    # Once no batcher serves the cell, a new request is refused at once, with when to retry; a
    # streamed one too, before any SSE header is sent.
    for body in (BODY, {**BODY, "stream": True}):
        started = time.monotonic()
        response = httpx.post(f"{stack.base_url}/v1/completions", json=body, timeout=30)
        assert response.status_code == 503 and response.json()["error"]["code"] == "no_batcher", response.text
        assert response.headers["content-type"] == "application/json"
        assert int(response.headers["Retry-After"]) > 0 and time.monotonic() - started < 2

    stack.start_batcher()
    wait_for(lambda: health().status_code == 200, 60, "/health to say ok with a new batcher")
    response = httpx.post(f"{stack.base_url}/v1/completions", json=BODY, timeout=60)
    assert response.status_code == 200 and response.json()["choices"][0]["finish_reason"] == "length"
    stack.check_alive()
