"""The CPU attention kernels (gpu_worker/kernels/cpu/): reading the pool through the block tables
gives what gathering the K/V and running SDPA gives, on the same pool and step, for decodes and for
chunks of a few queries (drafts to verify), whether the pool is float32 or stored narrower
(WORKER_KV_CACHE_DTYPE) for float32 queries; and the C++ op that does a layer's whole step computes
what the Python backend computes, or hands the layer to it."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from gpu_worker.kernels import cpu as cpu_kernels
from gpu_worker.runner.attention.backend import AttentionContext
from gpu_worker.runner.attention.torch_attn import KERNEL_MAX_QUERIES, TorchAttentionBackend
from gpu_worker.runner.attention.variant import AttentionVariant
from gpu_worker.runner.forward.attention_op import native_attention, step_context
from gpu_worker.runner.input_batch import ScheduledRequest, build_input_batch
from harness.gpu_worker.paged_steps import pool, scheduled_request

BS = 16


HEAD_DIM = 32


@dataclass
class RandomStep:
    backend: TorchAttentionBackend
    context: AttentionContext
    query: torch.Tensor  # [T, heads, HEAD_DIM]
    key: torch.Tensor  # [T, 2, HEAD_DIM]
    value: torch.Tensor


def _random_step(
    requests: list[ScheduledRequest], queries_per_kv: int, pool_dtype: torch.dtype
) -> RandomStep:
    """One layer's random pool (two KV heads) and step for float32 queries."""
    num_kv_heads = 2
    kv_cache = pool(512, BS, num_kv_heads, HEAD_DIM, pool_dtype)
    fill = torch.Generator().manual_seed(3)
    for p in (*kv_cache.k_pools, *kv_cache.v_pools):
        p.copy_(torch.randn(p.shape, generator=fill))
    backend = TorchAttentionBackend(kv_cache, group_decodes=True, dtype=torch.float32)
    assert backend.decode_kernel  # float32 queries on the CPU, with the host's compiler
    context = build_input_batch(requests, backend, torch.device("cpu")).attn_metadata
    rand = torch.Generator().manual_seed(5)
    tokens = context.common.num_actual_tokens
    query = torch.randn(tokens, num_kv_heads * queries_per_kv, HEAD_DIM, generator=rand)
    key = torch.randn(tokens, num_kv_heads, HEAD_DIM, generator=rand)
    value = torch.randn(tokens, num_kv_heads, HEAD_DIM, generator=rand)
    return RandomStep(backend, context, query, key, value)


def _kernel_against_gather(
    requests: list[ScheduledRequest],
    queries_per_kv: int,
    variant: AttentionVariant | None = None,
    pool_dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The backend's output with the kernel and with it turned off, over one random pool and step."""
    step = _random_step(requests, queries_per_kv, pool_dtype)
    backend, common = step.backend, step.context.common
    query, key, value, head_dim = step.query, step.key, step.value, HEAD_DIM
    outs = []
    for kernel in (True, False):
        backend.decode_kernel = kernel
        args = (0, query, key, value, backend.build_metadata(common), head_dim**-0.5)
        outs.append(backend.forward(*args) if variant is None else backend.forward(*args, variant=variant))
    return outs[0], outs[1]


@pytest.mark.parametrize("queries_per_kv", [1, 4])
@pytest.mark.parametrize("threads", [1, 4])  # 4: fewer sequences than threads split their heads
@pytest.mark.parametrize("pool_dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_decodes_read_in_place_equal_gathered_decodes(
    queries_per_kv: int, threads: int, pool_dtype: torch.dtype
) -> None:
    scattered = torch.randperm(300, generator=torch.Generator().manual_seed(1)).tolist()
    requests = [
        scheduled_request(0, scattered[:20], 19 * BS + 7, 1),  # tables of every length, blocks anywhere
        scheduled_request(1, scattered[20:23], 2 * BS + 15, 1),
        scheduled_request(2, scattered[23:24], 0, 1),  # its first token: one key, its own
        scheduled_request(3, scattered[24:30], 6 * BS - 1, 1),  # the last slot of its last block
        scheduled_request(4, scattered[30:40], 3 * BS, 40),  # a prefill chunk in the same step
    ]
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        out, expected = _kernel_against_gather(requests, queries_per_kv, pool_dtype=pool_dtype)
    finally:
        torch.set_num_threads(before)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("threads", [1, 4])
@pytest.mark.parametrize("pool_dtype", [torch.float32, torch.bfloat16])
def test_chunks_of_a_few_queries_read_in_place_equal_gathered_chunks(
    threads: int, pool_dtype: torch.dtype
) -> None:
    scattered = torch.randperm(300, generator=torch.Generator().manual_seed(2)).tolist()
    requests = [
        scheduled_request(0, scattered[:3], 2 * BS + 5, 1),  # a decode beside them
        scheduled_request(1, scattered[3:24], 19 * BS + 14, 5),  # its queries cross into a new block
        scheduled_request(2, scattered[24:27], 2 * BS, 2),  # the first two of a block
        scheduled_request(3, scattered[27:28], 0, KERNEL_MAX_QUERIES),  # a first chunk: its own K/V
        scheduled_request(4, scattered[28:41], 12 * BS - 3, KERNEL_MAX_QUERIES),
        scheduled_request(5, scattered[41:46], 4 * BS, KERNEL_MAX_QUERIES + 1),  # gathered either way
    ]
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        out, expected = _kernel_against_gather(requests, 4, pool_dtype=pool_dtype)
    finally:
        torch.set_num_threads(before)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_a_model_in_bfloat16_keeps_the_gathering_path() -> None:
    kv_cache = pool(8, BS, 2, 32, torch.bfloat16)
    assert not TorchAttentionBackend(kv_cache, group_decodes=True).decode_kernel  # its queries: bfloat16
    assert TorchAttentionBackend(kv_cache, group_decodes=True, dtype=torch.float32).decode_kernel


def test_a_windowed_layer_keeps_the_gathering_path() -> None:
    requests = [scheduled_request(0, list(range(10)), 9 * BS + 3, 1)]
    out, expected = _kernel_against_gather(requests, 2, AttentionVariant(window=20))
    assert torch.equal(out, expected)  # the kernel has no window: both ran the same code


def test_the_kernel_refuses_what_it_cannot_read() -> None:
    assert cpu_kernels.load()
    q = torch.zeros(1, 2, 8)
    pool_ = torch.zeros(4, BS, 2, 8)
    tables, lens = torch.zeros(1, 1, dtype=torch.int32), torch.ones(1, dtype=torch.int32)
    starts = torch.tensor([0, 1], dtype=torch.int32)
    kernel = torch.ops.cbserve_cpu.paged_decode_attention
    with pytest.raises(RuntimeError, match="float32 queries only"):
        narrow = q.bfloat16()
        kernel(narrow, narrow, pool_, pool_, tables, lens, starts, 1.0)
    with pytest.raises(RuntimeError, match="K and V pools differ"):
        kernel(q, q, pool_.bfloat16(), pool_, tables, lens, starts, 1.0)
    with pytest.raises(RuntimeError, match="paged_decode_attention"):  # no float64 pool
        kernel(q, q, pool_.double(), pool_.double(), tables, lens, starts, 1.0)
    with pytest.raises(RuntimeError, match="int32"):
        kernel(q, q, pool_, pool_, tables.long(), lens, starts, 1.0)
    with pytest.raises(RuntimeError, match="shapes disagree"):  # a query start per sequence and one more
        kernel(q, q, pool_, pool_, tables, lens, starts[:1], 1.0)


def _step_attention(
    requests: list[ScheduledRequest], queries_per_kv: int, pool_dtype: torch.dtype, window: int | None = None
) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """The C++ op's output for one step and layer, the Python backend's (each on its own copy of one
    random pool, compared after too), and whether the step was handed to the C++ op."""
    step = _random_step(requests, queries_per_kv, pool_dtype)
    backend, context, kv_cache = step.backend, step.context, step.backend.kv_cache
    query, key, value, head_dim = step.query, step.key, step.value, HEAD_DIM
    pools_before = [p.clone() for p in (*kv_cache.k_pools, *kv_cache.v_pools)]
    assert native_attention(torch.device("cpu"))
    with step_context(context):
        pools = (kv_cache.k_pools[0], kv_cache.v_pools[0])
        out = torch.ops.cbserve_cpu.paged_attention(query, key, value, *pools, 0, head_dim**-0.5, window)
    native_pools = [p.clone() for p in (*kv_cache.k_pools, *kv_cache.v_pools)]
    for p, before in zip((*kv_cache.k_pools, *kv_cache.v_pools), pools_before, strict=True):
        p.copy_(before)
    variant = AttentionVariant(window=window)
    expected = backend.forward(0, query, key, value, context.metadata, head_dim**-0.5, variant)
    for p, native in zip((*kv_cache.k_pools, *kv_cache.v_pools), native_pools, strict=True):
        assert torch.equal(p, native)  # the same K/V at the same slots
    return out, expected, context.metadata.native


@pytest.mark.parametrize("queries_per_kv", [1, 4])
@pytest.mark.parametrize("pool_dtype", [torch.float32, torch.bfloat16])
def test_the_cpp_op_attends_a_mixed_step_as_the_backend_does(
    queries_per_kv: int, pool_dtype: torch.dtype
) -> None:
    """Decodes, first prompt chunks (a long one and a short one), later chunks for the kernel (a few
    queries) and for SDPA over the gathered pool (many queries), in an order that splits the kernel's
    sequences into several runs."""
    scattered = torch.randperm(300, generator=torch.Generator().manual_seed(4)).tolist()
    requests = [
        scheduled_request(0, scattered[:20], 19 * BS + 7, 1),
        scheduled_request(1, scattered[20:23], 2 * BS + 15, 1),
        scheduled_request(2, scattered[23:27], 0, 3 * BS + 2),  # a first chunk: SDPA on its own K/V
        scheduled_request(3, scattered[27:40], 12 * BS - 3, KERNEL_MAX_QUERIES),  # the kernel
        scheduled_request(4, scattered[40:41], 0, 5),  # a short first chunk: SDPA too
        scheduled_request(5, scattered[41:50], 6 * BS + 1, 2 * BS),  # SDPA over its gathered blocks
        scheduled_request(6, scattered[50:53], 2 * BS, 2),  # the kernel again
    ]
    out, expected, native = _step_attention(requests, queries_per_kv, pool_dtype)
    assert native
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_the_cpp_op_passes_a_windowed_layer_to_the_python_op() -> None:
    requests = [scheduled_request(0, list(range(10)), 9 * BS + 3, 1), scheduled_request(1, [20, 21], 0, 20)]
    out, expected, native = _step_attention(requests, 2, torch.float32, window=20)
    assert native  # the step is the C++ op's, but not this layer
    assert torch.equal(out, expected)  # the same Python code ran


def test_both_ops_declare_the_pools_they_write() -> None:
    """The Python op and its C++ twin take the layer's pools as arguments marked written, so that a
    compiled graph knows of the write (tests/stack/services/test_compiled_forward.py compiles them)."""
    assert cpu_kernels.load()
    for op in (torch.ops.cbserve.paged_attention.default, torch.ops.cbserve_cpu.paged_attention.default):
        arguments = op._schema.arguments
        assert [a.name for a in arguments if a.alias_info is not None and a.alias_info.is_write] == [
            "k_cache",
            "v_cache",
        ]
    # The C++ op attends the step it was handed: other pools than the layer's are refused.
    step = _random_step([scheduled_request(0, [3, 4], BS + 2, 1)], 2, torch.float32)
    kv_cache = step.backend.kv_cache
    with step_context(step.context), pytest.raises(RuntimeError, match="not the step's pools"):
        others = (kv_cache.k_pools[0].clone(), kv_cache.v_pools[0])
        torch.ops.cbserve_cpu.paged_attention(step.query, step.key, step.value, *others, 0, 0.1, None)
