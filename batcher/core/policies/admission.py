"""Admitting a waiting request onto a worker, or failing one no worker can hold. No I/O."""

from __future__ import annotations

from batcher.core.kv.kv_cache_manager import Admission
from batcher.core.policies.interface import StepDraft
from batcher.core.policies.running import schedule_chunk
from batcher.core.pooling import refusal
from batcher.core.request import Request, RequestStatus
from batcher.core.scheduler_state import SchedulerState
from batcher.core.worker_state import WorkerState

TOO_LARGE = "the request needs more KV-cache blocks than any worker has"


def fail_too_large(state: SchedulerState, ws: WorkerState, req: Request, step: StepDraft) -> None:
    """`req` fits no worker's pool, or is of a kind no worker runs (pooling.py): it leaves the queue
    failed, with the reason `ws` gives."""
    state.waiting.remove(req)
    state.fail(req, refusal(ws.info, ws.max_num_batched_tokens, req) or TOO_LARGE)
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
    step.new.append(req.to_new_request_data())
    schedule_chunk(state, ws, req, plan.num_new_tokens, step)
