"""Placement across workers (batcher/core/placement.py): which worker a waiting request goes to."""

from __future__ import annotations

from batcher.core.placement import best_worker, fair_share, has_room, hostable_elsewhere
from batcher.core.worker_state import WorkerState
from tests.unit.batcher.kv.test_kv_cache_manager import hold_blocks
from tests.unit.batcher.test_scheduler import request, worker


def state(worker_id: str, num_blocks: int = 16, max_num_seqs: int = 4, max_len: int = 256) -> WorkerState:
    info = worker(worker_id, num_blocks=num_blocks, block_size=4, max_len=max_len, max_num_seqs=max_num_seqs)
    return WorkerState.register(info, max_num_seqs=None, max_num_batched_tokens=None)


def test_has_room_needs_a_slot_blocks_for_the_first_chunk_and_no_fence() -> None:
    ws = state("w", num_blocks=8, max_num_seqs=1)
    req = request("r", prompt_len=12)  # its prompt: 3 blocks of 4 tokens
    assert has_room(ws, req)
    holder = hold_blocks(ws, 6)
    assert not has_room(ws, req)  # 2 free blocks, 3 needed
    ws.kv_cache_manager.free(holder)
    ws.running.append(request("other", prompt_len=1))
    assert not has_room(ws, req)  # its only slot is taken
    ws.running.clear()
    ws.fenced = True
    assert not has_room(ws, req)


def test_best_worker_has_the_most_free_blocks_and_the_asking_worker_wins_a_tie() -> None:
    a, b, c = state("a"), state("b"), state("c")
    hold_blocks(a, 8)
    hold_blocks(b, 2)
    hold_blocks(c, 2)
    req = request("r", prompt_len=4)
    assert best_worker([a, b, c], req, prefer=a, weight=0) is b  # 14 free, first of the tie b / c
    assert best_worker([a, b, c], req, prefer=c, weight=0) is c  # the tie goes to the worker asking
    b.fenced = c.fenced = True
    assert best_worker([a, b, c], req, prefer=b, weight=0) is a


def test_best_worker_skips_workers_that_could_never_hold_the_request() -> None:
    small, large = state("small", num_blocks=4), state("large", num_blocks=64)
    hold_blocks(large, 60)  # fewer free blocks than the small one
    req = request("r", prompt_len=40, max_tokens=8)  # 12 blocks at its longest
    assert best_worker([small, large], req, prefer=small, weight=0) is large
    assert hostable_elsewhere([small, large], req)
    assert not hostable_elsewhere([small], req)
    assert best_worker([small], req, prefer=small, weight=0) is None


def test_a_burst_is_split_by_each_workers_share_of_free_blocks() -> None:
    a, b = state("a", num_blocks=30), state("b", num_blocks=10)
    assert fair_share([a, b], a, num_waiting=8) == 6
    assert fair_share([a, b], b, num_waiting=8) == 2
    a.fenced = True  # a fenced worker's blocks are not on offer
    assert fair_share([a, b], b, num_waiting=8) == 8
    b.fenced = True
    assert fair_share([a, b], b, num_waiting=8) == 0


def test_a_full_batch_takes_no_share() -> None:
    a, b = state("a", max_num_seqs=1), state("b", max_num_seqs=1)
    a.running.append(request("busy", prompt_len=4))
    assert fair_share([a, b], b, num_waiting=4) == 4
    assert best_worker([a, b], request("r", prompt_len=4), prefer=a, weight=0) is b
