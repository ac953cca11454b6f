"""Placement across workers: which worker a waiting request goes to. No I/O.

Every worker takes waiting requests in its own step (policies/fused.py, policies/tgi.py), so placement
is a rule each one checks. A worker's cost for a request is NVIDIA Dynamo's
router cost: the blocks it would still have to prefill there, times `cache_overlap_weight`, plus
its load once it holds the request (blocks it would take, less its free blocks); the cheapest worker
takes it. A burst is split by each worker's share of
the free blocks, and within its share a worker takes only requests no other worker has a longer
cached prefix for. Weight 0 is load-only placement: the most free blocks wins. A request
only a larger worker can hold waits for that one. A LoRA request goes only to a worker that serves
adapters and has a slot for its adapter (lora.py), preferring one with room that was sent the adapter
already: it need not read it from disk, and its requests share one slot there.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from batcher.core.lora import fits_step, holds_adapter, serves_lora
from batcher.core.request import Request
from batcher.core.worker_state import WorkerState


def eligible(ws: WorkerState) -> bool:
    """The worker may take one more request: not fenced, a free slot in its batch."""
    return not ws.fenced and len(ws.running) < ws.max_num_seqs


def can_take(ws: WorkerState, req: Request) -> bool:
    """`ws` could run `req` once it has room: large enough, serving its adapter with a slot for it."""
    return eligible(ws) and ws.can_host(req) and serves_lora(ws, req) and fits_step(ws, req)


def has_room(ws: WorkerState, req: Request) -> bool:
    """`ws` could admit `req` now: a free slot and blocks for its first chunk."""
    if not can_take(ws, req):
        return False
    kv = ws.kv_cache_manager
    return kv.plan_admission(req, ws.max_num_batched_tokens).num_free_blocks_needed <= kv.num_free_blocks


def cached_blocks(ws: WorkerState, req: Request) -> list[int]:
    """The blocks of `req`'s prefix that `ws` holds in its cache."""
    return ws.kv_cache_manager.get_computed_blocks(req)


def placement_cost(ws: WorkerState, req: Request, weight: float) -> float:
    """Lower is better: the blocks `req` would prefill on `ws` (weighted) plus `ws`'s load once it
    holds `req` (the blocks it would take, less the free ones). Weight 0: the load alone."""
    kv = ws.kv_cache_manager
    if not weight:
        return -kv.num_free_blocks
    cached = cached_blocks(ws, req)
    return _cost(ws, req, len(cached), kv.num_unheld(cached), weight)


def cost_once_cached(ws: WorkerState, req: Request, num_cached: int, weight: float) -> float:
    """`placement_cost` once `ws` holds `num_cached` blocks of `req`'s prefix for a running request
    (prefix_wait.py asks whether waiting for them would change where `req` goes)."""
    return _cost(ws, req, num_cached, 0, weight)


def _cost(ws: WorkerState, req: Request, num_cached: int, num_unheld: int, weight: float) -> float:
    kv = ws.kv_cache_manager
    prefill_blocks = kv.blocks_for(req.num_tokens) - num_cached
    return weight * prefill_blocks + prefill_blocks + num_unheld - kv.num_free_blocks


def best_worker(
    workers: Iterable[WorkerState], req: Request, prefer: WorkerState, weight: float
) -> WorkerState | None:
    """The eligible worker able to host `req` at the lowest cost (weight 0: the most free blocks),
    among those with room for it now if any has, and among those the ones holding its adapter if any
    does; `prefer` wins a tie."""
    candidates = [ws for ws in workers if can_take(ws, req)]
    if weight:
        candidates = [ws for ws in candidates if has_room(ws, req)] or candidates
    if req.lora_request is not None:
        candidates = [ws for ws in candidates if holds_adapter(ws, req) and has_room(ws, req)] or candidates
    return min(candidates, key=lambda ws: (placement_cost(ws, req, weight), ws is not prefer), default=None)


def takes_next(
    workers: list[WorkerState], ws: WorkerState, req: Request, admitted: int, share: int, weight: float
) -> bool:
    """Whether `ws` takes `req`, the head of the queue, having taken `admitted` of its `share`."""
    if (
        admitted < share
        and not (weight and cached_longer_elsewhere(workers, ws, req))
        and not adapter_elsewhere(workers, ws, req)
    ):
        return True
    return best_worker(workers, req, prefer=ws, weight=weight) is ws


def cached_longer_elsewhere(workers: list[WorkerState], ws: WorkerState, req: Request) -> bool:
    here = len(cached_blocks(ws, req))
    return any(len(cached_blocks(w, req)) > here for w in workers if w is not ws and eligible(w))


def adapter_elsewhere(workers: list[WorkerState], ws: WorkerState, req: Request) -> bool:
    """`req`'s adapter is not on `ws` but on another worker with room for it."""
    if req.lora_request is None or holds_adapter(ws, req):
        return False
    return any(holds_adapter(w, req) and has_room(w, req) for w in workers if w is not ws)


def fair_share(workers: Iterable[WorkerState], ws: WorkerState, num_waiting: int) -> int:
    """How many of the waiting requests `ws` may take now, by its share of free blocks."""
    total = sum(w.kv_cache_manager.num_free_blocks for w in workers if eligible(w))
    if total == 0:
        return 0
    return math.floor(num_waiting * ws.kv_cache_manager.num_free_blocks / total)


def hostable_elsewhere(workers: Iterable[WorkerState], req: Request) -> bool:
    """Some worker's pool could hold `req` and it serves its adapter (else it can only fail)."""
    return any(w.can_host(req) and serves_lora(w, req) for w in workers)
