"""One worker's KV blocks as its requests hold them (vLLM v1's KVCacheManager). No I/O.

The scheduler never touches block ids itself: it asks this manager for a request's cached prefix
(`get_computed_blocks`, `plan_admission`), for the blocks of the tokens it schedules
(`allocate_slots`, which extends `req.block_ids` or returns None when the pool is short), to make
computed blocks findable (`cache_blocks`) and to give a request's blocks back (`free`). The pool's
reference counts and eviction order are block_manager.py's; the block hashes prefix_cache.py's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from batcher.core.kv.block_manager import BlockManager
from batcher.core.kv.prefix_cache import block_hashes, max_cached_blocks
from batcher.core.request import Request


@dataclass(slots=True)
class Admission:
    """What admitting a waiting request on a worker takes, before anything is taken."""

    cached_block_ids: list[int]  # its longest cached prefix on that worker
    num_cached_tokens: int  # tokens those blocks hold: computed without computing them
    num_new_tokens: int  # tokens to compute in the admitting step
    num_free_blocks_needed: int  # new blocks plus cached ones nobody held until now


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = True) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_caching = enable_caching
        self._pool = BlockManager(num_blocks, block_size, enable_caching)

    # ----- the pool ------------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        """Blocks a request could take now: unused ones and cached ones nobody holds."""
        return self._pool.num_free_blocks

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks needed to hold `num_tokens` tokens."""
        return self._pool.blocks_for(num_tokens)

    @property
    def num_evictable_blocks(self) -> int:
        """Cached blocks nobody holds: free, but worth keeping until the space is needed."""
        return self._pool.num_evictable_blocks

    def num_unheld(self, block_ids: list[int]) -> int:
        """How many of `block_ids` nobody holds: taking them uses up that many free blocks."""
        return self._pool.num_unheld(block_ids)

    @property
    def num_cached_blocks(self) -> int:
        """Blocks holding a reusable prefix (held by requests or not)."""
        return self._pool.num_cached_blocks

    # ----- the prefix cache ----------------------------------------------------------------------
    def get_computed_blocks(self, req: Request) -> list[int]:
        """The blocks of `req`'s longest cached prefix that admitting it would take (nothing taken)."""
        max_blocks = max_cached_blocks(req, self.block_size)
        if not max_blocks:
            return []
        return self._pool.cached_prefix(block_hashes(req, self.block_size), max_blocks)

    def plan_admission(
        self, req: Request, budget: int, fit: Callable[[int, int], int] | None = None
    ) -> Admission:
        """Admitting waiting `req` with up to `budget` tokens computed in this step; `fit` cuts the
        (start, number) of tokens to compute further (its images: batcher/core/multimodal.py)."""
        cached = self.get_computed_blocks(req)
        num_cached = len(cached) * self.block_size
        num_new = min(req.num_tokens - num_cached, budget)
        if fit is not None:
            num_new = fit(num_cached, num_new)
        return Admission(cached, num_cached, num_new, self._num_needed(0, num_cached + num_new, cached))

    def cache_blocks(self, req: Request, num_computed_tokens: int) -> None:
        """Make `req`'s full blocks up to `num_computed_tokens` findable (once the step computing them
        is sent). Tokens not yet known (sampled by a step in flight) wait for a later step."""
        if not self.enable_caching:
            return
        num_full = min(num_computed_tokens, req.num_tokens) // self.block_size
        if num_full <= req.num_cached_blocks:
            return
        hashes = block_hashes(req, self.block_size)
        for i in range(req.num_cached_blocks, num_full):
            self._pool.cache(req.block_ids[i], hashes[i])
        req.num_cached_blocks = num_full

    def uncache_unshared(self, req: Request) -> None:
        """Forget the hashes of the blocks only `req` holds: its worker dropped it, maybe before
        writing their KV, so they must not be found."""
        self._pool.uncache([b for b in req.block_ids if self._pool.ref_count(b) == 1])

    # ----- a request's blocks --------------------------------------------------------------------
    def can_allocate(self, req: Request, num_new_tokens: int) -> bool:
        """Whether `allocate_slots(req, num_new_tokens)` would succeed now."""
        end = req.num_computed_tokens + num_new_tokens
        return self._num_needed(len(req.block_ids), end, ()) <= self.num_free_blocks

    def allocate_slots(
        self, req: Request, num_new_tokens: int, new_computed_blocks: Sequence[int] = ()
    ) -> list[int] | None:
        """Hold `new_computed_blocks` (a cached prefix found by `get_computed_blocks`) for `req` and
        the blocks its KV needs for `num_new_tokens` more tokens, appended to `req.block_ids`; returns
        the newly allocated ones, or None, with nothing taken, when the pool is short."""
        held = len(req.block_ids)
        if not new_computed_blocks and req.num_computed_tokens + num_new_tokens <= held * self.block_size:
            return []  # a running decode whose blocks hold its next tokens: most steps of most requests
        end = req.num_computed_tokens + len(new_computed_blocks) * self.block_size + num_new_tokens
        if self._num_needed(held, end, new_computed_blocks) > self.num_free_blocks:
            return None
        # Taken before allocating: allocation evicts free cached blocks, and these must survive it.
        self._pool.take(list(new_computed_blocks))
        req.block_ids.extend(new_computed_blocks)
        req.num_cached_blocks += len(new_computed_blocks)
        new_block_ids = self._pool.allocate(self._pool.num_new_blocks(len(req.block_ids), end))
        req.block_ids.extend(new_block_ids)
        return new_block_ids

    def free(self, req: Request) -> None:
        """Give back every block `req` holds."""
        self._pool.free(req.block_ids)
        req.block_ids = []

    def _num_needed(self, num_held: int, num_tokens: int, new_computed_blocks: Sequence[int]) -> int:
        """Free blocks a table of `num_held` blocks plus `new_computed_blocks` uses up to hold
        `num_tokens` tokens: its new blocks, and the cached ones nobody held until now."""
        num_new = self._pool.num_new_blocks(num_held + len(new_computed_blocks), num_tokens)
        return num_new + self._pool.num_unheld(list(new_computed_blocks))
