"""Paged decode attention: one query token per sequence over its cached K/V, read through its block
table in place. One program per (sequence, kv head) attends all the query heads of that kv head
together (GQA without repeating K/V), with an online softmax over tiles up to the sequence's own
length, so short contexts never pay for the longest one."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gpu_worker.triton_kernels.paged_tile import INTERPRETED, LOG2E, attend_context, dot_precision, pad16

TILE_N = 32  # keys per softmax step


# The block-table width changes per step: not specialized, so a new width never recompiles.
@triton.jit(do_not_specialize=["stride_bt"])
def _paged_decode_kernel(
    out_ptr,
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    seq_lens_ptr,
    qk_scale,
    stride_ot,
    stride_oh,
    stride_qt,
    stride_qh,
    stride_bt,
    stride_cache_slot,
    stride_cache_head,
    QUERIES_PER_KV: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    HEADS_PAD: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    TILE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    WHILE_LOOP: tl.constexpr,
):
    seq = tl.program_id(0)  # decodes come first in the batch: sequence i is token i
    kv_head = tl.program_id(1)
    seq_len = tl.load(seq_lens_ptr + seq)
    group = tl.arange(0, HEADS_PAD)
    heads = kv_head * QUERIES_PER_KV + group
    dims = tl.arange(0, HEAD_DIM_PAD)
    q_mask = (group[:, None] < QUERIES_PER_KV) & (dims[None, :] < HEAD_DIM)
    q = tl.load(q_ptr + seq * stride_qt + heads[:, None] * stride_qh + dims[None, :], mask=q_mask, other=0.0)
    q = q.to(tl.float32)

    q_pos = tl.zeros([HEADS_PAD], dtype=tl.int32) + seq_len - 1  # the token being decoded
    table = block_tables_ptr + seq.to(tl.int64) * stride_bt
    out = attend_context(
        q, q_pos, seq_len,
        k_cache_ptr, v_cache_ptr, table, kv_head, dims, stride_cache_slot, stride_cache_head, qk_scale,
        BLOCK_SIZE, HEAD_DIM, TILE, DOT_PRECISION, WHILE_LOOP,
    )  # fmt: skip
    # A padding row (seq_len 0) gets zeros, never NaN.
    tl.store(
        out_ptr + seq * stride_ot + heads[:, None] * stride_oh + dims[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=q_mask,
    )


def paged_decode(
    out: torch.Tensor,
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> None:
    """out/query [num_decodes, heads, head_dim] (one token per sequence); pools [num_blocks, block_size,
    kv_heads, head_dim] contiguous; block_tables [>= num_decodes, max_blocks] int32; seq_lens
    [>= num_decodes] int32, each including the token being decoded (0: a padding row, output zeros)."""
    num_decodes, num_heads, head_dim = query.shape
    if num_decodes == 0:
        return
    num_kv_heads = k_cache.shape[2]
    queries_per_kv = num_heads // num_kv_heads
    _paged_decode_kernel[(num_decodes, num_kv_heads)](
        out,
        query,
        k_cache,
        v_cache,
        block_tables,
        seq_lens,
        scale * LOG2E,
        out.stride(0),
        out.stride(1),
        query.stride(0),
        query.stride(1),
        block_tables.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        QUERIES_PER_KV=queries_per_kv,
        HEAD_DIM=head_dim,
        BLOCK_SIZE=k_cache.shape[1],
        HEADS_PAD=pad16(queries_per_kv),
        HEAD_DIM_PAD=pad16(head_dim),
        TILE=TILE_N,
        DOT_PRECISION=dot_precision(k_cache.dtype),
        WHILE_LOOP=INTERPRETED,
    )
