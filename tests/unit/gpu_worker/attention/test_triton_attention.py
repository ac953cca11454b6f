"""The Triton attention backend's kernels against the torch backend (the reference), under Triton's
interpreter on CPU tensors: block sizes, GQA ratios, ragged and long contexts, chunked prefill over
cached context, shuffled block tables with holes, float32 and bfloat16, sliding windows, softcapping
and sinks (the torch backend's against transformers' eager attention: test_attention_variants.py)."""

from __future__ import annotations

import pytest
import torch

from gpu_worker.kernels.triton.kv_write import kv_write
from gpu_worker.kernels.triton.paged_attention import paged_attention
from gpu_worker.kernels.triton.paged_tile import PagedBatch
from gpu_worker.runner.attention.torch_attn import TorchAttentionBackend
from gpu_worker.runner.attention.triton_attn import TritonAttentionBackend
from gpu_worker.runner.attention.variant import PLAIN, AttentionVariant
from harness.gpu_worker.paged_steps import DEVICE, make_step, pool

NUM_KV_HEADS = 2
HEAD_DIM = 32
# (cached, new) tokens: decodes of ragged lengths (one of a single token), a first prompt chunk and a
# later chunk starting mid-block over cached context.
SEQS = [(70, 1), (16, 1), (0, 1), (40, 1), (0, 23), (45, 19)]
# Long contexts: a decode and a last prompt chunk over a thousand cached tokens.
LONG_SEQS = [(1029, 1), (3, 1), (1000, 9), (0, 5)]


def _tolerance(dtype: torch.dtype) -> dict[str, float]:
    # bfloat16 output is the float32 result rounded once (a 1-ulp difference from torch's rounding).
    return {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 2e-2, "rtol": 2e-2}


FP32, BF16 = torch.float32, torch.bfloat16


# Every pair of (block size, GQA ratio, dtype) values is covered once; the interpreter is slow.
@pytest.mark.parametrize(
    ("block_size", "queries_per_kv", "dtype"),
    [(16, 1, FP32), (32, 1, BF16), (16, 4, BF16), (32, 4, FP32), (16, 8, FP32), (32, 8, BF16)],
    ids=lambda value: str(value).removeprefix("torch."),
)
def test_step_matches_torch_backend(block_size: int, queries_per_kv: int, dtype: torch.dtype) -> None:
    _check_step(SEQS, block_size, queries_per_kv, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_long_context_matches_torch_backend(dtype: torch.dtype) -> None:
    _check_step(LONG_SEQS, 16, 4, dtype)


# Every feature at once, in a window shorter than most contexts, and each alone.
SINKS = [0.5, -1.0, 2.0, 0.0, 1.0, -0.5, 3.0, 0.25]  # one per query head


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("variant", ["window", "softcap", "sinks", "all"])
def test_variant_matches_torch_backend(variant: str, dtype: torch.dtype) -> None:
    sinks = torch.tensor(SINKS, device=DEVICE, dtype=dtype)
    variants = {
        "window": AttentionVariant(window=21),
        "softcap": AttentionVariant(softcap=2.0),
        "sinks": AttentionVariant(sinks=sinks),
        "all": AttentionVariant(window=21, softcap=2.0, sinks=sinks),
    }
    _check_step(SEQS, 16, 4, dtype, variants[variant])


def _check_step(
    seqs: list[tuple[int, int]],
    block_size: int,
    queries_per_kv: int,
    dtype: torch.dtype,
    variant: AttentionVariant = PLAIN,
) -> None:
    """One step of `seqs` through the triton backend and the torch backend (in float32, on the same
    pool): same output, same pool after."""
    num_blocks = 2 * sum(-(-(c + n) // block_size) + 1 for c, n in seqs)
    triton_backend = TritonAttentionBackend(pool(num_blocks, block_size, NUM_KV_HEADS, HEAD_DIM, dtype))
    step = make_step(triton_backend, seqs, num_heads=NUM_KV_HEADS * queries_per_kv, dtype=dtype)
    assert step.common.num_decodes == sum(n == 1 for _, n in seqs)
    out = triton_backend.forward(0, step.query, step.key, step.value, step.common, HEAD_DIM**-0.5, variant)

    # The reference in float32 on the same pool: its KV write is index_copy_ at the same slots.
    reference = TorchAttentionBackend(
        pool(num_blocks, block_size, NUM_KV_HEADS, HEAD_DIM, torch.float32), True
    )
    reference.kv_cache.k_pools[0].copy_(step.k_pool)
    reference.kv_cache.v_pools[0].copy_(step.v_pool)
    expected = reference.forward(
        0,
        step.query.float(),
        step.key.float(),
        step.value.float(),
        reference.build_metadata(step.common),
        HEAD_DIM**-0.5,
        variant,
    )
    assert not out.isnan().any()
    torch.testing.assert_close(out.float(), expected, **_tolerance(dtype))
    # The written K/V are copies (no arithmetic), so the pools agree exactly.
    assert torch.equal(triton_backend.kv_cache.k_pools[0].float(), reference.kv_cache.k_pools[0])
    assert torch.equal(triton_backend.kv_cache.v_pools[0].float(), reference.kv_cache.v_pools[0])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_kv_write_skips_negative_slots(dtype: torch.dtype) -> None:
    cache = pool(4, 16, NUM_KV_HEADS, HEAD_DIM, dtype)
    key = torch.randn(3, NUM_KV_HEADS, HEAD_DIM).to(DEVICE, dtype)
    value = torch.randn(3, NUM_KV_HEADS, HEAD_DIM).to(DEVICE, dtype)
    kv_write(key, value, cache.k_pools[0], cache.v_pools[0], torch.tensor([37, -1, 5], device=DEVICE))
    k_flat = cache.k_pools[0].view(-1, NUM_KV_HEADS, HEAD_DIM)
    v_flat = cache.v_pools[0].view(-1, NUM_KV_HEADS, HEAD_DIM)
    assert torch.equal(k_flat[37], key[0]) and torch.equal(k_flat[5], key[2])
    assert torch.equal(v_flat[37], value[0]) and torch.equal(v_flat[5], value[2])
    assert int(k_flat.abs().sum(dim=(1, 2)).count_nonzero()) == 2  # the padding token wrote nothing


def test_decode_padding_rows_give_zeros() -> None:
    # A batch padded to a fixed size (as CUDA graphs replay it): padding rows have seq_len 0.
    cache = pool(4, 16, NUM_KV_HEADS, HEAD_DIM, torch.float32)
    cache.v_pools[0].normal_()
    query = torch.randn(2, NUM_KV_HEADS * 4, HEAD_DIM, device=DEVICE)
    out = torch.full_like(query, float("nan"))
    tables = torch.tensor([[2, 0], [0, 0]], dtype=torch.int32, device=DEVICE)
    seq_lens = torch.tensor([3, 0], dtype=torch.int32, device=DEVICE)
    query_start_loc = torch.arange(3, dtype=torch.int32, device=DEVICE)  # one token each
    batch = PagedBatch(out, query, cache.k_pools[0], cache.v_pools[0], tables, seq_lens, query_start_loc)
    paged_attention(batch, 0, 2, 1, 0.2)
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    # One real row over three keys of zeros: uniform weights, the mean of the three values.
    expected = cache.v_pools[0][2, :3].mean(dim=0).repeat_interleave(4, dim=0)
    torch.testing.assert_close(out[0], expected)


def test_non_power_of_two_block_size_is_refused() -> None:
    with pytest.raises(ValueError, match="power-of-two block size"):
        TritonAttentionBackend(pool(4, 24, NUM_KV_HEADS, HEAD_DIM, torch.float32))


def test_a_narrow_pool_under_float32_queries() -> None:
    """WORKER_KV_CACHE_DTYPE=bfloat16 on a float32 model: the kernels store the step's K/V rounded
    and read the pool into float32, as the torch backend does over the same narrow pool (within
    bfloat16's rounding: a first prompt chunk attends over its own K/V before or after rounding)."""
    num_blocks = 2 * sum(-(-(c + n) // 16) + 1 for c, n in SEQS)
    triton_backend = TritonAttentionBackend(pool(num_blocks, 16, NUM_KV_HEADS, HEAD_DIM, torch.bfloat16))
    step = make_step(triton_backend, SEQS, num_heads=NUM_KV_HEADS * 2, dtype=torch.float32)
    out = triton_backend.forward(0, step.query, step.key, step.value, step.common, HEAD_DIM**-0.5)
    reference = TorchAttentionBackend(
        pool(num_blocks, 16, NUM_KV_HEADS, HEAD_DIM, torch.bfloat16), True, dtype=torch.float32
    )
    reference.kv_cache.k_pools[0].copy_(step.k_pool)
    reference.kv_cache.v_pools[0].copy_(step.v_pool)
    metadata = reference.build_metadata(step.common)
    expected = reference.forward(0, step.query, step.key, step.value, metadata, HEAD_DIM**-0.5)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, expected, **_tolerance(torch.bfloat16))
    assert torch.equal(triton_backend.kv_cache.k_pools[0], reference.kv_cache.k_pools[0])
    assert torch.equal(triton_backend.kv_cache.v_pools[0], reference.kv_cache.v_pools[0])
