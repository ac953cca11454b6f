"""Waiting for a prefix being computed (batcher/core/prefix_wait.py): a waiting request is passed over
while a running request still sends the blocks of its prefix, and admitted with them cached once
they are. Hand-built steps, no Redis, no model."""

from __future__ import annotations

from batcher.core.prefix_wait import MAX_PREFIX_WAITS, waits_for_prefix
from batcher.core.request import Request
from batcher.core.scheduler import Scheduler, SchedulerConfig
from common.protocol import SchedulerOutput
from tests.unit.batcher.test_scheduler import complete, request, worker

PREFIX = list(range(2000, 2032))  # 8 blocks of 4 tokens


def sibling(req_id: str, tail: list[int]) -> Request:
    return request(req_id, 0, max_tokens=4, prompt=PREFIX + tail)


def started(prefix_wait: bool = True, second_worker_blocks: int = 72) -> Scheduler:
    """`a` on w0 has sent 2 of its prefix's 8 blocks (chunks of 8 tokens); then w1 joins, with 10
    more free blocks than w0: enough for placement to send a request sharing `a`'s prefix to w1 now,
    too few once w0 holds the whole prefix. `b` shares the prefix, `c` shares nothing."""
    s = Scheduler(SchedulerConfig(prefix_wait=prefix_wait))
    s.add_worker(worker("w0", num_blocks=64, max_num_batched_tokens=8))
    s.add_request(sibling("a", [1, 2]), now=0.0)
    run(s, "w0")
    s.add_worker(worker("w1", num_blocks=second_worker_blocks, max_num_batched_tokens=8))
    s.add_request(sibling("b", [7, 8]), now=0.0)
    s.add_request(request("c", 6), now=0.0)
    return s


def run(s: Scheduler, worker_id: str) -> SchedulerOutput:
    out, failed = s.schedule(worker_id)
    assert out is not None and not failed
    complete(s, out, worker_id)
    return out


def test_a_request_waits_while_a_sibling_prefills_and_then_takes_its_blocks() -> None:
    s = started()
    out = run(s, "w1")
    # b is passed over: c, behind it, is admitted meanwhile.
    assert [new.req_id for new in out.scheduled_new_reqs] == ["c"]
    assert s.requests["b"].num_prefix_waits == 1
    admitted = None
    for _ in range(5):
        out = run(s, "w0")
        admitted = next((new for new in out.scheduled_new_reqs if new.req_id == "b"), admitted)
    assert admitted is not None, "b was never admitted on a's worker"
    # The whole prefix found cached: only its own 2 tokens computed.
    assert admitted.num_computed_tokens == len(PREFIX)
    assert s.workers["w0"].prefix_cache_hits == len(PREFIX)
    a_blocks = s.requests["a"].block_ids[:8]
    assert admitted.block_ids[:8] == a_blocks


def test_without_prefix_wait_the_prefix_is_computed_again_elsewhere() -> None:
    # The same start with BATCHER_PREFIX_WAIT off: b goes to w1 at once and computes everything.
    s = started(prefix_wait=False)
    out = run(s, "w1")
    [b, *_] = out.scheduled_new_reqs
    assert b.req_id == "b" and b.num_computed_tokens == 0


def test_not_held_when_waiting_would_not_change_where_it_goes() -> None:
    # w1 has so many more free blocks that b goes there even once w0 holds its whole prefix.
    s = started(second_worker_blocks=200)
    out = run(s, "w1")
    assert out.scheduled_new_reqs[0].req_id == "b"
    assert s.requests["b"].num_prefix_waits == 0


def test_not_held_for_a_different_prefix_or_one_already_sent() -> None:
    s = started()
    w0 = s.workers["w0"]
    assert not waits_for_prefix(s, w0, s.requests["c"])  # shares nothing with a
    # On a's own worker too b waits while a's chunks are still to come, since a later chunk of a
    # would otherwise be computed again in b's table...
    assert waits_for_prefix(s, w0, s.requests["b"])
    for _ in range(3):
        run(s, "w0")  # ...and no longer once a has sent all 8 blocks of the prefix.
    assert s.requests["a"].num_cached_blocks == 8
    assert not waits_for_prefix(s, w0, s.requests["b"])


def test_a_held_request_is_admitted_after_max_prefix_waits() -> None:
    # a's worker is never scheduled again (it stalls): b is held a bounded number of passes.
    s = started()
    admitted_at = None
    for i in range(MAX_PREFIX_WAITS + 2):
        out, _ = s.schedule("w1")  # nothing to compute once c is done: still a pass
        if out is not None:
            complete(s, out, "w1")
        if out is not None and any(new.req_id == "b" for new in out.scheduled_new_reqs):
            admitted_at = i
            break
    assert admitted_at == MAX_PREFIX_WAITS
    assert s.requests["b"].num_prefix_waits == MAX_PREFIX_WAITS


def test_off_with_prefix_caching_off() -> None:
    s = Scheduler(SchedulerConfig(enable_prefix_caching=False))
    s.add_worker(worker("w0", num_blocks=64, max_num_batched_tokens=8))
    s.add_request(sibling("a", [1, 2]), now=0.0)
    run(s, "w0")
    s.add_request(sibling("b", [7, 8]), now=0.0)
    assert not waits_for_prefix(s, s.workers["w0"], s.requests["b"])


def test_a_pass_looks_past_at_most_a_batch_of_held_requests() -> None:
    # w1 takes at most 2 requests: it passes over 2 held ones, then stops looking.
    s = Scheduler(SchedulerConfig())
    s.add_worker(worker("w0", num_blocks=64, max_num_batched_tokens=8))
    s.add_request(sibling("a", [1, 2]), now=0.0)
    run(s, "w0")
    s.add_worker(worker("w1", num_blocks=72, max_num_batched_tokens=8, max_num_seqs=2))
    for i in range(3):
        s.add_request(sibling(f"b{i}", [7, i]), now=0.0)
    s.add_request(request("c", 6), now=0.0)
    assert s.schedule("w1") == (None, [])
    assert [s.requests[f"b{i}"].num_prefix_waits for i in range(3)] == [1, 1, 0]
