"""One worker's batch after a step was scheduled, as the dashboard draws it (common/trace_schema.py).

Built from the scheduler's state right after `Scheduler.schedule(worker_id)`, when each scheduled
request's `num_computed_tokens` already counts the step: the kind and the sample follow from there.
"""

from __future__ import annotations

from batcher.core.request import Request
from batcher.core.worker_state import WorkerState
from common.protocol import SchedulerOutput
from common.trace_schema import StepTrace, TracedRequest, TraceKind, short_id


def _kind(req: Request, num_tokens: int) -> TraceKind:
    if num_tokens == 0:
        return "w"
    # The step's drafts (spec_token_ids) are not counted as computed until the result accepts them.
    computed_before = req.num_computed_tokens - (num_tokens - len(req.spec_token_ids))
    return "p" if computed_before < req.num_prefill_tokens else "d"


def step_trace(ws: WorkerState, out: SchedulerOutput, num_waiting: int, now: float) -> StepTrace:
    reqs: list[TracedRequest] = []
    num_sampled = 0
    for req in ws.running:
        n = out.num_scheduled_tokens.get(req.req_id, 0)
        reqs.append(TracedRequest(short_id(req.req_id), _kind(req, n), n))
        # A step samples once every known token is computed (placeholders of async steps included).
        if n and req.num_computed_tokens >= req.num_tokens:
            num_sampled += 1
    kv = ws.kv_cache_manager
    return StepTrace(
        worker_id=ws.info.worker_id,
        step_id=out.step_id,
        time=now,
        reqs=reqs,
        num_sampled=num_sampled,
        num_blocks_used=kv.num_blocks - kv.num_free_blocks,
        num_blocks=kv.num_blocks,
        num_blocks_cached=kv.num_evictable_blocks,
        num_waiting=num_waiting,
    )
