"""Redis goes down mid-generation and comes back on the same port and data dir (AOF everysec).

Two workers share six greedy streams. Once every stream has a few tokens, Redis is stopped:
- `sigterm`: a clean stop, which flushes the AOF; nothing is lost.
- `sigkill-lost-writes`: SIGKILL, then the AOF is cut back to what it held a few steps earlier. A
  killed redis-server process loses nothing the OS already has (it writes the AOF before it replies);
  what AOF everysec can lose is the last second or so that the OS had not written to disk when the
  *machine* went down. Cutting the file simulates exactly that: token events the clients already
  have, step results, acks and steps are gone from Redis.

While Redis is down `/health` says degraded and a new request gets 503 with Retry-After. After the
restart every service reconnects with backoff, the batcher rebuilds its state as on a takeover, and
every client stream ends with exactly `generate`'s tokens on its first connection: no error, no
repeated or missing token, SSE ids increasing, nothing left pending. Once `/health` is 200 again,
50 concurrent new requests all succeed within 5 s (no dead pooled connection fails one of them).
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from common import streams
from harness.load import fault_clients as fault
from harness.processes.redis_process import RedisProcess
from harness.processes.services import Stack, wait_for

NUM_STREAMS = 6
MAX_TOKENS = 96
TOKENS_BEFORE_FAULT = 4
LOST_TOKENS = 6  # per stream, in the lost-writes case: written to Redis, sent to clients, then lost
NUM_BURST = 50  # concurrent requests sent once /health answers 200 again
BURST_WITHIN_S = 5.0


cases = fault.cases_fixture(5, NUM_STREAMS, MAX_TOKENS)


@pytest.fixture()
def redis_proc(tmp_path: Path) -> Iterator[RedisProcess]:
    proc = RedisProcess(tmp_path / "redis")
    proc.start()
    try:
        yield proc
    finally:
        proc.stop(signal.SIGKILL)


@pytest.fixture()
def stack(redis_proc: RedisProcess, tiny_model_dir: Path, tmp_path: Path) -> Iterator[Stack]:
    stack = Stack(redis_url=redis_proc.url, model_dir=tiny_model_dir, log_dir=tmp_path)
    try:
        yield stack.start_all(2, batcher_env=fault.FAST_TAKEOVER_ENV, worker_env=fault.WORKER_ENV)
    finally:
        stack.stop()


def _health(base_url: str) -> tuple[int, dict[str, Any]]:
    resp = httpx.get(f"{base_url}/health", timeout=5)
    return resp.status_code, resp.json()


def _token_lengths(client: redis.Redis) -> dict[str, int]:
    keys = [k.decode() for k in client.scan_iter(match=streams.token_stream("*"))]  # type: ignore[union-attr]
    return {k: int(client.xlen(k)) for k in keys}  # type: ignore[arg-type]


def _check(
    stack: Stack, expected: list[list[int]], seen: list[fault.ClientStream], burst_ids: list[str]
) -> None:
    fault.check_clients(seen, expected)
    for i, s in enumerate(seen):
        ids = [tuple(int(p) for p in e.split("-")) for e in s.entry_ids]
        assert ids == sorted(set(ids)), f"stream {i}: SSE ids repeat or go back: {s.entry_ids}"
    token_streams = fault.raw_token_events(stack.redis_url, skip=burst_ids)
    assert len(token_streams) == NUM_STREAMS
    for events in token_streams:
        fault.check_one_token_per_index(events, MAX_TOKENS)
    client = redis.Redis.from_url(stack.redis_url)
    assert client.xpending(streams.REQUESTS_STREAM, streams.BATCHER_GROUP)["pending"] == 0
    stats = stack.stats()
    # The batcher rebuilt every request from Redis after the outage, as on a takeover.
    assert stats["num_recovered"] == NUM_STREAMS and stats["num_failed"] == 0, stats
    assert "recovering as on a takeover" in stack.log("batcher")


@pytest.mark.parametrize("mode", ["sigterm", "sigkill-lost-writes"])
def test_streams_survive_a_redis_restart(
    mode: str, stack: Stack, redis_proc: RedisProcess, cases: fault.FaultCases
) -> None:
    prompts, expected = cases
    base_url = stack.base_url
    probe = redis.Redis.from_url(redis_proc.url)
    restarted_at = [0.0]

    def stop_redis() -> None:
        if mode == "sigterm":
            redis_proc.stop(signal.SIGTERM)
            return
        # Remember how far the AOF got, let every stream run a few more tokens past it (the
        # clients receive them), then lose them: SIGKILL, and the AOF cut back to that point.
        aof = redis_proc.aof_incr_file()
        cut_at = aof.stat().st_size
        before = _token_lengths(probe)
        wait_for(
            lambda: all(n >= before[k] + LOST_TOKENS for k, n in _token_lengths(probe).items()),
            30,
            "tokens to be written past the cut",
        )
        redis_proc.stop(signal.SIGKILL)
        with aof.open("r+b") as f:
            f.truncate(cut_at)

    def outage_then_restart() -> None:
        def degraded() -> bool:
            status, body = _health(base_url)
            return status == 503 and body["message"].startswith("degraded: redis unreachable")

        wait_for(degraded, 10, "/health to say degraded")
        resp = httpx.post(f"{base_url}/v1/completions", json={"prompt": [5, 6], "max_tokens": 2}, timeout=10)
        assert resp.status_code == 503 and int(resp.headers["Retry-After"]) > 0, resp.text
        assert resp.json()["error"]["code"] == "redis_unavailable"
        stack.check_alive()  # nobody crashed on the outage
        redis_proc.start()
        restarted_at[0] = time.monotonic()
        wait_for(lambda: _health(base_url)[0] == 200, 30, "/health to answer 200 again")
        burst_s[0], burst_ids[:] = asyncio.run(_burst(base_url))

    burst_s = [0.0]
    burst_ids: list[str] = []

    seen, fault_at = asyncio.run(
        fault.run_with_fault(
            base_url, prompts, MAX_TOKENS, TOKENS_BEFORE_FAULT, stop_redis, outage_then_restart
        )
    )
    stack.check_alive()
    _check(stack, expected, seen, burst_ids)
    # Client-visible recovery: from Redis answering again to the last stream's next token.
    recovery_s = max(next(t for t in s.arrivals if t > restarted_at[0]) - restarted_at[0] for s in seen)
    print(
        f"\nredis {mode}: down {restarted_at[0] - fault_at:.2f}s, longest client wait "
        f"{fault.longest_wait(seen, fault_at):.2f}s, recovery after restart {recovery_s:.2f}s, "
        f"{NUM_BURST} new requests after /health said ok: {burst_s[0]:.2f}s"
    )
    assert recovery_s < 10
    # Once /health says ok, new requests are accepted: no dead pooled connection fails one of them.
    assert burst_s[0] < BURST_WITHIN_S, f"{NUM_BURST} requests took {burst_s[0]:.2f}s after /health said ok"


async def _burst(base_url: str) -> tuple[float, list[str]]:
    """NUM_BURST concurrent requests; each must succeed. Returns how long they took together, and
    their request ids."""
    started = time.monotonic()
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as client:
        body = {"prompt": [5, 6, 7], "max_tokens": 1}
        replies = await asyncio.gather(*(client.post("/v1/completions", json=body) for _ in range(NUM_BURST)))
    failed = [r.text for r in replies if r.status_code != 200]
    assert not failed, f"{len(failed)} of {NUM_BURST} requests failed after the restart: {failed[:3]}"
    return time.monotonic() - started, [r.json()["id"].removeprefix("cmpl-") for r in replies]
