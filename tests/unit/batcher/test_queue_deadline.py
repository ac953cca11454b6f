"""The scheduler fails requests that waited past their queue deadline without ever being scheduled."""

from __future__ import annotations

from batcher.core.request import RequestStatus
from tests.unit.batcher.test_scheduler import make, request


def test_only_never_scheduled_requests_expire() -> None:
    s = make(max_num_seqs=1)
    running, late, patient = request("running", 4), request("late", 4), request("patient", 4)
    running.queue_deadline = late.queue_deadline = 10.0
    for req in (running, late, patient):
        s.add_request(req, now=0.0)
    out, _ = s.schedule("w0")  # one slot: "running" takes it, the others wait
    assert out is not None and set(out.num_scheduled_tokens) == {"running"}
    assert s.expire_waiting(now=9.0) == []
    [expired] = s.expire_waiting(now=11.0)
    assert expired is late
    assert late.status is RequestStatus.FINISHED and late.finish_reason == "error"
    assert late.error_code == "queue_timeout" and "queue" in (late.error or "")
    assert list(s.waiting) == [patient] and "late" not in s.requests
    assert running.status is RequestStatus.RUNNING  # past its deadline too, but it has started
    assert s.stats.num_queue_timeouts == 1


def test_a_request_back_in_the_queue_after_running_does_not_expire() -> None:
    s = make()
    req = request("orphan", 4)
    req.queue_deadline = 1.0
    s.add_request(req, now=0.0)
    s.schedule("w0")
    s.remove_worker("w0")  # its worker died: it waits again, to be recomputed elsewhere
    assert req.status is RequestStatus.WAITING
    assert s.expire_waiting(now=100.0) == []
