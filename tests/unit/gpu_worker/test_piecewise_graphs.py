"""Piecewise graphs' padded pieces (gpu_worker/runner/graphs/piecewise.py) run eagerly on the CPU: a
step of prefill chunks and decodes padded to its token bucket gives the logits of the unpadded
forward, at a bucket's exact size and one past it, with adapters too, compiled too; through the
in-process engine, steps with drafts and chunks give transformers' greedy tokens. Their capture on
the fake CUDA device: tests/unit/gpu_worker/test_capture_rules.py; in a runner:
test_model_runner_triton.py."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import torch
from torch._dynamo.utils import counters

from batcher.core.scheduler import SchedulerConfig
from benchmarks.gpu.gpu_parity import reference_greedy
from cbserve.offline.engine import LLMEngine
from common.protocol import LoRARequest, SamplingParams, TokenEvent
from gpu_worker.runner.cached_request_state import CachedRequestState
from gpu_worker.runner.forward.decoder import Decoder
from gpu_worker.runner.graphs.piecewise import MAX_PIECEWISE_TOKENS, PiecewiseGraphs, token_buckets
from gpu_worker.runner.input_batch import InputBatch, ScheduledRequest, build_input_batch
from gpu_worker.runner.model_runner import ModelRunner
from gpu_worker.settings import WorkerSettings
from tests.unit.gpu_worker.spec_decode.test_spec_decode import NGRAM, PROMPTS
from tests.unit.gpu_worker.test_model_runner import make_runner

BLOCK_SIZE = 16  # test_model_runner's


@pytest.fixture(scope="module", autouse=True)
def _few_threads() -> None:
    torch.set_num_threads(1)


def test_buckets_double_from_16_up_to_the_budget_or_512() -> None:
    assert token_buckets(32) == [16, 32]
    assert token_buckets(40) == [16, 32, 40]
    assert token_buckets(8) == [8]
    assert token_buckets(8192) == [16, 32, 64, 128, 256, 512] and MAX_PIECEWISE_TOKENS == 512


def _request(i: int, context: int, num_tokens: int) -> ScheduledRequest:
    """Request `i` with `context` tokens computed before this step, which computes `num_tokens`
    more (a decode when 1 and its tokens are all known, else a prefill chunk)."""
    total = context + num_tokens
    blocks = -(-total // BLOCK_SIZE)
    state = CachedRequestState(
        req_id=f"r{i}",
        token_ids=[(7 * i + t) % 90 + 3 for t in range(total)],
        num_prompt_tokens=total,
        sampling_params=SamplingParams(temperature=0.0),
        block_ids=list(range(4 * i, 4 * i + blocks)),
        num_computed_tokens=context,
        attempt=0,
    )
    return ScheduledRequest(state, num_tokens)


def _batch(
    runner: ModelRunner, requests: list[ScheduledRequest], slots: Mapping[str, int] | None
) -> InputBatch:
    lora_slots = None if runner.lora is None else dict(slots or {})
    return build_input_batch(requests, runner.attn_backend, runner.device, lora_slots=lora_slots)


def _unpadded(runner: ModelRunner, batch: InputBatch) -> torch.Tensor:
    extra = {} if batch.lora_ids is None else {"lora_ids": batch.lora_ids}
    outputs = runner.model(
        input_ids=batch.input_ids,
        position_ids=batch.position_ids,
        logits_to_keep=batch.kept_indices,
        attn_metadata=batch.attn_metadata,
        **extra,
    )
    logits: torch.Tensor = outputs.logits[0]
    return logits


def _check_mixed_steps(
    runner: ModelRunner, slots: Mapping[str, int] | None = None, compile_backend: str | None = None
) -> PiecewiseGraphs:
    """Three decodes and a prefill chunk, 16 tokens (bucket 16) then 17 (bucket 32), after a step
    that filled their context: the padded pieces' logits are the unpadded forward's."""
    assert isinstance(runner.model, Decoder)
    graphs = PiecewiseGraphs(
        runner.model,
        runner.attn_backend,
        max_num_batched_tokens=32,
        device=runner.device,
        capture=None,
        compile_backend=compile_backend,
    )
    assert graphs.buckets == [16, 32]
    with torch.inference_mode():
        # The context of every request below, written into the pool by the unpadded forward.
        _unpadded(runner, _batch(runner, [_request(i, 0, n) for i, n in enumerate([9, 20, 5, 12])], slots))
        for chunk, bucket in [(13, 16), (14, 32)]:
            requests = [_request(0, 9, 1), _request(1, 20, 1), _request(2, 5, 1), _request(3, 12, chunk)]
            batch = _batch(runner, requests, slots)
            assert batch.input_ids.shape[1] == chunk + 3
            expected = _unpadded(runner, batch)
            runs = graphs.bucket_runs[bucket]
            # Attention never writes the padding rows: NaN there must stay in them.
            graphs.attn.fill_(float("nan"))
            logits = graphs.run(batch)
            assert graphs.bucket_runs[bucket] == runs + 1
            assert logits.shape == expected.shape == (4, runner.vocab_size)
            torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-5)
            assert torch.equal(logits.argmax(-1), expected.argmax(-1))
            assert graphs.hidden[batch.input_ids.shape[1] : bucket].isnan().all()
    return graphs


def test_padded_pieces_give_the_unpadded_logits(tiny_model_dir: Path) -> None:
    runner = make_runner(tiny_model_dir, compile=False)
    graphs = _check_mixed_steps(runner)
    assert graphs.num_runs == 2 and graphs.lora_ids is None


def test_compiled_pieces_give_the_same_logits(tiny_model_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Through torch.compile, AOTAutograd's eager backend here (inductor on this CPU takes ~45 s and
    passed it too, by hand): every piece compiles, none falls back, a graph per piece kind and shape."""
    runner = make_runner(tiny_model_dir, compile=False)
    torch._dynamo.reset()
    counters.clear()
    with caplog.at_level(logging.WARNING, logger="gpu_worker.runner.graphs.piecewise"):
        graphs = _check_mixed_steps(runner, compile_backend="aot_eager")
    assert not caplog.records
    assert len(graphs._compiled) == 3  # none fell back
    # first, layer and last pieces, at 16 rows, then once more with the row count dynamic.
    assert counters["stats"]["unique_graphs"] == 6, dict(counters["stats"])


def test_padded_pieces_with_adapters(tiny_model_dir: Path, lora_adapters: dict[str, Path]) -> None:
    runner = make_runner(
        tiny_model_dir, compile=False, enable_lora=True, max_loras=2, max_cpu_loras=2, max_lora_rank=16
    )
    assert runner.lora is not None
    adapters = [
        LoRARequest(lora_name=name, lora_path=str(lora_adapters[name])) for name in ("all-r16", "attn-r4")
    ]
    for adapter in adapters:
        assert runner.lora.add(adapter) is None
    slot_of = runner.lora.slots_for(adapters)
    # r1 and r3 (the chunk) on one adapter, r2 on the other, r0 on the base model.
    slots = {"r1": slot_of[adapters[0].cache_key], "r3": slot_of[adapters[0].cache_key]}
    slots["r2"] = slot_of[adapters[1].cache_key]
    graphs = _check_mixed_steps(runner, slots)
    assert graphs.lora_ids is not None


def test_steps_with_drafts_and_chunks_equal_generate(tiny_model_dir: Path) -> None:
    """The real scheduler and runner (triton backend, interpreted), n-gram drafts and chunked
    prefill: the steps decode graphs cannot take (drafts to verify, chunks) run padded through the
    pieces, and greedy tokens stay transformers' own."""
    prompts, max_tokens = PROMPTS[:3], [24, 20, 12]
    budget: dict[str, Any] = {"max_num_seqs": 8, "max_num_batched_tokens": 32}
    engine = LLMEngine.load(
        WorkerSettings(
            model=str(tiny_model_dir),
            num_blocks=64,
            block_size=8,
            worker_id="w",
            attention_backend="triton",
            cuda_graphs=True,
            piecewise_cuda_graphs=True,
            speculative_config=NGRAM,
            **budget,
        ),
        SchedulerConfig(**budget, speculative=NGRAM),
    )
    for i, (prompt, n) in enumerate(zip(prompts, max_tokens, strict=True)):
        engine.add_request(f"r{i}", prompt, SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True))
    outputs: dict[str, list[int]] = {f"r{i}": [] for i in range(len(prompts))}
    for _ in range(200):
        if not engine.has_unfinished_requests():
            break
        for event in engine.step().events:
            assert isinstance(event, TokenEvent)
            outputs[event.req_id].append(event.token_id)
    assert [outputs[f"r{i}"] for i in range(len(prompts))] == reference_greedy(
        tiny_model_dir, prompts, max_tokens
    )
    assert engine.stats.spec_decode_num_accepted_tokens > 0
    runner = engine.runner
    assert isinstance(runner, ModelRunner) and runner.piecewise_graphs is not None
    assert runner.piecewise_graphs.bucket_runs[16] > 0 and runner.piecewise_graphs.bucket_runs[32] > 0
