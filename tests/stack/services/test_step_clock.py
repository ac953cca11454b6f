"""When the batcher plans a worker's next step under async scheduling (batcher/core/step_clock.py).

The batcher runs in this process against a real redis-server; the worker is played by the test,
which registers it, reads its steps and writes its results with a step time it chooses.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis

from batcher.core.step_clock import MIN_LEAD_S, StepClock
from batcher.service.leadership import Leadership
from batcher.service.loop import Batcher
from batcher.settings import BatcherSettings
from common import streams
from common.protocol import (
    FIELD,
    GenerateRequest,
    ModelRunnerOutput,
    SamplingParams,
    SchedulerOutput,
    WorkerInfo,
    decode_step,
    encode,
)
from harness.processes.services import wait_for

WORKER = "w0"
STEP_S = 1.0  # the played worker's step time: long, so the test's own delays are small beside it


def test_no_estimate_plans_at_once() -> None:
    clock = StepClock()
    assert clock.plan_at(0.2) is None
    clock.on_sent(10.0, num_in_flight_before=0)
    assert clock.plan_at(0.2) is None  # no step has ended yet


def test_next_step_is_planned_a_lead_before_the_running_one_ends() -> None:
    clock = StepClock()
    clock.on_sent(10.0, num_in_flight_before=0)
    clock.on_sent(10.001, num_in_flight_before=1)  # queued behind: does not move the start
    clock.on_result(11.0, num_in_flight_after=1)  # the first took 1 s; the second starts now
    assert clock.period_s == pytest.approx(1.0)
    assert clock.plan_at(0.2) == pytest.approx(11.0 + 1.0 - 0.2)
    assert clock.plan_at(1.0) is None  # lead 1: plan as soon as it starts (eager)
    clock.on_result(11.5, num_in_flight_after=0)  # a short step moves the average, nothing runs
    assert clock.period_s == pytest.approx(0.7 * 1.0 + 0.3 * 0.5)
    assert clock.plan_at(0.2) is None


def test_the_lead_never_falls_under_a_round_trip() -> None:
    clock = StepClock()
    clock.on_sent(0.0, num_in_flight_before=0)
    clock.on_result(0.004, num_in_flight_after=1)
    assert clock.plan_at(0.2) == pytest.approx(0.004 + 0.004 - MIN_LEAD_S)


@pytest.fixture()
def client(redis_url: str) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(redis_url)
    yield c
    c.close()


def start_batcher(client: redis.Redis, redis_url: str, lead: float) -> Batcher:
    settings = BatcherSettings(redis_url=redis_url, async_scheduling=True, async_plan_lead=lead)
    info = WorkerInfo(
        worker_id=WORKER, model="m", num_blocks=64, block_size=16, max_model_len=256, started_at=time.time()
    )
    client.hset(streams.WORKERS_HASH, WORKER, encode(info))
    client.zadd(streams.WORKERS_HEARTBEAT, {WORKER: time.time() * 1000})
    leadership = Leadership(client, settings.batcher_id, settings.lease_ttl_s)
    assert leadership.acquire()
    batcher = Batcher(settings, client, leadership)
    batcher.setup()
    return batcher


def submit(client: redis.Redis, req_id: str) -> None:
    msg = GenerateRequest(
        req_id=req_id,
        prompt_token_ids=[5, 6, 7],
        sampling_params=SamplingParams(max_tokens=50),
        arrival_time=time.time(),
    )
    client.xadd(streams.REQUESTS_STREAM, {FIELD: encode(msg)})


def steps_sent(client: redis.Redis) -> list[tuple[float, SchedulerOutput]]:
    """(unix seconds it was sent, the step) of every step sent to the worker."""
    entries = client.xrange(streams.worker_steps(WORKER))
    return [(int(eid.decode().split("-")[0]) / 1000, decode_step(f[FIELD])) for eid, f in entries]


def run_until(batcher: Batcher, client: redis.Redis, num_steps: int) -> None:
    def enough() -> bool:
        batcher.step()
        return len(steps_sent(client)) >= num_steps

    wait_for(enough, 10, f"{num_steps} steps to be sent")


def answer_first_step(batcher: Batcher, client: redis.Redis) -> float:
    """Play the worker ending step 0 after STEP_S; returns when its result was written."""
    sent_at, step = steps_sent(client)[0]
    wait_for(lambda: time.time() >= sent_at + STEP_S, 2 * STEP_S, "the played step to take its time")
    req_ids = list(step.num_scheduled_tokens)
    result = ModelRunnerOutput(
        step_id=step.step_id,
        worker_id=WORKER,
        req_ids=req_ids,
        sampled_token_ids=[9] * len(req_ids),
        finish_reasons=[None] * len(req_ids),
        epoch=batcher.leadership.epoch,
    )
    client.xadd(streams.BATCHER_INBOX, {FIELD: encode(result)})
    return time.time()


def new_req_ids(step: SchedulerOutput) -> list[str]:
    return [n.req_id for n in step.scheduled_new_reqs]


def test_a_request_arriving_during_a_step_joins_the_next_one(client: redis.Redis, redis_url: str) -> None:
    batcher = start_batcher(client, redis_url, lead=0.2)
    submit(client, "a")
    run_until(batcher, client, 2)  # no step time known yet: step 1 is planned while step 0 runs
    answered_at = answer_first_step(batcher, client)
    batcher.step()  # takes the result in: step 1 runs now, step 2 waits for its end
    assert len(steps_sent(client)) == 2
    submit(client, "b")  # arrives while step 1 runs
    run_until(batcher, client, 3)
    sent_at, step2 = steps_sent(client)[2]
    assert new_req_ids(step2) == ["b"]
    # Planned about a lead before step 1's expected end, not at its start (the clock's moving average
    # of the one step it saw is the played STEP_S; stream ids have millisecond resolution).
    assert sent_at >= answered_at + 0.8 * STEP_S - 0.01


def test_eager_planning_makes_the_late_request_wait_a_step(client: redis.Redis, redis_url: str) -> None:
    batcher = start_batcher(client, redis_url, lead=1.0)
    submit(client, "a")
    run_until(batcher, client, 2)
    answer_first_step(batcher, client)
    run_until(batcher, client, 3)  # step 2 is planned as soon as step 1 starts...
    submit(client, "b")
    assert new_req_ids(steps_sent(client)[2][1]) == []  # ...so b cannot be in it
