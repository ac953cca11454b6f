"""A GPU worker dies (SIGKILL) or stalls (SIGSTOP) mid-generation: every client stream goes on.

Two workers share eight greedy streams. Once every stream has a few tokens, one worker is killed or
paused. Its requests must resume on the other worker from the tokens already streamed, so each
client gets exactly `generate`'s tokens with no error, gap or repeat. The raw token streams in Redis
must hold every output index exactly once: the fence (gpu_worker/service/fenced_writes.py) keeps a
paused worker from writing anything once the batcher has declared it dead, rather than relying on
readers.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

import pytest
import redis

from common import streams
from common.protocol import (
    FIELD,
    ModelRunnerOutput,
    SamplingParams,
    WorkerInfo,
    encode,
)
from harness.gpu_worker.worker_steps import new_request, prefill_step
from harness.load import fault_clients as fault
from harness.processes.services import Stack, wait_for

BATCHER_ENV = fault.FAST_HEARTBEAT_ENV
HEARTBEAT_TIMEOUT_S = float(BATCHER_ENV["BATCHER_HEARTBEAT_TIMEOUT_S"])


cases = fault.cases_fixture(7)


def _check(stack: Stack, cases: fault.FaultCases, seen: list[fault.ClientStream]) -> None:
    fault.check_cases(stack.redis_url, cases, seen)
    stats = stack.stats_after(fault.NUM_STREAMS)
    assert stats["num_finished"] == fault.NUM_STREAMS and stats["num_failed"] == 0, stats
    assert stats["num_workers_lost"] >= 1 and stats["num_failovers"] >= 1, stats


def _start(make_stack: Callable[[], Stack], scheduling: str = "sync") -> Stack:
    env = {**BATCHER_ENV, "BATCHER_ASYNC_SCHEDULING": str(scheduling == "async").lower()}
    if scheduling == "ngram":  # steps with drafts: a run of tokens per request per step
        env["SPECULATIVE_CONFIG"] = '{"method": "ngram", "num_speculative_tokens": 3}'
    return make_stack().start_all(2, batcher_env=env, worker_env=fault.WORKER_ENV)


@pytest.mark.parametrize("scheduling", ["sync", "async", "ngram"])
def test_killed_worker_streams_resume_elsewhere(
    scheduling: str, make_stack: Callable[[], Stack], cases: fault.FaultCases
) -> None:
    stack = _start(make_stack, scheduling)
    victim = stack.procs["worker1"]

    def kill() -> None:
        victim.send_signal(signal.SIGKILL)

    def declared_dead() -> None:
        wait_for(lambda: stack.stats().get("num_workers_lost", 0) >= 1, 30, "the batcher to notice the kill")

    seen, fault_at = fault.run_fault(stack.base_url, cases, kill, declared_dead)
    victim.wait(timeout=10)
    del stack.procs["worker1"]  # expected dead; the stack's liveness checks must not trip on it
    _check(stack, cases, seen)
    if scheduling == "ngram":
        assert stack.stats()["spec_decode_num_accepted_tokens"] > 0
    wait_s = fault.longest_wait(seen, fault_at)
    print(f"\nSIGKILL of 1 of 2 workers ({scheduling}): longest client wait {wait_s:.2f}s")
    assert wait_s < HEARTBEAT_TIMEOUT_S + 5  # detection, plus slack for this loaded 2-core machine


def test_paused_worker_is_fenced_and_rejoins(
    make_stack: Callable[[], Stack], cases: fault.FaultCases
) -> None:
    stack = _start(make_stack)
    paused = stack.procs["worker1"]
    client = redis.Redis.from_url(stack.redis_url)

    def pause() -> None:
        os.kill(paused.pid, signal.SIGSTOP)

    def wait_fenced() -> None:
        wait_for(lambda: stack.stats().get("num_workers_lost", 0) >= 1, 30, "the batcher to fence it")

    try:
        seen, fault_at = fault.run_fault(stack.base_url, cases, pause, wait_fenced)
    finally:
        os.kill(paused.pid, signal.SIGCONT)
    # Every request finished on worker0 while worker1 was stopped. Resumed, worker1 finds itself
    # fenced (its step result is refused, its heartbeat too) and joins again under a new id.
    wait_for(lambda: "declared dead" in stack.log("worker1"), 30, "worker1 to notice it was fenced")
    wait_for(lambda: stack.num_workers_joined() == 2, 30, "worker1 to rejoin")
    ids = [k.decode() for k in client.hkeys(streams.WORKERS_HASH)]
    assert len(ids) == 2 and any(i.endswith(".1") for i in ids), ids
    assert paused.poll() is None
    _check(stack, cases, seen)
    wait_s = fault.longest_wait(seen, fault_at)
    print(f"\nSIGSTOP of 1 of 2 workers: longest client wait {wait_s:.2f}s")
    assert wait_s < HEARTBEAT_TIMEOUT_S + 5


def test_fenced_worker_writes_nothing_and_rejoins(make_stack: Callable[[], Stack]) -> None:
    """The fence itself, without timing luck: a step that reaches a worker after the batcher revoked
    its registration is computed but not one token of it is written; the worker rejoins anew."""
    stack = make_stack()
    # A slow heartbeat, so that the refused publish (not the heartbeat) is what finds the fence.
    worker = stack.start_worker("worker0", WORKER_HEARTBEAT_INTERVAL_S="60", WORKER_NUM_BLOCKS="32")
    client = redis.Redis.from_url(stack.redis_url)
    wait_for(lambda: client.hlen(streams.WORKERS_HASH) == 1, 60, "the worker to register")
    (worker_id,) = [k.decode() for k in client.hkeys(streams.WORKERS_HASH)]

    client.hdel(streams.WORKERS_HASH, worker_id)  # what the batcher does when it declares it dead
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    step = prefill_step([new_request("stale", [5, 6, 7], params, [0], attempt=1)], step_id=1)
    client.xadd(streams.worker_steps(worker_id), {FIELD: encode(step)})

    wait_for(lambda: "step 1 not published" in stack.log("worker0"), 30, "the refused publish")
    wait_for(lambda: client.hexists(streams.WORKERS_HASH, f"{worker_id}.1"), 30, "the rejoin")
    assert worker.poll() is None
    assert not client.exists(streams.token_stream("stale"))
    messages = fault.inbox_messages(stack.redis_url)
    assert not [m for m in messages if isinstance(m, ModelRunnerOutput)], messages
    hellos = [m.worker_id for m in messages if isinstance(m, WorkerInfo)]
    assert hellos == [worker_id, f"{worker_id}.1"]
    assert client.zscore(streams.WORKERS_HEARTBEAT, f"{worker_id}.1") is not None
