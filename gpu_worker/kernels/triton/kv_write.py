"""Store one step's K/V into the paged pool at each token's slot (nano-vllm's `store_kvcache`)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_T = 16  # tokens per program


# The token count changes every step: not specialized (Triton would compile variants for 1 and for
# multiples of 16).
@triton.jit(do_not_specialize=["num_tokens"])
def _kv_write_kernel(
    key_ptr,
    value_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_mapping_ptr,
    num_tokens,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_cache_slot,
    stride_cache_head,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    KV_HEADS_PAD: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    BLOCK_T: tl.constexpr,
):
    tokens = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    slots = tl.load(slot_mapping_ptr + tokens, mask=tokens < num_tokens, other=-1).to(tl.int64)
    heads = tl.arange(0, KV_HEADS_PAD)[None, :, None]
    dims = tl.arange(0, HEAD_DIM_PAD)[None, None, :]
    # A negative slot is a padding token (e.g. a CUDA-graph batch padded to its captured size): skipped.
    mask = (slots[:, None, None] >= 0) & (heads < NUM_KV_HEADS) & (dims < HEAD_DIM)
    rows = tokens.to(tl.int64)[:, None, None]
    k = tl.load(key_ptr + rows * stride_kt + heads * stride_kh + dims, mask=mask)
    v = tl.load(value_ptr + rows * stride_vt + heads * stride_vh + dims, mask=mask)
    dst = slots[:, None, None] * stride_cache_slot + heads * stride_cache_head + dims
    tl.store(k_cache_ptr + dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_cache_ptr + dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def kv_write(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """key/value [T, kv_heads, head_dim] (last dim contiguous) -> pools [num_blocks, block_size,
    kv_heads, head_dim] (contiguous) at the flat slots `slot_mapping` [T]; slot < 0 is skipped."""
    num_tokens, num_kv_heads, head_dim = key.shape
    if num_tokens == 0:
        return
    _kv_write_kernel[(triton.cdiv(num_tokens, BLOCK_T),)](
        key,
        value,
        k_cache,
        v_cache,
        slot_mapping,
        num_tokens,
        key.stride(0),
        key.stride(1),
        value.stride(0),
        value.stride(1),
        k_cache.stride(1),
        k_cache.stride(2),
        NUM_KV_HEADS=num_kv_heads,
        HEAD_DIM=head_dim,
        KV_HEADS_PAD=triton.next_power_of_2(num_kv_heads),
        HEAD_DIM_PAD=triton.next_power_of_2(head_dim),
        BLOCK_T=BLOCK_T,
    )
