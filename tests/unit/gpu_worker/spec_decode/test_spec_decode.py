"""Speculative decoding through the in-process engine (`LLMEngine`: the real scheduler and the real
ModelRunner, no Redis): greedy tokens with n-gram drafts equal transformers' `generate` and the same
run without drafts, with chunked prefill, prefix hits and stops inside an accepted run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from batcher.core.scheduler import SchedulerConfig, SchedulerStats
from benchmarks.gpu.gpu_parity import reference_greedy
from cbserve.offline.engine import LLMEngine
from common.protocol import SamplingParams, StructuredOutput, TokenEvent
from common.spec_decode.speculative_config import SpeculativeConfig
from gpu_worker.runner.sample.sampler import Sampler
from gpu_worker.runner.sample.sampling_state import SamplingState
from gpu_worker.runner.spec_decode.verify import accept_drafts
from gpu_worker.settings import WorkerSettings
from harness.models.tiny_model import build_tiny_model

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
    model_dir: Path,
    speculative: SpeculativeConfig | None,
    params: list[SamplingParams],
    prompts: list[list[int]] = PROMPTS,
    events_out: list[TokenEvent] | None = None,
    async_scheduling: bool = False,
    **settings: Any,
) -> tuple[list[list[int]], SchedulerStats]:
    """Every prompt to completion; returns each output as its token events tell it, and the stats.
    `events_out` collects the events; `settings`: the worker's, over this file's small pool."""
    defaults: dict[str, Any] = {"model": str(model_dir), "num_blocks": 64, "block_size": 8, "worker_id": "w"}
    # The worker's step bounds are the scheduler's: its start-up profiling step is then no larger
    # than the steps it runs (at the cpu defaults, 64 x 512, Triton's interpreter takes ~20 s on it).
    budget = {"max_num_seqs": 8, "max_num_batched_tokens": 32}
    worker = {"seed": 0, "speculative_config": speculative}  # a draft model is loaded by the worker
    engine = LLMEngine.load(
        WorkerSettings(**(defaults | budget | worker | settings)),
        SchedulerConfig(**budget, speculative=speculative, async_scheduling=async_scheduling),
    )
    for i, (prompt, p) in enumerate(zip(prompts, params, strict=True)):
        engine.add_request(f"r{i}", prompt, p)
    events: dict[str, list[int]] = {f"r{i}": [] for i in range(len(prompts))}
    for _ in range(500):
        if not engine.has_unfinished_requests():
            break
        step = engine.step()
        assert step.ran
        failed = [(req.req_id, req.error) for req in step.finished if req.finish_reason == "error"]
        assert not failed, failed
        for event in step.events:
            assert isinstance(event, TokenEvent)
            assert event.index == len(events[event.req_id]), "token indexes must stay contiguous"
            events[event.req_id].append(event.token_id)
            if events_out is not None:
                events_out.append(event)
    assert not engine.has_unfinished_requests()
    return [events[f"r{i}"] for i in range(len(prompts))], engine.stats


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


def test_drafts_between_steps_left_on_the_device_equal_generate(
    tiny_model_dir: Path, expected: list[list[int]]
) -> None:
    # Async scheduling: steps without drafts stay on the device while the next is launched; a step
    # with drafts reads its samples at once, after the steps before it (ModelRunner.launch).
    params = [greedy(m) for m in MAX_TOKENS]
    outputs, stats = run_pipeline(tiny_model_dir, NGRAM, params, async_scheduling=True)
    assert outputs == expected
    assert stats.spec_decode_num_accepted_tokens > 0 and stats.num_steps_overlapped > 0


def test_triton_backend_verifies_drafts_too(tiny_model_dir: Path, expected: list[list[int]]) -> None:
    # Drafting requests are query runs over cached context: the prefill kernel's case, interpreted.
    params = [greedy(12), greedy(12)]
    outputs, stats = run_pipeline(tiny_model_dir, NGRAM, params, PROMPTS[:2], attention_backend="triton")
    assert outputs == [out[:12] for out in expected[:2]]
    assert stats.spec_decode_num_accepted_tokens > 0


def test_stop_token_inside_an_accepted_run_ends_there(
    tiny_model_dir: Path, expected: list[list[int]]
) -> None:
    # Stop at the 6th token of each greedy output: with drafts it often sits inside a run.
    stops = [out[5] for out in expected]
    params = [greedy(m, stop_token_ids=[s]) for m, s in zip(MAX_TOKENS, stops, strict=True)]
    outputs, _ = run_pipeline(tiny_model_dir, NGRAM, params)
    for out, full, stop in zip(outputs, expected, stops, strict=True):
        assert out == full[: full.index(stop) + 1]


def test_drafts_are_accepted_while_they_equal_the_samples() -> None:
    # Two requests: drafts [3, 4, 5] (model samples 3, 4, 7) and [2] (model samples 2).
    runs = accept_drafts([[3, 4, 5], [2]], [3, 4, 7, 2], [9, 6])
    assert runs == [[3, 4, 7], [2, 6]]  # a mismatch is replaced; a run accepted whole gets the bonus
    assert accept_drafts([[8]], [3], [1]) == [[3]]


def test_seeded_sampling_with_drafts_equals_sampling_without(tiny_model_dir: Path) -> None:
    # Each position is drawn with the uniform of (seed, output index) either way: the same tokens.
    params = [
        SamplingParams(temperature=t, top_k=k, seed=s, max_tokens=m, ignore_eos=True)
        for t, k, s, m in zip([0.6, 1.0, 0.3, 0.8], [0, 50, 0, 0], [1, 2, 3, 4], MAX_TOKENS, strict=True)
    ]
    with_drafts, stats = run_pipeline(tiny_model_dir, NGRAM, params)
    without, _ = run_pipeline(tiny_model_dir, None, params)
    assert with_drafts == without
    assert stats.spec_decode_num_accepted_tokens > 0


def test_a_draft_is_accepted_with_its_probability_else_another_token_is_drawn() -> None:
    # Rejection sampling for a point-mass draft: the first token of the run is distributed as p,
    # whatever the draft, over many unseeded draws.
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    num_draws = 20000
    state = SamplingState(vocab_size=4, device=torch.device("cpu"))
    req_ids = [f"r{i}" for i in range(num_draws)]
    for req_id in req_ids:
        state.add(req_id, SamplingParams(temperature=1.0), [1], [])
    logits = probs.log().expand(num_draws, 4).contiguous()
    for draft in (0, 3):
        samples = Sampler(seed=draft).sample_drafts(logits, state, req_ids, [[]] * num_draws).token_ids
        firsts = [run[0] for run in accept_drafts([[draft]] * num_draws, samples, [0] * num_draws)]
        freq = torch.bincount(torch.tensor(firsts), minlength=4).float() / num_draws
        # Four standard deviations of a frequency estimated from 20000 draws (at most 0.0035).
        assert torch.allclose(freq, probs, atol=0.015), (draft, freq)


def draft_model_config(model_dir: Path) -> SpeculativeConfig:
    return SpeculativeConfig(method="draft_model", model=str(model_dir), num_speculative_tokens=3)


def test_a_draft_model_that_is_the_target_gets_its_drafts_accepted(
    tiny_model_dir: Path, expected: list[list[int]]
) -> None:
    params = [greedy(m) for m in MAX_TOKENS]
    outputs, stats = run_pipeline(tiny_model_dir, draft_model_config(tiny_model_dir), params)
    assert outputs == expected
    # The target drafting for itself: nearly every draft is its own next token (the paged forward
    # and transformers' may round a near-tie apart).
    assert stats.spec_decode_num_accepted_tokens >= 0.8 * stats.spec_decode_num_draft_tokens > 0
    _, plain_stats = run_pipeline(tiny_model_dir, None, params)
    assert stats.num_steps < plain_stats.num_steps


def test_another_draft_model_changes_no_output(
    tmp_path: Path, tiny_model_dir: Path, expected: list[list[int]]
) -> None:
    # Another random model on the same tokenizer: drafts mostly wrong, outputs exactly the same,
    # greedy and seeded.
    other = build_tiny_model(tmp_path / "draft", seed=1)
    greedy_params = [greedy(m) for m in MAX_TOKENS]
    outputs, stats = run_pipeline(tiny_model_dir, draft_model_config(other), greedy_params)
    assert outputs == expected
    assert stats.spec_decode_num_draft_tokens > 0
    seeded = [
        SamplingParams(temperature=0.8, seed=s, max_tokens=m, ignore_eos=True)
        for s, m in enumerate(MAX_TOKENS)
    ]
    with_drafts, _ = run_pipeline(tiny_model_dir, draft_model_config(other), seeded)
    without, _ = run_pipeline(tiny_model_dir, None, seeded)
    assert with_drafts == without


def test_drafts_under_bias_min_tokens_and_a_grammar_change_no_output(
    tiny_model_dir: Path, expected: list[list[int]]
) -> None:
    # Each draft row is processed as plain decoding processes that position: the bias, min_tokens at
    # its output index (a stop id that greedy decoding would pick early is held back), and the
    # grammar after the drafts before it (the prompts' ids are drafted and the regex refuses most).
    letters = StructuredOutput(kind="regex", definition="[a-z ]{20,60}")
    params = [
        greedy(MAX_TOKENS[0], logit_bias={expected[0][3]: 2.5, expected[0][9]: -3.0}),
        greedy(MAX_TOKENS[1], stop_token_ids=[expected[1][2]], min_tokens=12),
        greedy(MAX_TOKENS[2], structured_output=letters),
        SamplingParams(temperature=0.7, seed=5, max_tokens=MAX_TOKENS[3], structured_output=letters),
    ]
    with_drafts, stats = run_pipeline(tiny_model_dir, NGRAM, params)
    without, _ = run_pipeline(tiny_model_dir, None, params)
    assert with_drafts == without
    assert stats.spec_decode_num_accepted_tokens > 0
    assert with_drafts[0] != expected[0]  # the bias changed the output
    assert len(with_drafts[1]) > 12 and expected[1][2] in with_drafts[1]


def test_drafts_under_penalties_change_no_output(tiny_model_dir: Path, expected: list[list[int]]) -> None:
    # A draft's row is penalised with the drafts before it counted as output, the row after all of
    # them with all, and the state counts the run that was kept (not the row's own sample). Light
    # penalties, so that the outputs still repeat enough to accept drafts.
    params = [
        greedy(MAX_TOKENS[0], repetition_penalty=1.05),
        greedy(MAX_TOKENS[1], frequency_penalty=0.05),
        greedy(MAX_TOKENS[2], presence_penalty=0.05, frequency_penalty=0.02),
        SamplingParams(
            temperature=0.8, seed=7, max_tokens=MAX_TOKENS[3], presence_penalty=0.05, ignore_eos=True
        ),
    ]
    with_drafts, stats = run_pipeline(tiny_model_dir, NGRAM, params)
    without, _ = run_pipeline(tiny_model_dir, None, params)
    assert with_drafts == without
    assert stats.spec_decode_num_accepted_tokens > 0
    assert all(out != plain for out, plain in zip(with_drafts[:3], expected[:3], strict=True))


def test_logprobs_of_drafted_runs_are_those_of_plain_decoding(tiny_model_dir: Path) -> None:
    # Each token of a run gets the logprobs of the row it was sampled at: an accepted draft's and a
    # replacing sample's from its draft's row, the bonus token's from the row after the drafts.
    params = [greedy(m, logprobs=3) for m in MAX_TOKENS[:3]]
    params.append(
        SamplingParams(temperature=0.9, seed=3, max_tokens=MAX_TOKENS[3], logprobs=0, ignore_eos=True)
    )
    with_drafts: list[TokenEvent] = []
    outputs, stats = run_pipeline(tiny_model_dir, NGRAM, params, events_out=with_drafts)
    without: list[TokenEvent] = []
    assert outputs == run_pipeline(tiny_model_dir, None, params, events_out=without)[0]
    assert stats.spec_decode_num_accepted_tokens > 0
    assert len(with_drafts) == len(without) == sum(len(out) for out in outputs)
    key = lambda e: (e.req_id, e.index)  # noqa: E731
    for drafted, plain in zip(sorted(with_drafts, key=key), sorted(without, key=key), strict=True):
        assert (drafted.token_id, drafted.top_token_ids) == (plain.token_id, plain.top_token_ids)
        assert drafted.logprob is not None and plain.logprob is not None
        assert abs(drafted.logprob - plain.logprob) < 1e-4
        assert drafted.top_logprobs == pytest.approx(plain.top_logprobs, abs=1e-4)
