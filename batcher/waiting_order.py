"""The order a worker is offered waiting requests in. No I/O.

`fcfs` (vLLM's): arrival order within each priority. `lpm` (SGLang's longest-prefix-match): the front
of the most urgent priority sorted by how many tokens the worker already holds of each prompt, most
first, ties by arrival. A request that is mostly cached computes little, so serving it first lowers
mean time to first token when cache hits wait behind long uncached prompts (the start of a
prefix-repetition load); an uncached prompt can wait behind a stream of hits as long as they keep
coming, which is why it is not the default.
"""

from __future__ import annotations

from batcher.prefix_cache import cached_prefix_blocks
from batcher.scheduler_state import SchedulerState
from batcher.worker_state import WorkerState

# Only the front of the queue is sorted (SGLang falls back to fcfs past 128 waiting): each candidate
# costs a lookup per block of its prompt on every scheduling pass.
LPM_WINDOW = 128


def order_waiting(state: SchedulerState, ws: WorkerState) -> None:
    """Put the waiting queue in the order `ws` should take requests from it."""
    if state.config.waiting_order != "lpm" or not ws.block_manager.enable_caching:
        return
    bm = ws.block_manager
    state.waiting.sort_front(lambda req: (-len(cached_prefix_blocks(bm, req)), req.arrival_time), LPM_WINDOW)
