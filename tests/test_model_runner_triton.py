"""ModelRunner with the triton attention backend (under Triton's interpreter on the CPU): greedy
tokens equal transformers' generate through prefill, chunked prefill, decode and preemption."""

from __future__ import annotations

from pathlib import Path

from common.protocol import SamplingParams
from gpu_worker.attention_triton import TritonAttentionBackend
from gpu_worker.model_runner import ModelRunner
from gpu_worker.settings import WorkerSettings
from tests.test_model_runner import (
    BLOCK_SIZE,
    NUM_BLOCKS,
    make_requests,
    reference_greedy,
    run_to_completion,
)


def test_triton_backend_greedy_equals_transformers_generate(tiny_model_dir: Path) -> None:
    runner = ModelRunner(
        WorkerSettings(
            model=str(tiny_model_dir),
            num_blocks=NUM_BLOCKS,
            block_size=BLOCK_SIZE,
            worker_id="triton",
            attention_backend="triton",
        )
    )
    assert isinstance(runner.attn_backend, TritonAttentionBackend)
    max_tokens = [6, 3, 5, 4, 3]  # the first five requests of test_model_runner's mix
    params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in max_tokens]
    requests = make_requests(params)
    # r3's 40-token prompt takes two chunks at a 24-token budget (the second over cached context);
    # r0 is preempted mid-decode and recomputed.
    run_to_completion(runner, requests, preempt={4: "r0"})
    assert requests[0].attempt == 1
    for req in requests:
        assert req.outputs == reference_greedy(tiny_model_dir, req.prompt, req.params.max_tokens), req.req_id
