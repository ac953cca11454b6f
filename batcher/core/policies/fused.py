"""The fused step (vLLM v1): running requests first, then waiting ones, under one token budget. No I/O.

Decodes and unfinished prefill chunks of the running batch take the budget first, most urgent
first (running.py); waiting requests are admitted with what is left, so a prompt longer than the
budget left is computed in chunks over several steps while decodes keep going. When the worker's KV
blocks run out, running requests are preempted (preemption.py) and no new one is admitted in that step.
"""

from __future__ import annotations

from functools import partial

from batcher.core.multimodal import fit_mm_chunk
from batcher.core.placement import fair_share, takes_next
from batcher.core.policies.admission import Verdict, admit, triage
from batcher.core.policies.interface import SchedulingPolicy, StepDraft
from batcher.core.policies.running import schedule_running
from batcher.core.prefix_wait import waits_for_prefix
from batcher.core.scheduler_state import SchedulerState
from batcher.core.waiting_order import order_waiting
from batcher.core.worker_state import WorkerState


class FusedPolicy(SchedulingPolicy):
    def schedule(self, state: SchedulerState, ws: WorkerState, step: StepDraft) -> None:
        budget, preempted = schedule_running(state, ws, ws.max_num_batched_tokens, step)
        if not preempted:
            schedule_waiting(state, ws, budget, step)


def schedule_waiting(
    state: SchedulerState,
    ws: WorkerState,
    budget: int,
    step: StepDraft,
) -> int:
    """Admit waiting requests in queue order (waiting_order.py) while the budget, a slot and blocks
    allow; one whose prefix a running request is still prefilling, or whose LoRA adapter has no slot
    on this worker now (lora.py), is passed over for now (prefix_wait.py)."""
    kv = ws.kv_cache_manager
    order_waiting(state, ws)
    workers = list(state.workers.values())
    share = fair_share(workers, ws, len(state.waiting))
    weight = state.config.cache_overlap_weight
    admitted = passed = 0
    while len(state.waiting) > passed and budget > 0 and len(ws.running) < ws.max_num_seqs:
        req = state.waiting[passed]
        if req.num_inflight_steps:
            break  # preempted while a step ran: its last token is still on the way
        verdict = triage(state, ws, req, step)
        if verdict is Verdict.STOP:
            break  # a larger worker will take it; keep arrival order
        if verdict is Verdict.FAILED:
            continue
        if verdict is Verdict.PASS_OVER or waits_for_prefix(state, ws, req):
            passed += 1
            if passed >= ws.max_num_seqs:
                break  # a pass looks past at most a batch of held requests: it stays cheap
            continue
        if not takes_next(workers, ws, req, admitted, share, weight):
            break  # placement.py sends it elsewhere
        plan = kv.plan_admission(req, budget, partial(fit_mm_chunk, ws, req, step=step, anew=True))
        if plan.num_new_tokens <= 0:
            break  # its next image waits for a step with encoder budget (multimodal.py)
        if plan.num_free_blocks_needed > kv.num_free_blocks:
            break
        if not ws.info.chunked_prefill and plan.num_cached_tokens + plan.num_new_tokens < req.num_tokens:
            break  # an encoder computes a prompt whole: it waits for a step with room for all of it
        admit(state, ws, req, plan, step)
        budget -= plan.num_new_tokens
        admitted += 1
    return budget
