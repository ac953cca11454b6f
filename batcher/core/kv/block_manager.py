"""KV-cache block accounting for one worker's pool (the batcher's view; the worker holds the tensors).

Blocks are reference-counted: a full block's KV can be shared by every request whose tokens up to
the end of that block are the same, found by its hash (prefix_cache.py computes them). A block whose
count drops to zero keeps its hash and stays cached until a new block is needed: free blocks are
handed out least recently freed first, and taking a cached one for new tokens forgets its hash.
"""

from __future__ import annotations

from collections import OrderedDict


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = True) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError("num_blocks and block_size must be positive")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_caching = enable_caching
        self._ref_counts = [0] * num_blocks
        self._hashes: list[bytes | None] = [None] * num_blocks
        self._cached: dict[bytes, int] = {}  # block hash -> the block holding that KV
        # Blocks no request holds, in eviction order (first out first); cached ones keep their hash.
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._num_evictable = 0  # free blocks that hold a hash

    @property
    def num_free_blocks(self) -> int:
        """Blocks a request could take now: unused ones and cached ones nobody holds."""
        return len(self._free)

    @property
    def num_cached_blocks(self) -> int:
        """Blocks holding a reusable prefix (held by requests or not)."""
        return len(self._cached)

    @property
    def num_evictable_blocks(self) -> int:
        """Cached blocks nobody holds: free, but worth keeping until the space is needed."""
        return self._num_evictable

    @property
    def usage(self) -> float:
        """Fraction of the pool held by requests, 0.0 to 1.0."""
        return 1.0 - len(self._free) / self.num_blocks

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks needed to hold `num_tokens` tokens."""
        return -(-num_tokens // self.block_size)

    def num_new_blocks(self, held: int, num_tokens: int) -> int:
        """Blocks to add to a table of `held` blocks so that it holds `num_tokens` tokens."""
        return max(self.blocks_for(num_tokens) - held, 0)

    def ref_count(self, block_id: int) -> int:
        return self._ref_counts[block_id]

    # ----- the prefix cache ----------------------------------------------------------------------
    def cached_prefix(self, block_hashes: list[bytes], max_blocks: int) -> list[int]:
        """The blocks holding the longest cached run of `block_hashes` from the start (at most
        `max_blocks`). Nothing is taken: pass them to `take` to hold them."""
        hits: list[int] = []
        if not self.enable_caching:
            return hits
        for block_hash in block_hashes[:max_blocks]:
            block_id = self._cached.get(block_hash)
            if block_id is None:
                break
            hits.append(block_id)
        return hits

    def num_unheld(self, block_ids: list[int]) -> int:
        """How many of `block_ids` nobody holds: taking them uses up that many free blocks."""
        return sum(1 for b in block_ids if self._ref_counts[b] == 0)

    def take(self, block_ids: list[int]) -> None:
        """Hold cached blocks for one more request."""
        for block_id in block_ids:
            if self._ref_counts[block_id] == 0:
                del self._free[block_id]
                self._num_evictable -= self._hashes[block_id] is not None
            self._ref_counts[block_id] += 1

    def cache(self, block_id: int, block_hash: bytes) -> None:
        """Make a held, full block findable by its hash; a hash already cached keeps its block."""
        if not self.enable_caching or self._hashes[block_id] is not None:
            return
        if block_hash not in self._cached:
            self._cached[block_hash] = block_id
            self._hashes[block_id] = block_hash

    def uncache(self, block_ids: list[int]) -> None:
        """Forget the hashes of these blocks (their KV may never have been written)."""
        for block_id in block_ids:
            self._forget(block_id)

    # ----- allocation ----------------------------------------------------------------------------
    def allocate(self, n: int) -> list[int]:
        """`n` blocks for new tokens, held once; cached ones nobody holds are evicted oldest first."""
        if n > len(self._free):
            raise RuntimeError(f"asked for {n} blocks, {len(self._free)} free")
        block_ids = []
        for _ in range(n):
            block_id, _ = self._free.popitem(last=False)
            self._forget(block_id)
            self._ref_counts[block_id] = 1
            block_ids.append(block_id)
        return block_ids

    def free(self, block_ids: list[int]) -> None:
        """Drop one hold on each block. Those nobody holds go to the back of the eviction order, a
        table's last block first, so a shared prefix outlives the private tail behind it."""
        for block_id in reversed(block_ids):
            self._ref_counts[block_id] -= 1
            if self._ref_counts[block_id] < 0:
                raise RuntimeError(f"block {block_id} freed more often than held")
            if self._ref_counts[block_id] == 0:
                self._free[block_id] = None
                self._num_evictable += self._hashes[block_id] is not None

    def _forget(self, block_id: int) -> None:
        block_hash = self._hashes[block_id]
        if block_hash is not None:
            self._hashes[block_id] = None
            self._num_evictable -= self._ref_counts[block_id] == 0
            if self._cached.get(block_hash) == block_id:
                del self._cached[block_hash]
