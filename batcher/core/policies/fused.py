"""The fused step (vLLM v1): running requests first, then waiting ones, under one token budget. No I/O.

Decodes and unfinished prefill chunks of the running batch take the budget first, most urgent
first; waiting requests are admitted with what is left, so a prompt longer than the budget left is
computed in chunks over several steps while decodes keep going. When the worker's KV blocks run out,
running requests are preempted (preemption.py) and no new one is admitted in that step.
"""

from __future__ import annotations

from batcher.core.kv.prefix_cache import Admission, cache_computed_blocks, plan_admission
from batcher.core.placement import fair_share, hostable_elsewhere, takes_next
from batcher.core.preemption import preempt, preemption_victim
from batcher.core.prefix_wait import waits_for_prefix
from batcher.core.request import Request, RequestStatus
from batcher.core.scheduler_state import SchedulerState, StepDraft
from batcher.core.spec_decode.drafting import lookup, num_drafts_to_ask, propose_drafts
from batcher.core.waiting_order import order_waiting
from batcher.core.worker_state import WorkerState
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
    num_drafting = num_asking = 0
    if ws.auto_off is not None:
        num_drafting = ws.auto_off.num_drafting(len(ws.running))
        num_asking = ws.auto_off.num_drafting_next(len(ws.running))
    # Most urgent first (admission order within a priority): budget goes to interactive requests
    # before batch lines, and a preemption victim is always one not yet scheduled in this step.
    for req in sorted(ws.running, key=lambda r: r.priority):
        if budget <= 0 or req.status is not RequestStatus.RUNNING:
            break  # no budget left, or it was preempted (then so was everything after it)
        if req.spec_token_ids:
            continue  # async scheduling: its drafts are in flight, and how many it accepts decides its next
        num_new = min(req.num_tokens_with_placeholders - req.num_computed_tokens, budget)
        if num_new <= 0 or req.is_finishing:
            continue
        if num_drafting > 0 and waits_to_draft(state, req, num_new):
            num_drafting -= 1
            continue
        drafts = draft_for(state, ws, req, num_new, budget) if num_drafting > 0 else []
        num_drafting -= bool(drafts)
        if num_asking > 0 and num_new == 1 and state.config.speculative is not None:
            ask = num_drafts_to_ask(state.config.speculative, req)
            if ask:
                step.draft_after[req.req_id] = ask
                num_asking -= 1
        num_new += len(drafts)
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
        schedule_chunk(state, ws, req, num_new, step)
        if drafts:
            step.spec_token_ids[req.req_id] = drafts
        budget -= num_new
    return budget, preempted


def waits_to_draft(state: SchedulerState, req: Request, num_new: int) -> bool:
    """Async scheduling: a decode whose step is still in flight follows a token not known yet, so it
    cannot draft; one whose known tokens have a continuation to draft waits for that result instead
    (the step after, it drafts), while the others, and all of a worker whose speculation is off
    (auto_off.py), keep pipelining."""
    config = state.config.speculative
    if config is None or num_new != 1 or not req.num_inflight_steps:
        return False
    return config.method != "draft_model" and bool(lookup(config, req, 1, state.suffix_cache))


def draft_for(state: SchedulerState, ws: WorkerState, req: Request, num_new: int, budget: int) -> list[int]:
    """Drafts for a decode (`num_new` 1) when speculation is on, only if their blocks are free:
    drafts never preempt anything."""
    config = state.config.speculative
    if config is None or num_new != 1:
        return []
    drafts = propose_drafts(config, req, budget, ws.info.max_model_len, state.suffix_cache)
    bm = ws.block_manager
    need = bm.num_new_blocks(len(req.block_ids), req.num_computed_tokens + 1 + len(drafts))
    return drafts if need <= bm.num_free_blocks else []


def schedule_waiting(
    state: SchedulerState,
    ws: WorkerState,
    budget: int,
    step: StepDraft,
) -> int:
    """Admit waiting requests in queue order (waiting_order.py) while the budget, a slot and blocks
    allow; one whose prefix a running request is still prefilling is passed over for now
    (prefix_wait.py)."""
    bm = ws.block_manager
    order_waiting(state, ws)
    workers = list(state.workers.values())
    share = fair_share(workers, ws, len(state.waiting))
    weight = state.config.cache_overlap_weight
    admitted = passed = 0
    while len(state.waiting) > passed and budget > 0 and len(ws.running) < ws.max_num_seqs:
        req = state.waiting[passed]
        if req.num_inflight_steps:
            break  # preempted while a step ran: its last token is still on the way
        if not ws.can_host(req):
            if hostable_elsewhere(workers, req):
                break  # a larger worker will take it; keep arrival order
            fail_too_large(state, req, step)
            continue
        if waits_for_prefix(state, ws, req):
            passed += 1
            if passed >= ws.max_num_seqs:
                break  # a pass looks past at most a batch of held requests: it stays cheap
            continue
        if not takes_next(workers, ws, req, admitted, share, weight):
            break  # placement.py sends it elsewhere
        plan = plan_admission(bm, req, budget)
        if plan.num_free_blocks_needed > bm.num_free_blocks:
            break
        admit(state, ws, req, plan, step)
        budget -= plan.num_new_tokens
        admitted += 1
    return budget


def fail_too_large(state: SchedulerState, req: Request, step: StepDraft) -> None:
    """`req` fits no worker's pool: it leaves the queue failed."""
    state.waiting.remove(req)
    state.fail(req, TOO_LARGE)
    step.failed.append(req)


def admit(state: SchedulerState, ws: WorkerState, req: Request, plan: Admission, step: StepDraft) -> None:
    """Move `req` from the waiting queue onto `ws`: its cached prefix taken, `plan.num_new_tokens`
    to compute this step."""
    state.waiting.remove(req)
    bm = ws.block_manager
    bm.take(plan.cached_block_ids)
    req.block_ids = plan.cached_block_ids
    req.num_cached_blocks = len(plan.cached_block_ids)
    req.num_computed_tokens = plan.num_cached_tokens
    end = req.num_computed_tokens + plan.num_new_tokens
    req.block_ids.extend(bm.allocate(bm.num_new_blocks(len(req.block_ids), end)))
    ws.prefix_cache_queries += req.num_tokens
    ws.prefix_cache_hits += plan.num_cached_tokens
    req.status = RequestStatus.RUNNING
    req.worker_id = ws.info.worker_id
    req.attempt += 1
    req.num_prefill_tokens = req.num_tokens
    ws.running.append(req)
    step.new.append(req.to_new_request_data())
    schedule_chunk(state, ws, req, plan.num_new_tokens, step)


def schedule_chunk(
    state: SchedulerState, ws: WorkerState, req: Request, num_new: int, step: StepDraft
) -> None:
    """`req` computes `num_new` tokens in this step: its blocks up to them become findable."""
    if req.num_computed_tokens + num_new < req.num_tokens_with_placeholders:
        state.stats.num_partial_prefills += 1
    cache_computed_blocks(ws.block_manager, req, req.num_computed_tokens + num_new)
    step.num_scheduled[req.req_id] = num_new
