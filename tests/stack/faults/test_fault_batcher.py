"""The batcher dies (SIGKILL) or stalls (SIGSTOP) mid-generation: every client stream goes on.

Two workers share eight greedy streams. Once every stream has a few tokens the batcher is killed and
a new one started, or a standby running from the start takes the lease over. The new batcher rebuilds
its state from Redis alone (the group's pending list plus each request's token stream), so each
client gets exactly `generate`'s tokens with no error, gap or repeat, and each raw token stream holds
every index exactly once. Results in the inbox carry the epoch of the batcher whose step they
answer: no request may be scheduled by the old and the new batcher at once.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis

from batcher.service.leadership import Leadership, LeadershipLost
from batcher.service.loop import Batcher
from batcher.settings import BatcherSettings
from common import streams
from common.protocol import (
    FIELD,
    GenerateRequest,
    ModelRunnerOutput,
    SamplingParams,
    WorkerInfo,
    encode,
)
from harness.load import fault_clients as fault
from harness.processes.services import Stack, wait_for

BATCHER_ENV = fault.FAST_TAKEOVER_ENV
LEASE_TTL_S = float(BATCHER_ENV["BATCHER_LEASE_TTL_S"])


cases = fault.cases_fixture(11)


def _lease_holder(stack: Stack) -> str:
    raw: Any = redis.Redis.from_url(stack.redis_url).get(streams.BATCHER_LEASE)
    return raw.decode() if raw else ""


def _start(make_stack: Callable[[], Stack], batcher_ids: list[str]) -> Stack:
    """The first batcher takes the lease before the others start, so the test knows who is active."""
    stack = make_stack()
    first, *standbys = batcher_ids
    stack.start_batcher(first, BATCHER_BATCHER_ID=first, **BATCHER_ENV)
    wait_for(lambda: _lease_holder(stack) == f"1:{first}", 30, "the first batcher to lead")
    for batcher_id in standbys:
        stack.start_batcher(batcher_id, BATCHER_BATCHER_ID=batcher_id, **BATCHER_ENV)
    stack.start_worker("worker0", **fault.WORKER_ENV)
    stack.start_worker("worker1", **fault.WORKER_ENV)
    stack.start_gateway()
    stack.wait_ready(num_workers=2)
    return stack


def _results(redis_url: str) -> list[ModelRunnerOutput]:
    return [m for m in fault.inbox_messages(redis_url) if isinstance(m, ModelRunnerOutput)]


def _check(stack: Stack, cases: fault.FaultCases, seen: list[fault.ClientStream], epoch: int) -> None:
    fault.check_cases(stack.redis_url, cases, seen)
    # The old batcher's steps all came before the new one's: once a result of the new epoch is in
    # the inbox, no result of an older epoch follows (no request was scheduled by both at once).
    epochs = [r.epoch for r in _results(stack.redis_url)]
    assert epochs == sorted(epochs) and epochs[-1] == epoch, epochs
    client = redis.Redis.from_url(stack.redis_url)
    assert client.xpending(streams.REQUESTS_STREAM, streams.BATCHER_GROUP)["pending"] == 0
    stats = stack.stats()
    assert stats["epoch"] == epoch and stats["num_recovered"] == fault.NUM_STREAMS, stats
    assert stats["num_failed"] == 0, stats


# The restarted process finds the pending entries under its own consumer name, or a dead one's.
@pytest.mark.parametrize("new_id", ["batcher-a", "batcher-b"], ids=["same-name", "new-name"])
def test_killed_batcher_is_restarted_and_streams_resume(
    new_id: str, make_stack: Callable[[], Stack], cases: fault.FaultCases
) -> None:
    stack = _start(make_stack, ["batcher-a"])
    victim = stack.procs["batcher-a"]

    def kill_and_restart() -> None:
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=10)
        del stack.procs["batcher-a"]  # expected dead; the stack's liveness checks must not trip on it
        stack.start_batcher("restarted", BATCHER_BATCHER_ID=new_id, **BATCHER_ENV)

    def took_over() -> None:
        wait_for(lambda: _lease_holder(stack) == f"2:{new_id}", 30, "the new batcher to take the lease")

    seen, fault_at = fault.run_fault(stack.base_url, cases, kill_and_restart, took_over)
    _check(stack, cases, seen, epoch=2)
    wait_s = fault.longest_wait(seen, fault_at)
    print(f"\nSIGKILL of the batcher, restarted as {new_id}: longest client wait {wait_s:.2f}s")
    assert wait_s < LEASE_TTL_S + 10  # a new process's imports, the lease TTL, workers rejoining


def test_standby_takes_over_from_killed_batcher(
    make_stack: Callable[[], Stack], cases: fault.FaultCases
) -> None:
    stack = _start(make_stack, ["batcher-a", "batcher-b"])
    assert "on standby" in stack.log("batcher-b")
    victim = stack.procs["batcher-a"]

    def kill() -> None:
        victim.send_signal(signal.SIGKILL)

    def took_over() -> None:
        wait_for(lambda: _lease_holder(stack) == "2:batcher-b", 30, "the standby to take the lease")

    seen, fault_at = fault.run_fault(stack.base_url, cases, kill, took_over)
    victim.wait(timeout=10)
    del stack.procs["batcher-a"]
    _check(stack, cases, seen, epoch=2)
    wait_s = fault.longest_wait(seen, fault_at)
    print(f"\nSIGKILL of the active batcher, standby takes over: longest client wait {wait_s:.2f}s")
    assert wait_s < LEASE_TTL_S + 5


def test_paused_batcher_loses_the_lease_and_stands_by(
    make_stack: Callable[[], Stack], cases: fault.FaultCases
) -> None:
    stack = _start(make_stack, ["batcher-a", "batcher-b"])
    client = redis.Redis.from_url(stack.redis_url)
    old_worker_ids = [k.decode() for k in client.hkeys(streams.WORKERS_HASH)]  # type: ignore[union-attr]
    paused = stack.procs["batcher-a"]

    def pause() -> None:
        os.kill(paused.pid, signal.SIGSTOP)

    def took_over_then_resume() -> None:
        wait_for(lambda: _lease_holder(stack) == "2:batcher-b", 30, "the standby to take the lease")
        # Wake the old leader while the new one is scheduling, with its stale state in hand.
        wait_for(lambda: any(r.epoch == 2 for r in _results(stack.redis_url)), 30, "the new leader's steps")
        os.kill(paused.pid, signal.SIGCONT)

    try:
        seen, fault_at = fault.run_fault(stack.base_url, cases, pause, took_over_then_resume)
    finally:
        os.kill(paused.pid, signal.SIGCONT)
    wait_for(lambda: "stepping down to standby" in stack.log("batcher-a"), 30, "the old leader to step down")
    assert paused.poll() is None
    _check(stack, cases, seen, epoch=2)
    # The fence deleted the old workers' steps streams; a step from the old leader would recreate one.
    for worker_id in old_worker_ids:
        assert not client.exists(streams.worker_steps(worker_id)), worker_id
    assert _lease_holder(stack) == "2:batcher-b"
    print(f"\nSIGSTOP of the active batcher: longest client wait {fault.longest_wait(seen, fault_at):.2f}s")

    # It really stands by: when the new leader dies, the old one leads again.
    stack.procs.pop("batcher-b").send_signal(signal.SIGKILL)
    wait_for(lambda: _lease_holder(stack) == "3:batcher-a", 30, "the old leader to take over again")


def test_lost_lease_sends_no_steps(redis_url: str) -> None:
    """The fence itself, without timing luck: a batcher that passed its lease check, then was paused
    while another took over, has its steps refused by the script; not one reaches a worker."""
    client = redis.Redis.from_url(redis_url)
    info = WorkerInfo(
        worker_id="w", model="m", num_blocks=16, block_size=16, max_model_len=256, started_at=0.0
    )
    client.hset(streams.WORKERS_HASH, "w", encode(info))
    client.zadd(streams.WORKERS_HEARTBEAT, {"w": int(time.time() * 1000)})
    req = GenerateRequest(
        req_id="r", prompt_token_ids=[5, 6, 7], sampling_params=SamplingParams(max_tokens=4), arrival_time=0.0
    )
    client.xadd(streams.REQUESTS_STREAM, {FIELD: encode(req)})

    settings = BatcherSettings(redis_url=redis_url, batcher_id="old", lease_ttl_s=30)
    lease = Leadership(client, "old", settings.lease_ttl_s)
    assert lease.acquire() and lease.epoch == 1
    batcher = Batcher(settings, client, lease)
    batcher.setup()
    client.set(streams.BATCHER_LEASE, "2:new")  # another batcher took over while this one slept
    batcher.schedule()
    assert batcher._steps, "the request should have been scheduled"
    with pytest.raises(LeadershipLost):
        batcher.send()  # the local check still believes in the lease: the script refuses
    assert not client.exists(streams.worker_steps("w"))
    # And at the next renewal it finds out before doing anything.
    lease._renew_at = 0.0
    with pytest.raises(LeadershipLost):
        lease.check()
