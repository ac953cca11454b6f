"""Redis restarts without its data (no AOF): every request in flight ends with `request_lost`.

Seven requests wait in the batcher's queue (no worker yet); Redis is killed and started again empty.
Each streamed one gets an error event naming the loss, the non-streamed one a 503, within seconds of
the restart. Before, they waited in silence for the request timeout (an hour): nothing would ever
write to their token streams again. No service exits; a worker started afterwards serves new requests.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from harness.processes.redis_process import RedisProcess, running_redis
from harness.processes.services import Stack, wait_for

NUM_STREAMS = 6
BODY = {"prompt": [5, 6, 7], "max_tokens": 8, "temperature": 0}
LOST_WITHIN_S = 30.0  # from the restart to the last client's error


@pytest.fixture()
def lost(tiny_model_dir: Path, tmp_path: Path) -> Iterator[tuple[Stack, RedisProcess]]:
    """A Stack (nothing started yet) on a Redis the test can restart; every process stopped after."""
    with running_redis(tmp_path / "redis") as redis_proc:
        stack = Stack(redis_url=redis_proc.url, model_dir=tiny_model_dir, log_dir=tmp_path)
        try:
            yield stack, redis_proc
        finally:
            stack.stop()


async def _stream_error(client: httpx.AsyncClient, started: asyncio.Event) -> tuple[dict[str, Any], float]:
    async with client.stream("POST", "/v1/completions", json={**BODY, "stream": True}) as response:
        assert response.status_code == 200, await response.aread()
        started.set()
        async for line in response.aiter_lines():
            if line.startswith("data: {"):
                event = json.loads(line[len("data: ") :])
                assert "error" in event, event  # no worker: no token before the loss
                return event["error"], time.monotonic()
    raise AssertionError("the stream ended without an error event")


async def _collected(client: httpx.AsyncClient) -> tuple[int, dict[str, Any], float]:
    response = await client.post("/v1/completions", json=BODY)
    return response.status_code, response.json(), time.monotonic()


async def _lose_redis_under_requests(stack: Stack, redis_proc: RedisProcess) -> float:
    """Returns how long after the restart the last client got its error."""
    async with httpx.AsyncClient(base_url=stack.base_url, timeout=120) as client:
        events = [asyncio.Event() for _ in range(NUM_STREAMS)]
        tasks = [asyncio.create_task(_stream_error(client, e)) for e in events]
        collected = asyncio.create_task(_collected(client))
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in events)), 30)

        def all_queued() -> bool:
            stack.check_alive()
            return stack.stats().get("num_waiting", 0) >= NUM_STREAMS + 1

        await asyncio.to_thread(wait_for, all_queued, 30, "the batcher to hold every request")
        redis_proc.stop(signal.SIGKILL)
        shutil.rmtree(redis_proc.data_dir / "appendonlydir")  # started again with nothing
        redis_proc.start()
        restarted_at = time.monotonic()
        errors = await asyncio.wait_for(asyncio.gather(*tasks), LOST_WITHIN_S + 30)
        status, body, collected_at = await asyncio.wait_for(collected, 30)
    assert status == 503 and body["error"]["code"] == "request_lost", (status, body)
    assert all(error["code"] == "request_lost" for error, _ in errors), errors
    assert "lost" in errors[0][0]["message"]
    return max([collected_at] + [at for _, at in errors]) - restarted_at


def test_requests_lost_in_a_redis_restart_end_with_an_error(lost: tuple[Stack, RedisProcess]) -> None:
    stack, redis_proc = lost
    stack.start_batcher()
    stack.start_gateway()

    def serving() -> bool:
        return stack.answers("/v1/models") and "updated_at" in stack.stats()

    wait_for(serving, 60, "the gateway and the batcher to serve")
    lost_after_s = asyncio.run(_lose_redis_under_requests(stack, redis_proc))
    assert lost_after_s < LOST_WITHIN_S, lost_after_s

    stack.check_alive()  # nothing exited on the empty Redis
    stack.start_worker()
    stack.wait_ready(num_workers=1)
    response = httpx.post(f"{stack.base_url}/v1/completions", json=BODY, timeout=60)
    assert response.status_code == 200 and response.json()["choices"][0]["finish_reason"] == "length"
