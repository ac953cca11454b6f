"""Paged decode attention: one query token per sequence over its cached K/V, read through its block
table in place. One program per (sequence, kv head) attends all the query heads of that kv head
together (GQA without repeating K/V), with an online softmax over tiles up to the sequence's own
length, so short contexts never pay for the longest one."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gpu_worker.kernels.triton.paged_tile import (
    LOG2E,
    KernelVariant,
    attend_context,
    pad16,
    shared_args,
    sink_logits,
)

TILE_N = 32  # keys per softmax step


# The block-table width changes per step: not specialized, so a new width never recompiles (nor does
# a layer's window).
@triton.jit(do_not_specialize=["stride_bt", "window"])
def _paged_decode_kernel(
    out_ptr,
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    seq_lens_ptr,
    sinks_ptr,
    qk_scale,
    window,
    softcap,
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
    HAS_WINDOW: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr,
    HAS_SINKS: tl.constexpr,
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
    kv_start = 0
    if HAS_WINDOW:
        kv_start = tl.maximum(seq_len - window, 0)  # the first position inside the window
    m_init = sink_logits(sinks_ptr, heads, group < QUERIES_PER_KV, HAS_SINKS)
    out = attend_context(
        q, q_pos, kv_start, seq_len, window, softcap, m_init,
        k_cache_ptr, v_cache_ptr, table, kv_head, dims, stride_cache_slot, stride_cache_head, qk_scale,
        BLOCK_SIZE, HEAD_DIM, TILE, DOT_PRECISION, WHILE_LOOP, HAS_WINDOW, HAS_SOFTCAP,
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
    window: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> None:
    """out/query [num_decodes, heads, head_dim] (one token per sequence); pools [num_blocks, block_size,
    kv_heads, head_dim] contiguous; block_tables [>= num_decodes, max_blocks] int32; seq_lens
    [>= num_decodes] int32, each including the token being decoded (0: a padding row, output zeros)."""
    num_decodes, num_heads = query.shape[:2]
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
        qk_scale=scale * LOG2E,
        QUERIES_PER_KV=queries_per_kv,
        HEADS_PAD=pad16(queries_per_kv),
        TILE=TILE_N,
        **shared_args(out, query, k_cache, block_tables),
        **KernelVariant.of(window, softcap, sinks).args(seq_lens),
    )
