"""Admitting a waiting request onto a worker, passing over one this worker cannot take now, or
failing one no worker can hold. No I/O."""

from __future__ import annotations

import enum
from collections.abc import Iterable

from batcher.core.kv.kv_cache_manager import Admission
from batcher.core.lora import NO_LORA_WORKER, fits_step, note_sent, serves_lora
from batcher.core.placement import hostable_elsewhere
from batcher.core.policies.interface import StepDraft
from batcher.core.policies.running import schedule_chunk
from batcher.core.pooling import fit_prompt, other_kind, refusal
from batcher.core.request import Request, RequestStatus
from batcher.core.scheduler_state import SchedulerState
from batcher.core.worker_state import WorkerState

TOO_LARGE = "the request needs more KV-cache blocks than any worker has"


class Verdict(enum.Enum):
    """What a worker's admission pass does with a waiting request before placement and blocks."""

    CONSIDER = "consider"  # it may run here: placement and the blocks decide
    PASS_OVER = "pass over"  # not here or not now (its adapter): the requests behind it go on
    STOP = "stop"  # a larger worker will take it: keep arrival order
    FAILED = "failed"  # no worker can run it: it left the queue failed


def triage(
    state: SchedulerState, ws: WorkerState, req: Request, step: StepDraft, also: Iterable[Request] = ()
) -> Verdict:
    """Whether `ws` may consider waiting `req` now, `also` admitted in this pass with it."""
    workers = state.workers.values()
    fit_prompt(req, ws.info.max_model_len)
    if not ws.can_host(req) or not serves_lora(ws, req):
        if not hostable_elsewhere(workers, req):
            no_lora = not any(serves_lora(w, req) for w in workers)
            # The reason this worker gives: a request of a kind no worker runs (pooling.py), or too large.
            why = refusal(ws.info, ws.max_num_batched_tokens, req)
            if why is not None and not no_lora:
                # The request's own fault (its kind, length or dimensions): a 400, as the gateway's check.
                req.error_code = "invalid_request_error"
            fail_waiting(state, req, step, NO_LORA_WORKER if no_lora else why or TOO_LARGE)
            return Verdict.FAILED
        if other_kind(ws.info, req):
            return Verdict.PASS_OVER  # a pooling request in a cell that also generates, or the reverse
        return Verdict.PASS_OVER if not serves_lora(ws, req) else Verdict.STOP
    return Verdict.CONSIDER if fits_step(ws, req, also) else Verdict.PASS_OVER


def fail_waiting(state: SchedulerState, req: Request, step: StepDraft, message: str) -> None:
    """`req` can run on no worker: it leaves the queue failed."""
    state.waiting.remove(req)
    state.fail(req, message)
    step.failed.append(req)


def admit(state: SchedulerState, ws: WorkerState, req: Request, plan: Admission, step: StepDraft) -> None:
    """Move `req` from the waiting queue onto `ws`: its cached prefix taken, `plan.num_new_tokens`
    to compute this step."""
    state.waiting.remove(req)
    kv = ws.kv_cache_manager
    if kv.allocate_slots(req, plan.num_new_tokens, plan.cached_block_ids) is None:
        raise RuntimeError(f"admitted {req.req_id} without the blocks its plan counted")
    req.num_computed_tokens = plan.num_cached_tokens
    ws.prefix_cache_queries += req.num_tokens
    ws.prefix_cache_hits += plan.num_cached_tokens
    req.status = RequestStatus.RUNNING
    req.worker_id = ws.info.worker_id
    req.attempt += 1
    req.num_prefill_tokens = req.num_tokens
    ws.running.append(req)
    note_sent(ws, req)
    step.new.append(req.to_new_request_data())
    schedule_chunk(state, ws, req, plan.num_new_tokens, step)
