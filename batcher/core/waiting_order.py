"""The order a worker is offered waiting requests in. No I/O.

`fcfs` (vLLM's): arrival order within each priority. `lpm` (SGLang's longest-prefix-match): the front
of the most urgent priority sorted by how many tokens the worker already holds of each prompt, most
first. A request that is mostly cached computes little, so serving it first lowers mean time to
first token when cache hits wait behind long uncached prompts (the start of a prefix-repetition
load). Among equal ones, prompts whose first block more waiting requests share go first, siblings
together (as SGLang's dfs-weight): once one is computed the others are hits. Then arrival. An
uncached prompt can wait behind a stream of hits as long as they keep coming, which is why it is
not the default.
"""

from __future__ import annotations

from collections import Counter

from batcher.core.kv.prefix_cache import block_hashes
from batcher.core.request import Request
from batcher.core.scheduler_state import SchedulerState
from batcher.core.worker_state import WorkerState

# Only the front of the queue is sorted (SGLang falls back to fcfs past 128 waiting): each candidate
# costs a lookup per block of its prompt on every scheduling pass.
LPM_WINDOW = 128


def order_waiting(state: SchedulerState, ws: WorkerState) -> None:
    """Put the waiting queue in the order `ws` should take requests from it."""
    if state.config.waiting_order != "lpm" or not ws.kv_cache_manager.enable_caching or not state.waiting:
        return
    kv = ws.kv_cache_manager
    top = state.waiting[0].priority
    front = [req for _, req in zip(range(LPM_WINDOW), state.waiting, strict=False) if req.priority == top]
    cached = {req.req_id: len(kv.get_computed_blocks(req)) for req in front}
    first = {req.req_id: _first_block(req, kv.block_size) for req in front}
    sharing = Counter(first.values())
    arrival: dict[bytes | str, float] = {}
    for req in front:
        arrival.setdefault(first[req.req_id], req.arrival_time)

    def key(req: Request) -> tuple[int, int, float, float]:
        group = first[req.req_id]
        return (-cached[req.req_id], -sharing[group], arrival[group], req.arrival_time)

    state.waiting.sort_front(key, LPM_WINDOW)


def _first_block(req: Request, block_size: int) -> bytes | str:
    """The hash of `req`'s first block, its id when its prompt is shorter than a block."""
    hashes = block_hashes(req, block_size)
    return hashes[0] if hashes else req.req_id
