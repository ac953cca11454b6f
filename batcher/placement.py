"""Placement across workers: which worker a waiting request goes to. No I/O.

Every worker takes waiting requests in its own step (step_scheduler.py, policy_tgi.py), so placement
is a rule each one checks: a new request goes to the worker with the most free KV blocks, a burst is
split by each worker's share of the free blocks, and a request only a larger worker can hold waits
for that one.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from batcher.request import Request
from batcher.worker_state import WorkerState


def eligible(ws: WorkerState) -> bool:
    """The worker may take one more request: not fenced, a free slot in its batch."""
    return not ws.fenced and len(ws.running) < ws.max_num_seqs


def has_room(ws: WorkerState, req: Request) -> bool:
    """`ws` could admit `req` now: a free slot and blocks for its first chunk."""
    if not eligible(ws) or not ws.can_host(req):
        return False
    num_new = min(req.num_tokens - req.num_computed_tokens, ws.max_num_batched_tokens)
    need = ws.block_manager.num_new_blocks(len(req.block_ids), req.num_computed_tokens + num_new)
    return need <= ws.block_manager.num_free_blocks


def best_worker(workers: Iterable[WorkerState], req: Request, prefer: WorkerState) -> WorkerState | None:
    """The eligible worker able to host `req` with the most free blocks; `prefer` wins a tie."""
    best: WorkerState | None = None
    for ws in workers:
        if not eligible(ws) or not ws.can_host(req):
            continue
        key = (ws.block_manager.num_free_blocks, ws is prefer)
        if best is None or key > (best.block_manager.num_free_blocks, best is prefer):
            best = ws
    return best


def fair_share(workers: Iterable[WorkerState], ws: WorkerState, num_waiting: int) -> int:
    """How many of the waiting requests `ws` may take now, by its share of free blocks."""
    total = sum(w.block_manager.num_free_blocks for w in workers if eligible(w))
    if total == 0:
        return 0
    return math.floor(num_waiting * ws.block_manager.num_free_blocks / total)


def hostable_elsewhere(workers: Iterable[WorkerState], req: Request) -> bool:
    """Some worker's pool could hold `req` (a request too large for every one can only fail)."""
    return any(w.can_host(req) for w in workers)
