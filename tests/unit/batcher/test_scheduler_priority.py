"""Priority in the scheduler: interactive requests (0) before batch lines (1), in both policies.

Waiting requests are admitted in (priority, arrival) order; when blocks run out, the least urgent
running request gives way (then the newest), whatever order they were admitted in.
"""

from __future__ import annotations

import pytest

from batcher.core.request import Request, RequestStatus
from batcher.core.scheduler import Scheduler, SchedulerConfig, SchedulingPolicyName
from common.protocol import FinishReason, SchedulerOutput
from tests.unit.batcher.test_scheduler import complete, request, worker

INTERACTIVE, BATCH = 0, 1
POLICIES: list[SchedulingPolicyName] = ["fused", "tgi"]


def make(policy: SchedulingPolicyName, *, max_num_seqs: int = 8, num_blocks: int = 64) -> Scheduler:
    config = SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=64, scheduling_policy=policy)
    s = Scheduler(config)
    s.add_worker(worker(num_blocks=num_blocks, block_size=4))
    return s


def add(s: Scheduler, req_id: str, priority: int, prompt_len: int = 4, max_tokens: int = 8) -> Request:
    req = request(req_id, prompt_len=prompt_len, max_tokens=max_tokens)
    req.priority = priority
    s.add_request(req, now=0.0)
    return req


def at_max_tokens(req: Request) -> FinishReason | None:
    """A worker's finish rule for the token it samples now (the request's output index len(output))."""
    return "length" if len(req.output_token_ids) + 1 >= req.sampling_params.max_tokens else None


def step(s: Scheduler) -> SchedulerOutput:
    out, failed = s.schedule("w0")
    assert out is not None and not failed
    complete(s, out, finish=at_max_tokens)
    return out


def admitted(s: Scheduler) -> list[str]:
    """Request ids admitted (sent in full) by the next step, which is completed as a worker would."""
    out = step(s)
    return [r.req_id for r in out.scheduled_new_reqs]


@pytest.mark.parametrize("policy", POLICIES)
def test_a_waiting_interactive_request_is_admitted_before_older_batch_lines(
    policy: SchedulingPolicyName,
) -> None:
    s = make(policy, max_num_seqs=2)
    for i in range(4):
        add(s, f"b{i}", BATCH, max_tokens=3)
    add(s, "i0", INTERACTIVE, max_tokens=20)
    assert [r.req_id for r in s.waiting] == ["i0", "b0", "b1", "b2", "b3"]
    order = admitted(s)
    add(s, "i1", INTERACTIVE, max_tokens=20)  # arrives while b1..b3 wait for a slot
    while s.waiting:
        order += admitted(s)
    # i1 takes b0's slot at once (b0 is preempted), and b0 comes back first of the batch lines.
    assert order == ["i0", "b0", "i1", "b0", "b1", "b2", "b3"]


def test_equal_priorities_keep_arrival_order_and_preempted_ones_go_first() -> None:
    s = make("fused", num_blocks=6)
    old, new = add(s, "old", BATCH, 8, 12), add(s, "new", BATCH, 8, 12)
    add(s, "late", BATCH)
    assert [r.req_id for r in s.waiting] == ["old", "new", "late"]
    for _ in range(6):
        step(s)
    # Out of blocks among equals: the newest running one gives way and waits at the front of its level.
    assert new.status is RequestStatus.WAITING and old.status is RequestStatus.RUNNING
    assert [r.req_id for r in s.waiting][:2] == ["new", "late"]
    add(s, "urgent", INTERACTIVE)
    assert [r.req_id for r in s.waiting] == ["urgent", "new", "late"]


@pytest.mark.parametrize("policy", POLICIES)
def test_out_of_blocks_the_batch_line_gives_way_even_when_it_was_admitted_first(
    policy: SchedulingPolicyName,
) -> None:
    # 6 blocks of 4 tokens: two requests of 8 prompt tokens take 4 blocks; growing needs more.
    s = make(policy, num_blocks=6)
    batch_line = add(s, "batch", BATCH, prompt_len=8, max_tokens=12)
    assert admitted(s) == ["batch"]
    interactive = add(s, "interactive", INTERACTIVE, prompt_len=8, max_tokens=12)
    assert admitted(s) == ["interactive"]
    while s.stats.num_preemptions == 0:
        out = step(s)
    # The batch line, older but less urgent, was preempted; the interactive request kept running.
    assert batch_line.status is RequestStatus.WAITING and batch_line.num_computed_tokens == 0
    assert interactive.status is RequestStatus.RUNNING
    assert out.finished_req_ids == ["batch"] and "batch" not in out.num_scheduled_tokens
    assert "interactive" in out.num_scheduled_tokens
    # The interactive request finishes without ever being preempted; then the batch line resumes.
    while interactive.status is RequestStatus.RUNNING:
        step(s)
    assert interactive.num_preemptions == 0 and len(interactive.output_token_ids) == 12
    assert admitted(s) == ["batch"] and batch_line.attempt == 2


def test_interactive_decodes_get_the_token_budget_before_batch_prefill_chunks() -> None:
    s = Scheduler(SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=16))
    s.add_worker(worker())
    add(s, "batch", BATCH, prompt_len=40)
    add(s, "interactive", INTERACTIVE, prompt_len=4)
    out = step(s)
    assert out.num_scheduled_tokens == {"interactive": 4, "batch": 12}
    out = step(s)
    # The interactive decode is scheduled first; the batch prompt's next chunk takes what is left.
    assert list(out.num_scheduled_tokens) == ["interactive", "batch"]
    assert out.num_scheduled_tokens == {"interactive": 1, "batch": 15}


@pytest.mark.parametrize("policy", POLICIES)
def test_an_interactive_request_preempts_a_batch_line_when_the_batch_is_full(
    policy: SchedulingPolicyName,
) -> None:
    s = make(policy, max_num_seqs=2)
    old, new = add(s, "b0", BATCH, max_tokens=50), add(s, "b1", BATCH, max_tokens=50)
    step(s)
    assert old.status is new.status is RequestStatus.RUNNING
    add(s, "i0", INTERACTIVE, max_tokens=5)
    # No slot is free: the newest batch line gives way at once instead of i0 waiting ~50 steps.
    assert admitted(s) == ["i0"]
    assert new.status is RequestStatus.WAITING and old.status is RequestStatus.RUNNING
    assert [r.req_id for r in s.waiting] == ["b1"]
    while s.waiting:
        step(s)
    assert new.status is RequestStatus.RUNNING  # back once i0 (5 tokens) has finished


@pytest.mark.parametrize("policy", POLICIES)
def test_equal_priorities_never_preempt_for_a_slot(policy: SchedulingPolicyName) -> None:
    s = make(policy, max_num_seqs=2)
    running = [add(s, "a0", INTERACTIVE, max_tokens=50), add(s, "a1", INTERACTIVE, max_tokens=50)]
    step(s)
    add(s, "a2", INTERACTIVE)
    assert admitted(s) == []
    assert all(r.status is RequestStatus.RUNNING for r in running) and s.stats.num_preemptions == 0


def test_no_preemption_while_another_worker_has_room() -> None:
    s = make("fused", max_num_seqs=1)
    s.add_worker(worker("w1", num_blocks=64, block_size=4))
    line = add(s, "b0", BATCH, max_tokens=50)
    step(s)  # b0 goes to w0
    add(s, "i0", INTERACTIVE)
    out, _ = s.schedule("w0")
    assert out is not None and [r.req_id for r in out.scheduled_new_reqs] == []
    assert line.status is RequestStatus.RUNNING and s.stats.num_preemptions == 0
    out, _ = s.schedule("w1")
    assert out is not None and [r.req_id for r in out.scheduled_new_reqs] == ["i0"]
