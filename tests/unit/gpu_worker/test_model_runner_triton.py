"""ModelRunner with the triton attention backend (under Triton's interpreter on the CPU): greedy
tokens equal transformers' generate through prefill, chunked prefill, decode and preemption, also
with decode steps padded into the static buffers that CUDA graphs replay, and the other steps padded to
a token bucket of the piecewise graphs' buffers (attention between the pieces, on the real rows)."""

from __future__ import annotations

from pathlib import Path

import pytest

from common.protocol import SamplingParams
from gpu_worker.runner.attention.triton_attn import TritonAttentionBackend
from tests.unit.gpu_worker.test_model_runner import (
    generate_alone,
    make_requests,
    make_runner,
    run_to_completion,
)


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graph-buffers"])
def test_triton_backend_greedy_equals_transformers_generate(tiny_model_dir: Path, graphs: bool) -> None:
    runner = make_runner(
        tiny_model_dir,
        worker_id="triton",
        attention_backend="triton",
        cuda_graphs=graphs,
        piecewise_cuda_graphs=graphs,
        # Graph sizes 1, 2, 4, 6: three or five decodes run padded, with rows that do nothing;
        # token buckets 16 and 32: every other step runs padded to one.
        max_num_seqs=6,
        max_num_batched_tokens=32,
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
        assert req.outputs == generate_alone(tiny_model_dir, req.prompt, req.params.max_tokens), req.req_id
    replays = 0 if runner.decode_graphs is None else runner.decode_graphs.num_replays
    assert (replays > 0) == graphs
    piecewise = runner.piecewise_graphs
    assert (piecewise is not None) == graphs
    if piecewise is not None:
        assert piecewise.buckets == [16, 32]
        assert all(n > 0 for n in piecewise.bucket_runs.values()), piecewise.bucket_runs
