"""Redis refuses writes (full: `maxmemory` with `noeviction`) while streams run: no batcher exits.

The active batcher keeps its lease (renewing it is not refused: PEXPIRE does not grow memory), its
state and the writes Redis refused, and retries them with backoff; the standby keeps standing by.
Once memory is freed every stream goes on from where it was, with `generate`'s tokens, under the same
leader (epoch 1, nothing rebuilt).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import redis

from common import streams
from harness.load import fault_clients as fault
from harness.processes.services import Stack, wait_for

MAX_TOKENS = fault.MAX_TOKENS
BATCHER_ENV = fault.FAST_TAKEOVER_ENV  # a 1 s lease: a batcher that did not renew it loses it fast
REFUSED = "maxmemory"  # in the line each service logs when Redis first refuses a write


cases = fault.cases_fixture(25, 4, MAX_TOKENS)


def _lease(client: redis.Redis) -> tuple[str, int]:
    raw: Any = client.get(streams.BATCHER_LEASE)
    return (raw.decode() if raw else ""), int(client.pttl(streams.BATCHER_LEASE))


def test_batchers_keep_lease_and_state_while_redis_is_full(
    make_stack: Callable[[], Stack], cases: fault.FaultCases
) -> None:
    prompts, expected = cases
    stack = make_stack()
    client = stack.redis()
    stack.start_batcher("batcher-a", BATCHER_BATCHER_ID="batcher-a", **BATCHER_ENV)
    wait_for(lambda: _lease(client)[0] == "1:batcher-a", 30, "the first batcher to lead")
    stack.start_batcher("batcher-b", BATCHER_BATCHER_ID="batcher-b", **BATCHER_ENV)
    stack.start_worker("worker0", **fault.WORKER_ENV)
    stack.start_gateway()
    stack.wait_ready(num_workers=1)
    wait_for(lambda: "on standby" in stack.log("batcher-b"), 30, "the second batcher to stand by")

    def fill() -> None:
        client.config_set("maxmemory", 1)  # every write that may grow memory is refused: OOM

    def ride_out_then_free() -> None:
        def refused() -> bool:
            stack.check_alive()  # before the fix the leader (then the worker) exited on OutOfMemoryError
            return REFUSED in stack.log("batcher-a") and REFUSED in stack.log("worker0")

        wait_for(refused, 60, "the leader and the worker to meet the refusal")
        # The lease outlives its 1 s TTL while Redis is full: the leader renews it.
        _, ttl_ms = _lease(client)
        wait_for(lambda: _lease(client)[1] > ttl_ms, 30, "the leader to renew its lease")
        assert _lease(client)[0] == "1:batcher-a"
        stack.check_alive()
        client.config_set("maxmemory", 0)

    seen, _ = asyncio.run(
        fault.run_with_fault(
            stack.base_url, prompts, MAX_TOKENS, fault.TOKENS_BEFORE_FAULT, fill, ride_out_then_free
        )
    )
    fault.check_clients(seen, expected)
    stack.check_alive()
    stats = stack.stats_after(len(prompts))
    # The same leader served on with the state it had: nothing taken over, nothing rebuilt.
    assert stats["epoch"] == 1 and stats["num_recovered"] == 0, stats
    assert _lease(client)[0] == "1:batcher-a"
    assert "redis takes writes again" in stack.log("batcher-a")
    client.close()


def test_batcher_stands_by_until_a_full_redis_takes_its_lease(make_stack: Callable[[], Stack]) -> None:
    """Taking the lease is a write (INCR, SET): refused while Redis is full, retried, never fatal."""
    stack = make_stack()
    client = stack.redis()
    client.config_set("maxmemory", 1)
    stack.start_batcher("batcher", BATCHER_BATCHER_ID="batcher", **BATCHER_ENV)

    def refused() -> bool:
        stack.check_alive()  # before the fix it exited on OutOfMemoryError in Leadership.acquire
        return REFUSED in stack.log("batcher")

    wait_for(refused, 60, "the batcher to meet the refusal")
    assert _lease(client)[0] == ""
    client.config_set("maxmemory", 0)
    wait_for(lambda: _lease(client)[0] == "1:batcher", 30, "the batcher to take the lease")
    wait_for(lambda: "active (epoch 1)" in stack.log("batcher"), 30, "the batcher to serve")
    stack.check_alive()
    client.close()
