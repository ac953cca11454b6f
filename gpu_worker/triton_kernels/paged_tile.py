"""The attention loop shared by the decode and prefill kernels: K/V tiles read through a block table,
folded into an online softmax."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# Scores are scaled by log2(e) so that the softmax runs on exp2.
LOG2E = 1.4426950408889634
# Whether the kernels defined next run under Triton's interpreter, which needs the while-loop form of
# the key loop (read here, as @triton.jit reads TRITON_INTERPRET, when the kernels are defined).
INTERPRETED = bool(triton.knobs.runtime.interpret)


@triton.jit
def load_kv_tiles(
    k_cache_ptr,
    v_cache_ptr,
    table_ptr,
    positions,
    valid,
    kv_head,
    dims,
    stride_slot,
    stride_head,
    BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
):
    """K and V, [TILE, HEAD_DIM_PAD] float32 each, of one sequence's tokens at `positions`, one kv head.

    A tile may span several blocks or part of one, so any power-of-two block size works with any
    tile size: each position looks up its own block in the table."""
    block = tl.load(table_ptr + positions // BLOCK_SIZE, mask=valid, other=0).to(tl.int64)
    slot = block * BLOCK_SIZE + positions % BLOCK_SIZE
    offsets = slot[:, None] * stride_slot + kv_head * stride_head + dims[None, :]
    mask = valid[:, None] & (dims[None, :] < HEAD_DIM)
    k = tl.load(k_cache_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    v = tl.load(v_cache_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    return k, v


@triton.jit
def _attend_tile(
    q, q_pos, m_i, l_i, acc, start, kv_end,
    k_cache_ptr, v_cache_ptr, table_ptr, kv_head, dims, stride_slot, stride_head, qk_scale,
    BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, TILE: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    positions = start + tl.arange(0, TILE)
    valid = positions < kv_end
    k, v = load_kv_tiles(
        k_cache_ptr, v_cache_ptr, table_ptr, positions, valid, kv_head, dims, stride_slot, stride_head,
        BLOCK_SIZE, HEAD_DIM,
    )  # fmt: skip
    s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
    s = tl.where(valid[None, :] & (positions[None, :] <= q_pos[:, None]), s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    # A row with nothing allowed yet keeps m = -inf, and exp2(-inf - -inf) would be NaN.
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp2(s - m_safe[:, None])
    alpha = tl.exp2(m_i - m_safe)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + tl.dot(p, v, input_precision=DOT_PRECISION)
    return m_new, l_i, acc


@triton.jit
def attend_context(
    q, q_pos, kv_end,
    k_cache_ptr, v_cache_ptr, table_ptr, kv_head, dims, stride_slot, stride_head, qk_scale,
    BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, TILE: tl.constexpr, DOT_PRECISION: tl.constexpr,
    WHILE_LOOP: tl.constexpr,
):  # fmt: skip
    """Softmax attention of the float32 rows `q` [M, HEAD_DIM_PAD] over key positions [0, kv_end) of
    one sequence, each row seeing the positions up to its own `q_pos` [M] (causal by absolute
    position). Returns [M, HEAD_DIM_PAD] float32; a row that sees nothing gets zeros."""
    M: tl.constexpr = q.shape[0]
    m_i = tl.full([M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([M], dtype=tl.float32)
    acc = tl.zeros(q.shape, dtype=tl.float32)
    if WHILE_LOOP:
        # Triton's interpreter (under numpy >= 2.4) cannot take a loaded value as a range() bound.
        start = 0
        while start < kv_end:
            m_i, l_i, acc = _attend_tile(
                q, q_pos, m_i, l_i, acc, start, kv_end,
                k_cache_ptr, v_cache_ptr, table_ptr, kv_head, dims, stride_slot, stride_head, qk_scale,
                BLOCK_SIZE, HEAD_DIM, TILE, DOT_PRECISION,
            )  # fmt: skip
            start += TILE
    else:
        # A for loop, which the compiler software-pipelines (the next tile loads during this one's math).
        for start in range(0, kv_end, TILE):
            m_i, l_i, acc = _attend_tile(
                q, q_pos, m_i, l_i, acc, start, kv_end,
                k_cache_ptr, v_cache_ptr, table_ptr, kv_head, dims, stride_slot, stride_head, qk_scale,
                BLOCK_SIZE, HEAD_DIM, TILE, DOT_PRECISION,
            )  # fmt: skip
    return acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]


def dot_precision(dtype: torch.dtype) -> str:
    """float32 pools get exact float32 products (tf32 would change greedy tokens); 16-bit values are
    exact in tf32, so their products use the tensor cores at no cost in accuracy."""
    return "ieee" if dtype == torch.float32 else "tf32"


def pad16(n: int) -> int:
    """A tl.dot dimension: a power of two, at least 16 (the smallest the GPU's dot accepts)."""
    return max(16, triton.next_power_of_2(n))
