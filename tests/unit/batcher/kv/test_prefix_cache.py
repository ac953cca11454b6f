"""Prefix caching in the scheduler (batcher/core/kv/, placement.py): what a request reuses, what a
worker computes, and where a request goes. Hand-built steps, no Redis, no model."""

from __future__ import annotations

from batcher.core.request import Request
from batcher.core.scheduler import Scheduler, SchedulerConfig
from common.protocol import ModelRunnerOutput
from tests.unit.batcher.kv.test_kv_cache_manager import hold_blocks
from tests.unit.batcher.test_scheduler import complete, request, step, worker

PREFIX = list(range(1000, 1016))  # 4 blocks of 4 tokens


def shared(req_id: str, suffix: list[int], max_tokens: int = 4) -> Request:
    return request(req_id, 0, max_tokens=max_tokens, prompt=PREFIX + suffix)


def make(num_blocks: int = 64, caching: bool = True, weight: float = 1.0, workers: int = 1) -> Scheduler:
    cfg = SchedulerConfig(enable_prefix_caching=caching, cache_overlap_weight=weight)
    s = Scheduler(cfg)
    for i in range(workers):
        s.add_worker(worker(f"w{i}", num_blocks=num_blocks, block_size=4))
    return s


def finish_all(s: Scheduler, worker_id: str = "w0") -> None:
    max_model_len = s.workers[worker_id].info.max_model_len
    while s.requests:
        step(s, worker_id, finish=lambda r: "length" if r.is_finishing(max_model_len) else None)


def test_a_shared_prefix_is_computed_once_and_only_the_rest_is_scheduled() -> None:
    s = make()
    s.add_request(shared("a", [1, 2, 3]), now=0.0)
    first = step(s)
    assert first.scheduled_new_reqs[0].num_computed_tokens == 0
    s.add_request(shared("b", [7, 8, 9, 10, 11]), now=0.0)
    out = step(s)
    [new] = out.scheduled_new_reqs
    a, b = first.scheduled_new_reqs[0], new
    assert new.num_computed_tokens == 16 and out.num_scheduled_tokens["b"] == 5
    assert b.block_ids[:4] == a.block_ids[:4]  # the same blocks, read in place
    assert s.workers["w0"].prefix_cache_queries == 19 + 21
    assert s.workers["w0"].prefix_cache_hits == 16


def test_only_whole_blocks_are_reused_and_one_token_is_always_left_to_compute() -> None:
    s = make()
    s.add_request(request("a", 0, prompt=PREFIX), now=0.0)
    step(s)
    # The same 16 tokens: all 4 blocks are cached, but the last token must be computed for its
    # logits, and new KV never goes into a shared block, so the whole last block is computed again.
    s.add_request(request("b", 0, prompt=PREFIX), now=0.0)
    out = step(s)
    [new] = out.scheduled_new_reqs
    assert new.num_computed_tokens == 12 and out.num_scheduled_tokens["b"] == 4
    # A prefix that ends inside a block reuses only the blocks before it.
    s.add_request(request("c", 0, prompt=[*PREFIX[:14], 5, 6]), now=0.0)
    out = step(s)
    [new] = out.scheduled_new_reqs
    assert new.num_computed_tokens == 12


def test_requests_admitted_in_the_same_step_share_the_prefix_computed_in_it() -> None:
    # `n` choices of one prompt arrive together: the prompt is computed once.
    s = make()
    for i in range(3):
        s.add_request(request(f"c{i}", 0, prompt=[*PREFIX, 1]), now=0.0)
    out = step(s)
    computed = [new.num_computed_tokens for new in out.scheduled_new_reqs]
    assert computed == [0, 16, 16]
    assert out.total_num_scheduled_tokens == 17 + 1 + 1
    tables = [new.block_ids[:4] for new in out.scheduled_new_reqs]
    assert tables[0] == tables[1] == tables[2]
    assert s.workers["w0"].kv_cache_manager.num_free_blocks == 64 - 4 - 3


def test_generated_tokens_are_cached_for_the_next_turn() -> None:
    s = make()
    s.add_request(request("turn1", 0, max_tokens=8, prompt=PREFIX[:6]), now=0.0)
    finish_all(s)
    # The next turn resends the history: prompt + the 8 tokens generated (100..107) + more.
    history = PREFIX[:6] + list(range(100, 108))
    s.add_request(request("turn2", 0, prompt=[*history, 42, 43]), now=0.0)
    out = step(s)
    # 13 of the 14 history tokens had their KV computed (the last sampled one never is): 3 blocks.
    assert out.scheduled_new_reqs[0].num_computed_tokens == 12


def test_a_finished_prefix_stays_cached_until_its_blocks_are_needed() -> None:
    s = make(num_blocks=8)
    s.add_request(shared("a", [1]), now=0.0)
    finish_all(s)
    bm = s.workers["w0"].kv_cache_manager
    assert bm.num_free_blocks == 8 and bm.num_evictable_blocks == 5
    # A request with other tokens needs 6 of the 8 blocks: cached ones are evicted, tail first.
    s.add_request(request("big", 24, max_tokens=1), now=0.0)
    finish_all(s)
    s.add_request(shared("b", [1]), now=0.0)
    out = step(s)
    # "a" cached 5 blocks; "big" took the 3 never-used blocks and evicted a's last 3: 2 are left.
    assert out.scheduled_new_reqs[0].num_computed_tokens == 8


def test_caching_off_computes_every_prompt_in_full() -> None:
    s = make(caching=False)
    s.add_request(shared("a", [1]), now=0.0)
    step(s)
    s.add_request(shared("b", [2]), now=0.0)
    out = step(s)
    assert out.scheduled_new_reqs[0].num_computed_tokens == 0
    assert s.workers["w0"].kv_cache_manager.num_cached_blocks == 0


def test_blocks_of_a_request_that_failed_alone_are_not_found_again() -> None:
    s = make()
    s.add_request(shared("a", [1]), now=0.0)
    out, _ = s.schedule("w0")
    assert out is not None
    # The worker dropped it (before or after writing its KV: the batcher cannot tell).
    s.update_from_output(
        ModelRunnerOutput(
            step_id=out.step_id,
            worker_id="w0",
            req_ids=[],
            sampled_token_ids=[],
            finish_reasons=[],
            req_errors={"a": "bad input"},
        )
    )
    assert s.workers["w0"].kv_cache_manager.num_cached_blocks == 0
    retry = step(s)
    assert retry.scheduled_new_reqs[0].num_computed_tokens == 0


def test_a_worker_that_leaves_takes_its_cache_with_it() -> None:
    s = make(workers=2)
    s.add_request(shared("a", [1]), now=0.0)
    out, _ = s.schedule("w0")
    assert out is not None and out.scheduled_new_reqs
    s.fence_worker("w0")
    assert len(s.remove_worker("w0")) == 1
    out = step(s, "w1")
    assert out.scheduled_new_reqs[0].req_id == "a"
    assert out.scheduled_new_reqs[0].num_computed_tokens == 0


def test_a_worker_rejoining_under_its_id_starts_with_an_empty_cache() -> None:
    s = make()
    s.add_request(shared("a", [1]), now=0.0)
    finish_all(s)
    assert s.workers["w0"].kv_cache_manager.num_cached_blocks
    restarted = worker("w0", num_blocks=64, block_size=4)
    restarted.started_at = 1.0
    s.add_worker(restarted)
    assert s.workers["w0"].kv_cache_manager.num_cached_blocks == 0


def test_cache_aware_placement_sends_a_request_where_its_prefix_is() -> None:
    s = make(workers=2)
    s.add_request(shared("a", [1]), now=0.0)
    step(s, "w0")
    assert s.requests["a"].worker_id == "w0"
    # w1 is idle and has more free blocks, but w0 holds the 4-block prefix: w1 leaves it to w0.
    s.add_request(shared("b", [2]), now=0.0)
    out, _ = s.schedule("w1")
    assert out is None
    out = step(s, "w0")
    assert out.scheduled_new_reqs[0].req_id == "b"
    assert out.scheduled_new_reqs[0].num_computed_tokens == 16


def test_load_only_placement_ignores_the_cache() -> None:
    s = make(workers=2, weight=0.0)
    s.add_request(shared("a", [1]), now=0.0)
    step(s, "w0")
    s.add_request(shared("b", [2]), now=0.0)
    out = step(s, "w1")  # the most free blocks
    assert out.scheduled_new_reqs[0].req_id == "b"
    assert out.scheduled_new_reqs[0].num_computed_tokens == 0


def test_load_outweighs_a_short_cached_prefix() -> None:
    s = make(workers=2)
    s.add_request(shared("a", [1], max_tokens=64), now=0.0)
    step(s, "w0")
    # w0 holds 1 cached block of b's prompt but is loaded with other requests' blocks.
    hold_blocks(s.workers["w0"], 20)
    s.add_request(request("b", 0, prompt=PREFIX[:4] + [9] * 12), now=0.0)
    out = step(s, "w1")
    assert out.scheduled_new_reqs[0].req_id == "b"


def test_tgi_policy_reuses_cached_prefixes_too() -> None:
    s = Scheduler(SchedulerConfig(scheduling_policy="tgi"))
    s.add_worker(worker("w0", num_blocks=64, block_size=4))
    s.add_request(shared("a", [1]), now=0.0)
    s.add_request(shared("b", [2]), now=0.0)
    out = step(s)
    assert [new.num_computed_tokens for new in out.scheduled_new_reqs] == [0, 16]
    complete(s, out)
