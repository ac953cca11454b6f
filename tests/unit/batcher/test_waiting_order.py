"""The order waiting requests are admitted in (batcher/core/waiting_order.py): arrival with `fcfs`, most
cached tokens first with `lpm`, never across priorities. Hand-built steps, no Redis, no model."""

from __future__ import annotations

import pytest

from batcher.core.request import Request
from batcher.core.scheduler import Scheduler, SchedulerConfig
from batcher.core.scheduler_state import SchedulingPolicyName, WaitingOrder
from tests.unit.batcher.test_prefix_wait import run
from tests.unit.batcher.test_scheduler import request, worker

PREFIX = list(range(3000, 3032))  # 8 blocks of 4 tokens


def hit(req_id: str, tail: list[int]) -> Request:
    return request(req_id, 0, max_tokens=4, prompt=PREFIX + tail)


def warmed(order: WaitingOrder, policy: SchedulingPolicyName = "fused") -> Scheduler:
    """`a` has computed the shared prefix; then `u` (40 uncached tokens) arrives before `h` and `h2`
    (the prefix plus 2 tokens each)."""
    s = Scheduler(SchedulerConfig(waiting_order=order, scheduling_policy=policy))
    s.add_worker(worker("w0", num_blocks=64, max_num_batched_tokens=40))
    s.add_request(hit("a", [1, 2]), now=0.0)
    run(s, "w0")
    s.add_request(request("u", 40), now=1.0)
    s.add_request(hit("h", [7, 8]), now=2.0)
    s.add_request(hit("h2", [5, 6]), now=3.0)
    return s


def test_fcfs_admits_in_arrival_order() -> None:
    s = warmed("fcfs")
    out = run(s, "w0")
    # a's decode takes 1 token of the 40; u takes the other 39 and nothing else fits.
    assert [new.req_id for new in out.scheduled_new_reqs] == ["u"]


def test_lpm_admits_cache_hits_first_in_arrival_order() -> None:
    s = warmed("lpm")
    out = run(s, "w0")
    assert [new.req_id for new in out.scheduled_new_reqs] == ["h", "h2", "u"]
    h, h2, _ = out.scheduled_new_reqs
    assert h.num_computed_tokens == h2.num_computed_tokens == len(PREFIX)
    # The hits computed 2 tokens each, the uncached prompt the rest of the budget.
    assert out.num_scheduled_tokens == {"a": 1, "h": 2, "h2": 2, "u": 35}


def test_lpm_with_nothing_waiting_schedules_the_running_batch() -> None:
    s = warmed("lpm")
    for _ in range(3):
        run(s, "w0")
    assert not s.waiting
    out = run(s, "w0")
    assert set(out.num_scheduled_tokens) == {"u", "h", "h2"}  # a has finished


def test_lpm_computes_the_prefix_more_requests_wait_for_first() -> None:
    s = Scheduler(SchedulerConfig(waiting_order="lpm"))
    s.add_worker(worker("w0", num_blocks=64, max_num_batched_tokens=40))
    other = list(range(4000, 4032))
    s.add_request(request("x1", 0, prompt=[*other, 1, 2]), now=1.0)
    s.add_request(hit("y1", [3, 4]), now=2.0)
    s.add_request(hit("y2", [5, 6]), now=3.0)
    out = run(s, "w0")
    # Nothing is cached yet: the prefix two requests share goes first, and its second request finds
    # it already sent in the same step.
    assert [new.req_id for new in out.scheduled_new_reqs] == ["y1", "y2", "x1"]
    assert out.num_scheduled_tokens == {"y1": 34, "y2": 2, "x1": 4}


@pytest.mark.parametrize("policy", ["fused", "tgi"])
def test_lpm_does_not_pass_a_more_urgent_request(policy: SchedulingPolicyName) -> None:
    s = Scheduler(SchedulerConfig(waiting_order="lpm", scheduling_policy=policy))
    s.add_worker(worker("w0", num_blocks=64, max_num_batched_tokens=40))
    s.add_request(hit("a", [1, 2]), now=0.0)
    run(s, "w0")
    urgent = request("u", 30)
    later = hit("h", [7, 8])
    later.priority = 1  # a batch line: behind every interactive request, cached or not
    s.add_request(later, now=1.0)
    s.add_request(urgent, now=2.0)
    out = run(s, "w0")
    assert out.scheduled_new_reqs[0].req_id == "u"
