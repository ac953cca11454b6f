"""When a running request is preempted, and which one (batcher/core/preemption.py)."""

from __future__ import annotations

from batcher.core.preemption import preempt_for_waiting, preemption_victim
from batcher.core.request import Request, RequestStatus
from batcher.core.scheduler import Scheduler, SchedulerConfig
from tests.unit.batcher.test_scheduler import request, worker


def req(req_id: str, priority: int, prompt_len: int = 4) -> Request:
    r = request(req_id, prompt_len=prompt_len)
    r.priority = priority
    return r


def test_the_victim_is_the_least_urgent_then_the_newest() -> None:
    old_batch, interactive, new_batch = req("old", 1), req("i", 0), req("new", 1)
    assert preemption_victim([old_batch, interactive, new_batch]) is new_batch
    assert preemption_victim([interactive, old_batch]) is old_batch
    assert preemption_victim([interactive]) is interactive


def full_worker(priority: int) -> Scheduler:
    """One worker whose two slots hold requests of `priority`; then an interactive request waits."""
    s = Scheduler(SchedulerConfig(max_num_seqs=2, max_num_batched_tokens=64))
    s.add_worker(worker(num_blocks=8, block_size=4))
    for name in ("a", "b"):
        s.add_request(req(name, priority), now=0.0)
    s.schedule("w0")
    s.workers["w0"].in_flight.clear()  # results in: nothing waits for a step
    for r in s.requests.values():
        r.num_inflight_steps = 0
    s.add_request(req("urgent", 0), now=0.0)
    return s


def test_a_waiting_interactive_request_takes_the_place_of_the_newest_batch_line() -> None:
    s = full_worker(priority=1)
    preempt_for_waiting(s, s.workers["w0"])
    assert [r.req_id for r in s.workers["w0"].running] == ["a"]
    b = s.requests["b"]
    assert b.status is RequestStatus.WAITING and b.num_preemptions == 1
    assert [r.req_id for r in s.waiting] == ["urgent", "b"]
    assert s.stats.num_preemptions == 1


def test_requests_of_equal_priority_never_preempt_each_other_for_a_slot() -> None:
    s = full_worker(priority=0)
    preempt_for_waiting(s, s.workers["w0"])
    assert len(s.workers["w0"].running) == 2 and s.stats.num_preemptions == 0
