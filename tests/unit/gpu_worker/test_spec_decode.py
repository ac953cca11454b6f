"""Speculative decoding through the real scheduler and the real ModelRunner (no Redis): greedy
tokens with n-gram drafts equal transformers' `generate` and the same run without drafts, with
chunked prefill, prefix hits and stops inside an accepted run."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from batcher.request import Request
from batcher.scheduler import Scheduler, SchedulerConfig, SchedulerStats
from benchmarks.gpu_parity import reference_greedy
from common.protocol import SamplingParams, TokenEvent
from common.speculative_config import SpeculativeConfig
from gpu_worker.model_runner import ModelRunner
from gpu_worker.settings import WorkerSettings
from gpu_worker.spec_decode import verify_greedy

NGRAM = SpeculativeConfig(method="ngram", num_speculative_tokens=4, prompt_lookup_min=1, prompt_lookup_max=3)
PATTERN = [17, 301, 52, 99, 260, 8, 411]
# Repetitive prompts (drafts find matches), two sharing a 3-block prefix (a prefix hit), one long
# enough to be chunked by the 32-token budget, and one with nothing repeated.
PROMPTS = [
    PATTERN * 6,
    PATTERN * 6 + [5, 6],
    [3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14],
    [*PATTERN[::-1], 77] * 7,
]
MAX_TOKENS = [40, 33, 25, 37]


@pytest.fixture(scope="module", autouse=True)
def _few_threads() -> None:
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def expected(tiny_model_dir: Path) -> list[list[int]]:
    return reference_greedy(tiny_model_dir, PROMPTS, MAX_TOKENS)


def run_pipeline(
    model_dir: Path, speculative: SpeculativeConfig | None, params: list[SamplingParams]
) -> tuple[list[list[int]], SchedulerStats]:
    """Every prompt to completion; returns each output as its token events tell it, and the stats."""
    runner = ModelRunner(
        WorkerSettings(model=str(model_dir), num_blocks=64, block_size=8, worker_id="w", seed=0)
    )
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=32, max_num_seqs=8, speculative=speculative))
    sched.add_worker(runner.worker_info())
    for i, (prompt, p) in enumerate(zip(PROMPTS, params, strict=True)):
        req = Request(f"r{i}", prompt, p, arrival_time=0.0, entry_id="0-0")
        sched.add_request(req, now=0.0)
    events: dict[str, list[int]] = {f"r{i}": [] for i in range(len(PROMPTS))}
    for _ in range(500):
        if not sched.requests:
            break
        step, failed = sched.schedule("w")
        assert step is not None and not failed
        result = runner.execute_model(step)
        assert not result.req_errors, result.req_errors
        for event in runner.token_events(result):
            assert isinstance(event, TokenEvent)
            assert event.index == len(events[event.req_id]), "token indexes must stay contiguous"
            events[event.req_id].append(event.token_id)
        sched.update_from_output(result)
    assert not sched.requests
    return [events[f"r{i}"] for i in range(len(PROMPTS))], sched.stats


def greedy(max_tokens: int, **extra: object) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, **extra)  # type: ignore[arg-type]


def test_greedy_with_drafts_equals_generate(tiny_model_dir: Path, expected: list[list[int]]) -> None:
    params = [greedy(m) for m in MAX_TOKENS]
    with_drafts, stats = run_pipeline(tiny_model_dir, NGRAM, params)
    assert with_drafts == expected
    assert stats.spec_decode_num_accepted_tokens > 0, "the repetitive prompts must get drafts accepted"
    assert stats.num_partial_prefills > 0  # chunked prefill took part
    # Fewer steps than tokens: accepted drafts saved forward passes.
    without, plain_stats = run_pipeline(tiny_model_dir, None, params)
    assert without == expected
    assert stats.num_steps < plain_stats.num_steps


def test_stop_token_inside_an_accepted_run_ends_there(
    tiny_model_dir: Path, expected: list[list[int]]
) -> None:
    # Stop at the 6th token of each greedy output: with drafts it often sits inside a run.
    stops = [out[5] for out in expected]
    params = [greedy(m, stop_token_ids=[s]) for m, s in zip(MAX_TOKENS, stops, strict=True)]
    outputs, _ = run_pipeline(tiny_model_dir, NGRAM, params)
    for out, full, stop in zip(outputs, expected, stops, strict=True):
        assert out == full[: full.index(stop) + 1]


def test_verify_greedy_accepts_the_matching_prefix_then_the_model_token() -> None:
    vocab = 10
    # Two requests: drafts [3, 4, 5] (model says 3, 4, 7) and [2] (model says 2).
    targets = [3, 4, 7, 2]
    logits = torch.nn.functional.one_hot(torch.tensor(targets), vocab).float()
    runs = verify_greedy(logits, [[3, 4, 5], [2]], [9, 6])
    assert runs == [[3, 4, 7], [2, 6]]  # a mismatch is replaced; a run accepted whole gets the bonus
    assert verify_greedy(logits[:1], [[8]], [1]) == [[3]]
