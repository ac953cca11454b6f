"""What prefixes a gateway sent to a cell: a bounded LRU set of chained block hashes per cell.

A prompt's token ids are cut into fixed-size blocks, each named by a hash chained on its parent's
(as the batcher's prefix cache names KV blocks), so a block's hash stands for the whole prefix up
to it and a prompt's match is its longest run of leading hashes found; with the same extra keys (a
LoRA adapter's `cache_key`), so a prompt for an adapter matches only what that adapter was sent.
The index holds what this gateway placed, not what the cell's workers keep: an approximation (as
SGLang's router keeps), which other gateways' placements and the workers' own evictions make stale;
it only steers placement.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from common.block_hash import hash_block

# Tokens per hashed block until a cell's workers announce theirs (WorkerInfo.block_size): the
# workers' default, so a match counts whole cache blocks.
BLOCK_TOKENS = 16


def prompt_hashes(
    token_ids: Sequence[int], block_tokens: int = BLOCK_TOKENS, extra_keys: bytes = b""
) -> list[bytes]:
    """The chained hashes of every full block of `token_ids`, each with `extra_keys` (as the batcher's
    prefix cache hashes them: batcher/core/kv/prefix_cache.py)."""
    hashes: list[bytes] = []
    parent: bytes | None = None
    for start in range(0, len(token_ids) - block_tokens + 1, block_tokens):
        parent = hash_block(parent, token_ids[start : start + block_tokens], extra_keys)
        hashes.append(parent)
    return hashes


class PrefixIndex:
    """One cell's recently placed block hashes, the least recently used dropped past `capacity`."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._blocks: OrderedDict[bytes, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._blocks)

    def matched(self, hashes: Sequence[bytes]) -> int:
        """How many leading blocks of `hashes` the cell was sent."""
        for i, block in enumerate(hashes):
            if block not in self._blocks:
                return i
        return len(hashes)

    def add(self, hashes: Sequence[bytes]) -> None:
        """Record a prompt placed in the cell; its blocks become the most recently used."""
        for block in hashes:
            self._blocks[block] = None
            self._blocks.move_to_end(block)
        while len(self._blocks) > self.capacity:
            self._blocks.popitem(last=False)

    def clear(self) -> None:
        self._blocks.clear()
