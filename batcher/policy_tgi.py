"""TGI's step (text-generation-inference, backends/v3/src/backend.rs): prefill whole prompts apart.

New requests are prefilled whole, in a step of their own (the running batch waits), and only when at
least floor(running * waiting_served_ratio) of them fit, unless the running batch has decoded
`max_waiting_tokens` steps since the last admission; otherwise the step decodes. No I/O.
"""

from __future__ import annotations

import math

from batcher.placement import best_worker, fair_share, hostable_elsewhere
from batcher.policy_fused import admit, fail_too_large, schedule_running
from batcher.request import Request
from batcher.scheduler_state import SchedulerState, StepDraft
from batcher.worker_state import WorkerState


def schedule_tgi(state: SchedulerState, ws: WorkerState, step: StepDraft) -> None:
    cfg = state.config
    min_size = 0
    if ws.running and ws.steps_since_admission < cfg.max_waiting_tokens:
        min_size = math.floor(len(ws.running) * cfg.waiting_served_ratio)
    batch = _candidates(state, ws, step)
    if batch and len(batch) >= min_size:
        for req in batch:
            admit(state, ws, req.num_tokens - req.num_computed_tokens, step)
        ws.steps_since_admission = 1
        return
    if ws.running:
        schedule_running(state, ws, ws.max_num_batched_tokens, step)
        ws.steps_since_admission += 1


def _candidates(state: SchedulerState, ws: WorkerState, step: StepDraft) -> list[Request]:
    """The waiting requests (a prefix of the queue) one prefill-only step could take whole."""
    bm = ws.block_manager
    share = fair_share(state.workers.values(), ws, len(state.waiting))
    free, tokens = bm.num_free_blocks, 0
    picked: list[Request] = []
    for req in list(state.waiting):
        if len(ws.running) + len(picked) >= ws.max_num_seqs or req.num_inflight_steps:
            break
        if not ws.can_host(req):
            if hostable_elsewhere(state.workers.values(), req):
                break
            fail_too_large(state, req, step)
            continue
        if len(picked) >= share and best_worker(state.workers.values(), req, prefer=ws) is not ws:
            break
        num_new = req.num_tokens - req.num_computed_tokens
        # No chunking: a prompt over the budget still goes, alone (TGI sizes its budget to fit one).
        if picked and tokens + num_new > ws.max_num_batched_tokens:
            break
        need = bm.num_new_blocks(len(req.block_ids), req.num_computed_tokens + num_new)
        if need > free:
            break
        picked.append(req)
        tokens += num_new
        free -= need
    return picked
