"""When a running request is preempted, and which one. No I/O.

Two causes: a worker's KV blocks run out while its running requests grow (step_scheduler.py asks
for a victim), or a waiting request that no worker has room for is more urgent than running ones
(vLLM's priority policy). The victim is always the least urgent running request (highest
`priority` number), the most recently admitted on a tie; it waits again at the front of its
priority level and is recomputed from prompt + tokens so far.
"""

from __future__ import annotations

from batcher.core.lora import fits_among, fits_step, serves_lora
from batcher.core.placement import has_room
from batcher.core.request import Request
from batcher.core.scheduler_state import SchedulerState
from batcher.core.worker_state import WorkerState


def _priority(req: Request) -> int:
    return req.priority


def preemption_victim(running: list[Request]) -> Request:
    """The least urgent running request (highest priority number), the most recently admitted on a tie."""
    return max(reversed(running), key=_priority)  # max keeps the first maximum: the newest


def preempt(state: SchedulerState, ws: WorkerState, req: Request) -> None:
    state.evict(ws, req)
    req.num_preemptions += 1
    state.stats.num_preemptions += 1


def preempt_for_waiting(state: SchedulerState, ws: WorkerState) -> None:
    """A waiting request that no worker has room for takes the place of less urgent running ones.

    An interactive request must not wait for a batch line to finish. The victims (least urgent,
    newest first) go back to the front of their own level, to be recomputed; requests of equal
    priority never preempt each other here, nor is anything preempted for a LoRA request whose
    adapter would still find no slot among the requests that stay.
    """
    if not state.waiting:
        return
    head = state.waiting[0]
    if (
        head.num_inflight_steps
        or not ws.can_host(head)
        or not serves_lora(ws, head)
        or not fits_among([r for r in ws.running if r.priority <= head.priority], head, ws.info.max_loras)
        or any(has_room(w, head) for w in state.workers.values())
    ):
        return
    while not has_room(ws, head):
        # Short of an adapter slot, only requests running an adapter can give one back.
        slot_short = not fits_step(ws, head)
        candidates = [r for r in ws.running if r.lora_key is not None] if slot_short else ws.running
        victim = preemption_victim(candidates) if candidates else None
        if victim is None or victim.priority <= head.priority:
            return
        preempt(state, ws, victim)
