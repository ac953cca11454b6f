"""The KV manager facade (batcher/core/kv/kv_cache_manager.py): it alone hands out a request's block
ids, extends `req.block_ids`, and says None when the pool is short, taking nothing then."""

from __future__ import annotations

from batcher.core.kv.kv_cache_manager import KVCacheManager
from batcher.core.request import Request
from batcher.core.worker_state import WorkerState
from tests.unit.batcher.test_scheduler import request


def hold_blocks(ws: WorkerState, n: int) -> Request:
    """A request (never scheduled) holding `n` of `ws`'s blocks: load on the worker."""
    kv = ws.kv_cache_manager
    holder = request(f"holder-{n}-{kv.num_free_blocks}", prompt_len=n * kv.block_size)
    assert kv.allocate_slots(holder, holder.num_tokens) is not None
    return holder


def test_allocate_slots_extends_the_request_and_free_gives_every_block_back() -> None:
    kv = KVCacheManager(num_blocks=8, block_size=4)
    req = request("r", prompt_len=6)
    first = kv.allocate_slots(req, 6)
    assert first is not None and len(first) == 2 and req.block_ids == first
    req.num_computed_tokens = 6
    assert kv.allocate_slots(req, 2) == []  # the second block has room for them
    third = kv.allocate_slots(req, 3)
    assert third is not None and len(third) == 1 and req.block_ids == first + third
    assert kv.num_free_blocks == 5
    kv.free(req)
    assert req.block_ids == [] and kv.num_free_blocks == 8


def test_a_short_pool_answers_none_and_takes_nothing() -> None:
    kv = KVCacheManager(num_blocks=3, block_size=4)
    req = request("r", prompt_len=16)
    assert not kv.can_allocate(req, 16)
    assert kv.allocate_slots(req, 16) is None
    assert req.block_ids == [] and kv.num_free_blocks == 3
    assert kv.can_allocate(req, 12) and kv.allocate_slots(req, 12) is not None


def test_computed_blocks_are_shared_and_only_the_rest_is_allocated() -> None:
    kv = KVCacheManager(num_blocks=8, block_size=4)
    a = request("a", 0, prompt=list(range(10)))
    assert kv.allocate_slots(a, a.num_tokens) is not None
    kv.cache_blocks(a, a.num_tokens)  # its two full blocks become findable
    assert a.num_cached_blocks == 2
    b = request("b", 0, prompt=[*range(8), 77, 78, 79])
    plan = kv.plan_admission(b, budget=64)
    assert plan.cached_block_ids == a.block_ids[:2] and plan.num_cached_tokens == 8
    assert plan.num_new_tokens == 3 and plan.num_free_blocks_needed == 1
    new = kv.allocate_slots(b, plan.num_new_tokens, plan.cached_block_ids)
    assert new is not None and b.block_ids == [*a.block_ids[:2], *new] and b.num_cached_blocks == 2
    assert kv.num_free_blocks == 8 - 3 - 1
    kv.free(a)
    assert kv.num_free_blocks == 8 - 3  # the shared blocks stay held by b


def test_uncache_unshared_forgets_only_the_blocks_the_request_holds_alone() -> None:
    kv = KVCacheManager(num_blocks=8, block_size=4)
    a = request("a", 0, prompt=list(range(9)))
    assert kv.allocate_slots(a, a.num_tokens) is not None
    kv.cache_blocks(a, a.num_tokens)
    b = request("b", 0, prompt=[*range(4), 50, 51, 52, 53, 54])
    shared = kv.get_computed_blocks(b)
    assert shared == a.block_ids[:1]
    assert kv.allocate_slots(b, 5, shared) is not None
    kv.uncache_unshared(a)  # its second block was its own; the first is b's too
    assert kv.get_computed_blocks(a) == a.block_ids[:1]
