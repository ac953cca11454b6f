"""Suffix decoding's drafts: the longest match in the request itself or in recent requests."""

from __future__ import annotations

from batcher.core.request import Request
from batcher.core.scheduler import Scheduler, SchedulerConfig
from batcher.core.spec_decode.suffix_cache import SuffixCache
from common.protocol import ModelRunnerOutput, SamplingParams, WorkerInfo
from common.speculative_config import SpeculativeConfig


def test_a_match_in_the_request_itself() -> None:
    cache = SuffixCache(max_cached_requests=8, max_depth=24, spec_factor=1.0)
    # [1, 2, 3] matched at the start: three tokens matched, three drafted.
    assert cache.propose([1, 2, 3, 4, 5, 6, 1, 2, 3], k=8) == [4, 5, 6]
    assert cache.propose([1, 2, 3, 4, 5, 6, 1, 2, 3], k=2) == [4, 5]
    assert cache.propose([1, 2, 3, 4], k=8) == []


def test_a_match_in_a_recent_request_and_the_longest_wins() -> None:
    cache = SuffixCache(max_cached_requests=8, max_depth=24, spec_factor=1.0)
    cache.add([10, 11, 12, 13, 14, 15, 16])
    cache.add([7, 8, 11, 12, 20, 21, 22, 23])
    # (11, 12) ends a match in both; the first is 4 long ([9, 10, 11, 12]), the second 2.
    assert cache.propose([5, 9, 10, 11, 12], k=8) == [13, 14, 15]  # only 3 follow
    assert cache.propose([5, 6, 11, 12], k=8) == [20, 21]  # tie of 2: the latest; 2 x factor 1.0
    assert SuffixCache(8, 24, spec_factor=0.5).propose([1, 2, 3, 4, 5, 6, 1, 2, 3], k=8) == [4, 5]


def test_old_requests_are_forgotten() -> None:
    cache = SuffixCache(max_cached_requests=1, max_depth=24, spec_factor=1.0)
    cache.add([10, 11, 12, 13])
    cache.add([30, 31, 32, 33])
    assert len(cache) == 1
    assert cache.propose([5, 10, 11], k=4) == []
    assert cache.propose([5, 30, 31], k=4) == [32, 33]


def test_finished_requests_feed_the_next_ones_drafts() -> None:
    config = SpeculativeConfig(method="suffix")
    assert config.num_draft_tokens == 24  # vLLM's default: up to the tree depth
    s = Scheduler(SchedulerConfig(speculative=config))
    s.add_worker(
        WorkerInfo(worker_id="w", model="m", num_blocks=64, block_size=4, max_model_len=256, started_at=0.0)
    )
    params = SamplingParams(temperature=0.0, max_tokens=8)
    first = Request("a", [1, 2, 3, 4], params, 0.0, "0-0")
    s.add_request(first, now=0.0)
    step, _ = s.schedule("w")
    assert step is not None
    s.update_from_output(
        ModelRunnerOutput(
            step_id=step.step_id, worker_id="w", req_ids=["a"], sampled_token_ids=[5], finish_reasons=["stop"]
        )
    )
    assert s.suffix_cache is not None and len(s.suffix_cache) == 1
    second = Request("b", [9, 1, 2], params, 0.0, "0-0")
    s.add_request(second, now=0.0)
    step, _ = s.schedule("w")
    assert step is not None
    s.update_from_output(
        ModelRunnerOutput(
            step_id=step.step_id, worker_id="w", req_ids=["b"], sampled_token_ids=[3], finish_reasons=[None]
        )
    )
    step, _ = s.schedule("w")
    assert step is not None and step.scheduled_spec_decode_tokens == {"b": [4, 5]}  # after [1, 2, 3] in "a"
