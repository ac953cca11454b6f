"""The running batch's next tokens, under a token budget: what every policy's decode part is. No I/O.

Decodes and unfinished prefill chunks take the budget most urgent first. Their blocks come from the
worker's KV manager; when it is short, the least urgent running requests are preempted
(preemption.py) until the blocks fit. Decodes may carry drafts (spec_decode/drafting.py), which
never preempt anything.
"""

from __future__ import annotations

from batcher.core.multimodal import fit_mm_chunk
from batcher.core.policies.interface import StepDraft
from batcher.core.preemption import preempt, preemption_victim
from batcher.core.request import Request, RequestStatus
from batcher.core.scheduler_state import SchedulerState
from batcher.core.spec_decode.drafting import lookup, num_drafts_to_ask, propose_drafts
from batcher.core.worker_state import WorkerState
from common.protocol import CachedRequestData


def schedule_running(
    state: SchedulerState,
    ws: WorkerState,
    budget: int,
    step: StepDraft,
) -> tuple[int, bool]:
    """The running batch's next tokens within `budget`; returns the budget left and whether the
    worker ran out of blocks (and preempted)."""
    kv = ws.kv_cache_manager
    max_model_len = ws.info.max_model_len
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
        num_new = fit_mm_chunk(ws, req, req.num_computed_tokens, num_new, step, anew=False)
        if num_new <= 0 or req.is_finishing(max_model_len):
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
        while (new_block_ids := kv.allocate_slots(req, num_new)) is None:
            victim = preemption_victim(ws.running)
            preempt(state, ws, victim)
            preempted = True
            if victim is req:
                break
        if new_block_ids is None:
            break  # it preempted itself: nothing after it is left either
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
    return drafts if ws.kv_cache_manager.can_allocate(req, 1 + len(drafts)) else []


def schedule_chunk(
    state: SchedulerState, ws: WorkerState, req: Request, num_new: int, step: StepDraft
) -> None:
    """`req` computes `num_new` tokens in this step: its blocks up to them become findable."""
    if req.num_computed_tokens + num_new < req.num_tokens_with_placeholders:
        state.stats.num_partial_prefills += 1
    ws.kv_cache_manager.cache_blocks(req, req.num_computed_tokens + num_new)
    step.num_scheduled[req.req_id] = num_new
