"""TGI's step (text-generation-inference, backends/v3/src/backend.rs): prefill whole prompts apart.

New requests are prefilled whole, in a step of their own (the running batch waits), and only when at
least floor(running * waiting_served_ratio) of them fit, unless the running batch has decoded
`max_waiting_tokens` steps since the last admission; otherwise the step decodes. No I/O.
"""

from __future__ import annotations

import math

from batcher.core.placement import fair_share, takes_next
from batcher.core.policies.admission import Verdict, admit, triage
from batcher.core.policies.interface import SchedulingPolicy, StepDraft
from batcher.core.policies.running import schedule_running
from batcher.core.request import Request
from batcher.core.scheduler_state import SchedulerState
from batcher.core.waiting_order import order_waiting
from batcher.core.worker_state import WorkerState


class TGIPolicy(SchedulingPolicy):
    def __init__(self, waiting_served_ratio: float, max_waiting_tokens: int) -> None:
        self.waiting_served_ratio = waiting_served_ratio
        self.max_waiting_tokens = max_waiting_tokens

    def schedule(self, state: SchedulerState, ws: WorkerState, step: StepDraft) -> None:
        min_size = 0
        if ws.running and ws.steps_since_admission < self.max_waiting_tokens:
            min_size = math.floor(len(ws.running) * self.waiting_served_ratio)
        batch = _candidates(state, ws, step)
        if batch and len(batch) >= min_size:
            for req in batch:  # planned again: each one admitted may cache blocks the next one shares
                admit(state, ws, req, ws.kv_cache_manager.plan_admission(req, req.num_tokens), step)
            ws.steps_since_admission = 1
            return
        if ws.running:
            schedule_running(state, ws, ws.max_num_batched_tokens, step)
            ws.steps_since_admission += 1


def _candidates(state: SchedulerState, ws: WorkerState, step: StepDraft) -> list[Request]:
    """The waiting requests (a prefix of the queue, less those whose LoRA adapter has no slot here
    now) one prefill-only step could take whole."""
    kv = ws.kv_cache_manager
    order_waiting(state, ws)
    workers = list(state.workers.values())
    share = fair_share(workers, ws, len(state.waiting))
    weight = state.config.cache_overlap_weight
    free, tokens = kv.num_free_blocks, 0
    picked: list[Request] = []
    for req in list(state.waiting):
        if len(ws.running) + len(picked) >= ws.max_num_seqs or req.num_inflight_steps:
            break
        verdict = triage(state, ws, req, step, picked)
        if verdict is Verdict.STOP:
            break
        if verdict is not Verdict.CONSIDER:
            continue
        if not takes_next(workers, ws, req, len(picked), share, weight):
            break
        # No chunking: a prompt over the budget still goes, alone (TGI sizes its budget to fit one).
        plan = kv.plan_admission(req, req.num_tokens)
        if picked and tokens + plan.num_new_tokens > ws.max_num_batched_tokens:
            break
        if plan.num_free_blocks_needed > free:
            break
        picked.append(req)
        tokens += plan.num_new_tokens
        free -= plan.num_free_blocks_needed
    return picked
