"""The fused step (vLLM v1): running requests first, then waiting ones, under one token budget. No I/O.

Decodes and unfinished prefill chunks of the running batch take the budget first, most urgent
first; waiting requests are admitted with what is left, so a prompt longer than the budget left is
computed in chunks over several steps while decodes keep going. When the worker's KV blocks run out,
running requests are preempted (preemption.py) and no new one is admitted in that step.
"""

from __future__ import annotations

from batcher.placement import best_worker, fair_share, hostable_elsewhere
from batcher.preemption import preempt, preemption_victim
from batcher.request import Request, RequestStatus
from batcher.scheduler_state import SchedulerState, StepDraft
from batcher.worker_state import WorkerState
from common.protocol import CachedRequestData

TOO_LARGE = "the request needs more KV-cache blocks than any worker has"


def schedule_fused(state: SchedulerState, ws: WorkerState, step: StepDraft) -> None:
    budget, preempted = schedule_running(state, ws, ws.max_num_batched_tokens, step)
    if not preempted:
        schedule_waiting(state, ws, budget, step)


def schedule_running(
    state: SchedulerState,
    ws: WorkerState,
    budget: int,
    step: StepDraft,
) -> tuple[int, bool]:
    """The running batch's next tokens within `budget`; returns the budget left and whether the
    worker ran out of blocks (and preempted)."""
    bm = ws.block_manager
    preempted = False
    # Most urgent first (admission order within a priority): budget goes to interactive requests
    # before batch lines, and a preemption victim is always one not yet scheduled in this step.
    for req in sorted(ws.running, key=lambda r: r.priority):
        if budget <= 0 or req.status is not RequestStatus.RUNNING:
            break  # no budget left, or it was preempted (then so was everything after it)
        num_new = min(req.num_tokens_with_placeholders - req.num_computed_tokens, budget)
        if num_new <= 0 or req.is_finishing:
            continue
        need = bm.num_new_blocks(len(req.block_ids), req.num_computed_tokens + num_new)
        while need > bm.num_free_blocks:
            victim = preemption_victim(ws.running)
            preempt(state, ws, victim)
            preempted = True
            if victim is req:
                break
        if req.status is not RequestStatus.RUNNING:
            break  # it preempted itself: nothing after it is left either
        new_block_ids = bm.allocate(need)
        req.block_ids.extend(new_block_ids)
        step.cached.append(
            CachedRequestData(
                req_id=req.req_id,
                new_block_ids=new_block_ids,
                num_computed_tokens=req.num_computed_tokens,
            )
        )
        count_chunk(state, req, num_new)
        step.num_scheduled[req.req_id] = num_new
        budget -= num_new
    return budget, preempted


def schedule_waiting(
    state: SchedulerState,
    ws: WorkerState,
    budget: int,
    step: StepDraft,
) -> int:
    """Admit waiting requests in queue order while the budget, a slot and blocks allow."""
    bm = ws.block_manager
    share = fair_share(state.workers.values(), ws, len(state.waiting))
    admitted = 0
    while state.waiting and budget > 0 and len(ws.running) < ws.max_num_seqs:
        req = state.waiting[0]
        if req.num_inflight_steps:
            break  # preempted while a step ran: its last token is still on the way
        if not ws.can_host(req):
            if hostable_elsewhere(state.workers.values(), req):
                break  # a larger worker will take it; keep arrival order
            fail_too_large(state, req, step)
            continue
        # New requests go to the worker with the most free blocks; a burst is split by free share.
        if admitted >= share and best_worker(state.workers.values(), req, prefer=ws) is not ws:
            break
        num_new = min(req.num_tokens - req.num_computed_tokens, budget)
        need = bm.num_new_blocks(len(req.block_ids), req.num_computed_tokens + num_new)
        if need > bm.num_free_blocks:
            break
        admit(state, ws, num_new, step)
        budget -= num_new
        admitted += 1
    return budget


def fail_too_large(state: SchedulerState, req: Request, step: StepDraft) -> None:
    """`req` fits no worker's pool: it leaves the queue failed."""
    state.waiting.remove(req)
    state.fail(req, TOO_LARGE)
    step.failed.append(req)


def admit(state: SchedulerState, ws: WorkerState, num_new: int, step: StepDraft) -> None:
    """Move the head of the waiting queue onto `ws` with `num_new` tokens to compute this step."""
    req = state.waiting.popleft()
    need = ws.block_manager.num_new_blocks(len(req.block_ids), req.num_computed_tokens + num_new)
    req.block_ids.extend(ws.block_manager.allocate(need))
    req.status = RequestStatus.RUNNING
    req.worker_id = ws.info.worker_id
    req.attempt += 1
    req.num_prefill_tokens = req.num_tokens
    ws.running.append(req)
    step.new.append(req.to_new_request_data())
    count_chunk(state, req, num_new)
    step.num_scheduled[req.req_id] = num_new


def count_chunk(state: SchedulerState, req: Request, num_new: int) -> None:
    if req.num_computed_tokens + num_new < req.num_tokens_with_placeholders:
        state.stats.num_partial_prefills += 1
