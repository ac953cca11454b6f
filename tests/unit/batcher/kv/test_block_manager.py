"""The batcher's block accounting with prefix caching: hash chains, reference counts, LRU eviction."""

from __future__ import annotations

import pytest

from batcher.core.kv.block_manager import BlockManager
from batcher.core.kv.prefix_cache import block_hashes
from common.block_hash import hash_block
from tests.unit.batcher.test_scheduler import request


def test_a_block_hash_names_its_tokens_and_everything_before_them() -> None:
    a = hash_block(None, [1, 2, 3, 4])
    assert a == hash_block(None, [1, 2, 3, 4])
    assert a != hash_block(None, [1, 2, 3, 5])
    # The same tokens under another parent are another block: the KV depends on the whole prefix.
    assert hash_block(a, [5, 6, 7, 8]) != hash_block(None, [5, 6, 7, 8])
    assert hash_block(a, [5, 6, 7, 8]) != hash_block(hash_block(None, [9, 2, 3, 4]), [5, 6, 7, 8])
    # Extra keys (an adapter, an image) change the name too.
    assert hash_block(None, [1, 2, 3, 4], b"lora-1") != a


def test_a_request_hashes_its_full_blocks_only_and_extends_them_as_it_grows() -> None:
    req = request("r", prompt_len=10, prompt=[1, 2, 3, 4, 5, 6, 7, 8, 9, 10])
    hashes = block_hashes(req, 4)
    assert hashes == [hash_block(None, [1, 2, 3, 4]), hash_block(hashes[0], [5, 6, 7, 8])]
    req.output_token_ids += [11, 12]
    assert block_hashes(req, 4)[2] == hash_block(hashes[1], [9, 10, 11, 12])
    assert len(block_hashes(req, 8)) == 1  # another block size: hashed anew


def test_a_cached_prefix_is_the_longest_run_of_known_hashes_from_the_start() -> None:
    bm = BlockManager(8, 4)
    blocks = bm.allocate(3)
    h = [b"h0", b"h1", b"h2"]
    bm.cache(blocks[0], h[0])
    bm.cache(blocks[2], h[2])  # not reachable: its parent is not cached
    assert bm.cached_prefix(h, max_blocks=3) == [blocks[0]]
    bm.cache(blocks[1], h[1])
    assert bm.cached_prefix(h, max_blocks=3) == blocks
    assert bm.cached_prefix(h, max_blocks=2) == blocks[:2]
    assert BlockManager(8, 4, enable_caching=False).cached_prefix(h, 3) == []


def test_shared_blocks_are_counted_and_free_only_when_nobody_holds_them() -> None:
    bm = BlockManager(4, 4)
    [block] = bm.allocate(1)
    bm.cache(block, b"h")
    bm.take([block])  # a second request shares it
    assert bm.ref_count(block) == 2 and bm.num_free_blocks == 3
    bm.free([block])
    assert bm.ref_count(block) == 1 and bm.num_free_blocks == 3
    bm.free([block])
    # Nobody holds it: free again, but still cached until its space is needed.
    assert bm.num_free_blocks == 4 and bm.num_evictable_blocks == 1
    assert bm.cached_prefix([b"h"], 1) == [block] and bm.num_unheld([block]) == 1
    bm.take([block])
    assert bm.num_free_blocks == 3 and bm.num_evictable_blocks == 0
    with pytest.raises(RuntimeError):
        bm.free([block, block])


def test_eviction_takes_unused_blocks_first_then_cached_ones_least_recently_freed() -> None:
    bm = BlockManager(4, 4)
    first, second = bm.allocate(2)
    bm.cache(first, b"a")
    bm.cache(second, b"b")
    bm.free([first, second])  # the table's tail goes first: `second` is evicted before `first`
    fresh = bm.allocate(2)
    assert set(fresh).isdisjoint({first, second})  # never-used blocks before cached ones
    assert bm.num_cached_blocks == 2
    [evicted] = bm.allocate(1)
    assert evicted == second and bm.cached_prefix([b"b"], 1) == []
    assert bm.cached_prefix([b"a"], 1) == [first]
    [evicted] = bm.allocate(1)
    assert evicted == first and bm.num_cached_blocks == 0
    with pytest.raises(RuntimeError):
        bm.allocate(1)


def test_held_blocks_are_never_evicted() -> None:
    bm = BlockManager(2, 4)
    blocks = bm.allocate(2)
    for block, name in zip(blocks, (b"held", b"unheld"), strict=True):
        bm.cache(block, name)
    bm.free(blocks[1:])
    assert bm.allocate(1) == blocks[1:]  # the only block nobody holds
    assert bm.cached_prefix([b"held"], 1) == blocks[:1]
    with pytest.raises(RuntimeError):
        bm.allocate(1)


def test_a_hash_keeps_its_first_block_and_uncache_forgets() -> None:
    bm = BlockManager(4, 4)
    a, b = bm.allocate(2)
    bm.cache(a, b"h")
    bm.cache(b, b"h")  # computed twice at once: the first copy stays the one found
    assert bm.cached_prefix([b"h"], 1) == [a]
    bm.uncache([a])
    assert bm.cached_prefix([b"h"], 1) == [] and bm.num_cached_blocks == 0
    bm.cache(b, b"h")
    assert bm.cached_prefix([b"h"], 1) == [b]
