"""Waiting for a prefix being computed (SGLang's in-batch prefix check): whether a worker passes over
a waiting request because a running request is still prefilling the blocks it would compute again.
No I/O.

Blocks become findable as soon as a step computing them is sent (prefix_cache.py), so a request
admitted after its sibling's chunks already shares them. What is left is a request taken while a
sibling's prompt is still being sent in chunks: on another worker (placement.py weighs only blocks
already cached, and a sibling's first chunk may be small), or on the same one. Such a request stays
in the queue while later ones pass it, and is admitted once the sibling's chunks up to the shared
prefix are sent. It is held only while the sibling still has those blocks to send (running requests
are scheduled before waiting ones, so it advances every step), only where waiting changes where it
goes or what it computes, and at most `MAX_PREFIX_WAITS` passes. Only timing changes: a request's
tokens do not depend on which blocks it shares.
"""

from __future__ import annotations

from batcher.core.kv.prefix_cache import block_hashes, max_cached_blocks
from batcher.core.placement import cached_blocks, cost_once_cached, eligible, placement_cost
from batcher.core.request import Request, RequestStatus
from batcher.core.scheduler_state import SchedulerState
from batcher.core.worker_state import WorkerState

# A bound on the hold whatever happens to the sibling: a few of its prefill chunks, many times over.
MAX_PREFIX_WAITS = 64


def waits_for_prefix(state: SchedulerState, ws: WorkerState, req: Request) -> bool:
    """Whether `ws` passes over `req` for now (counted on `req`): a running request is still to send
    blocks of `req`'s prefix, and once it has, `req` computes less here or goes to its worker."""
    if not state.config.prefix_wait or req.num_prefix_waits >= MAX_PREFIX_WAITS:
        return False
    if not ws.kv_cache_manager.enable_caching:
        return False
    weight = state.config.cache_overlap_weight
    for w in state.workers.values():
        # Load-only placement (weight 0) never sends a request after another worker's cache.
        if w is not ws and (not weight or not eligible(w) or not w.can_host(req)):
            continue
        coming = blocks_coming(w, req)
        if not coming:
            continue
        if w is ws:
            held = coming > len(cached_blocks(ws, req))
        else:
            held = cost_once_cached(w, req, coming, weight) < placement_cost(ws, req, weight)
        if held:
            req.num_prefix_waits += 1
            return True
    return False


def blocks_coming(ws: WorkerState, req: Request) -> int:
    """The longest prefix of `req` (in blocks) that a request running on `ws` is still to send in
    its prefill chunks; 0 when none is."""
    bs = ws.kv_cache_manager.block_size
    longest = 0
    limit = max_cached_blocks(req, bs)
    hashes = block_hashes(req, bs)
    for sibling in ws.running:
        prefill_blocks = sibling.num_prefill_tokens // bs
        if sibling.status is not RequestStatus.RUNNING or sibling.num_cached_blocks >= prefill_blocks:
            continue  # its prompt's blocks are all findable already
        shared = _shared_blocks(hashes, block_hashes(sibling, bs), min(limit, prefill_blocks))
        if shared > sibling.num_cached_blocks:
            longest = max(longest, shared)
    return longest


def _shared_blocks(a: list[bytes], b: list[bytes], limit: int) -> int:
    n = 0
    for x, y in zip(a[:limit], b[:limit], strict=False):
        if x != y:
            break
        n += 1
    return n
