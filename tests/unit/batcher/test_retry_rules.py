"""Retry, dead-letter, queue-deadline and early-abort rules (batcher/core/retry_rules.py)."""

from __future__ import annotations

from batcher.core.request import RequestStatus
from batcher.core.retry_rules import EARLY_ABORT_TTL_S, EarlyAborts, expire_waiting, retry_or_give_up
from batcher.core.scheduler import Scheduler
from tests.unit.batcher.test_scheduler import complete, make, request


def running(s: Scheduler, req_id: str) -> None:
    s.add_request(request(req_id, prompt_len=8), now=0.0)
    deliver(s, req_id)


def deliver(s: Scheduler, req_id: str) -> None:
    """Schedule `req_id` onto the worker and answer the step, as the worker would."""
    out, _ = s.schedule("w0")
    assert out is not None and req_id in out.num_scheduled_tokens
    complete(s, out)


def test_a_request_failing_alone_is_retried_until_its_last_delivery_then_dead_lettered() -> None:
    s = make()
    s.config.max_deliveries = 3
    ws = s.workers["w0"]
    running(s, "r")
    req = s.requests["r"]
    for delivery in (1, 2):
        assert not retry_or_give_up(s, ws, req, "boom")
        assert req.num_failed_deliveries == delivery and not req.dead_letter
        assert req.status is RequestStatus.WAITING and list(s.waiting) == [req]
        assert req.block_ids == [] and "r" in ws.to_free and req not in ws.running
        assert ws.kv_cache_manager.num_free_blocks == ws.kv_cache_manager.num_blocks
        deliver(s, "r")  # delivered again, as a new attempt
        assert req.attempt == delivery + 1
    assert retry_or_give_up(s, ws, req, "boom")
    assert req.dead_letter and req.finish_reason == "error"
    assert req.error == "boom (failed on 3 deliveries)"
    assert "r" not in s.requests and not s.waiting
    assert s.stats.num_retries == 2 and s.stats.num_dead_lettered == 1 and s.stats.num_failed == 1


def test_the_queue_deadline_is_strict_and_spares_requests_that_ran() -> None:
    s = make(max_num_seqs=1)
    first, second = request("first", 4), request("second", 4)
    first.queue_deadline = second.queue_deadline = 10.0
    s.add_request(first, now=0.0)
    s.add_request(second, now=0.0)
    assert expire_waiting(s, now=10.0) == []  # at its deadline, not past it
    s.schedule("w0")
    s.remove_worker("w0")  # "first" ran and waits again: not expired
    assert [r.req_id for r in expire_waiting(s, now=10.5)] == ["second"]
    assert second.error_code == "queue_timeout" and list(s.waiting) == [first]


def test_an_early_abort_finishes_its_request_on_arrival_until_it_is_forgotten() -> None:
    aborts = EarlyAborts()
    aborts.remember("a", "abort", now=0.0)
    aborts.remember("s", "stop", now=0.0)
    aborts.remember("old", "abort", now=0.0)
    aborts.expire(now=EARLY_ABORT_TTL_S)  # not older than the TTL yet
    a, stop = request("a", 4), request("s", 4)
    assert aborts.apply(a) and a.finish_reason == "abort" and a.status is RequestStatus.FINISHED
    assert aborts.apply(stop) and stop.finish_reason == "stop"
    assert not aborts.apply(request("a", 4))  # used up
    aborts.expire(now=EARLY_ABORT_TTL_S + 1.0)
    late = request("old", 4)
    assert not aborts.apply(late) and late.status is RequestStatus.WAITING
