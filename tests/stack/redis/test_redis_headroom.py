"""Admission keeps headroom in a Redis with `maxmemory`: new requests are refused before it is full.

Before, the gateway admitted until Redis refused a write: the requests already running then could not
write their tokens and waited in silence, and a burst of 100 streams filled Redis. Now a burst into a
Redis with little room gets, per client, either every token or 503 `redis_full` at once; Redis never
refuses a write (no service meets OOM), and admission resumes by itself once memory is freed.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

import httpx
import redis

from gateway.limits.cell_guard import CACHE_S
from harness.processes.services import Stack, wait_for

NUM_STREAMS = 100
MAX_TOKENS = 200
HEADROOM = 0.1  # GATEWAY_REDIS_MEMORY_HEADROOM's default
# Admission stops this far above what Redis holds before the burst: about 28 of the burst's
# reservations (27.7 KB each, held RESERVE_S), so that it fills even when a loaded host spreads the
# burst's arrivals over seconds (at 56 a 2-core CI run once served all 100).
ROOM_BYTES = 3 * 2**18
ANSWERED_WITHIN_S = 10.0  # every client has its first token or its refusal this soon
# Short windows, so that what finished requests leave expires within the test.
ENV = {"CBSERVE_RETENTION_S": "3"}
BATCHER_ENV = {**ENV, "BATCHER_TRACE_MAXLEN": "0"}


async def _stream(
    client: httpx.AsyncClient, prompt: list[int], max_tokens: int
) -> tuple[int, str, int, float]:
    """(status, error code or finish reason, tokens, seconds to the first answer) of one client."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, "stream": True}
    body["return_token_ids"] = True
    started = time.monotonic()
    first_at: float | None = None
    num_tokens, end = 0, ""
    async with client.stream("POST", "/v1/completions", json=body) as response:
        if response.status_code != 200:
            error = json.loads(await response.aread())["error"]
            assert int(response.headers["Retry-After"]) > 0, response.headers
            return response.status_code, error["code"], 0, time.monotonic() - started
        async for line in response.aiter_lines():
            if not line.startswith("data: {"):
                continue
            first_at = first_at or time.monotonic()
            event: Any = json.loads(line[len("data: ") :])
            if "error" in event:
                return 200, event["error"]["code"], num_tokens, first_at - started
            choice = event["choices"][0]
            num_tokens += len(choice.get("token_ids") or [])
            end = choice.get("finish_reason") or end
    return 200, end, num_tokens, (first_at or time.monotonic()) - started


async def _burst(base_url: str, max_tokens: int = MAX_TOKENS) -> list[tuple[int, str, int, float]]:
    limits = httpx.Limits(max_connections=NUM_STREAMS)
    async with httpx.AsyncClient(base_url=base_url, timeout=120, limits=limits) as client:
        prompts = [[5 + i % 200, 6, 7] for i in range(NUM_STREAMS)]
        return await asyncio.gather(*(_stream(client, p, max_tokens) for p in prompts))


def test_a_burst_into_a_nearly_full_redis_is_served_or_refused(make_stack: Callable[[], Stack]) -> None:
    stack = make_stack().start_all(batcher_env=BATCHER_ENV, worker_env=ENV, gateway_env=ENV)
    client: Any = redis.Redis.from_url(stack.redis_url)
    # The gateway's pool opens a connection per concurrent command, each about 40 KiB of Redis'
    # used_memory: a first burst opens them, so that the room measured is the requests' own.
    assert all(r[:2] == (200, "length") for r in asyncio.run(_burst(stack.base_url, 1)))
    used = int(client.info("memory")["used_memory"])
    client.config_set("maxmemory", int((used + ROOM_BYTES) / (1 - HEADROOM)))
    # The gateway's last reading (cached CACHE_S) may predate maxmemory: on a fast host the whole
    # burst would be admitted on it. Its expiry is a fixed time, not a condition to poll.
    time.sleep(CACHE_S * 2)
    try:
        results = asyncio.run(_burst(stack.base_url))
        stack.check_alive()
        served = [r for r in results if r[0] == 200]
        refused = [r for r in results if r[0] != 200]
        assert all(r[1:3] == ("length", MAX_TOKENS) for r in served), [r for r in served if r[1] != "length"]
        assert all(r[:2] == (503, "redis_full") for r in refused), refused
        assert served and refused, (len(served), len(refused), used)
        assert max(r[3] for r in results) < ANSWERED_WITHIN_S, sorted(r[3] for r in results)[-5:]
        for name in ("batcher", "worker0"):  # Redis never had to refuse them a write
            assert "maxmemory" not in stack.log(name), stack.log(name)
        # What the burst left expires with the retention window: admission resumes by itself.
        health = f"{stack.base_url}/health"
        wait_for(lambda: httpx.get(health, timeout=5).status_code == 200, 60, "/health to say ok again")
        # Admission also counts what it admitted in the last RESERVE_S (10 s) on top of Redis' own
        # figure, so on a fast host it may refuse a little longer than /health does.
        body = {"prompt": [5, 6, 7], "max_tokens": 4}
        completions = f"{stack.base_url}/v1/completions"
        wait_for(lambda: httpx.post(completions, json=body, timeout=30).status_code == 200, 60, "admission")
    finally:
        client.config_set("maxmemory", 0)
        client.close()


def test_health_and_admission_say_nearly_full(make_stack: Callable[[], Stack]) -> None:
    stack = make_stack().start_all()
    client: Any = redis.Redis.from_url(stack.redis_url)
    used = int(client.info("memory")["used_memory"])
    client.config_set("maxmemory", int(used / 0.97))  # 97% used: past the 10% headroom, not full
    try:
        response = httpx.get(f"{stack.base_url}/health", timeout=5)
        assert response.status_code == 503 and response.json()["reason"] == "redis_nearly_full"
        body = {"prompt": [5, 6, 7], "max_tokens": 4}
        response = httpx.post(f"{stack.base_url}/v1/completions", json=body, timeout=30)
        assert response.status_code == 503 and int(response.headers["Retry-After"]) > 0, response.text
        error = response.json()["error"]
        assert error["code"] == "redis_full" and "maxmemory" in error["message"], error
    finally:
        client.config_set("maxmemory", 0)
    wait_for(lambda: httpx.get(f"{stack.base_url}/health", timeout=5).status_code == 200, 10, "/health ok")

    def admitted() -> bool:  # within a reading (half a second) of memory being freed
        return httpx.post(f"{stack.base_url}/v1/completions", json=body, timeout=30).status_code == 200

    wait_for(admitted, 10, "a new request to be served", interval=0.2)
    client.close()
