"""Grouped LoRA for a batch of tokens of many adapters: Punica's / S-LoRA's shrink and expand, as
vLLM's Triton LoRA kernels (vllm/lora/ops/triton_ops/) lay them out.

Every adapter of a step sits in a slot of stacked factors, zero-padded to the largest rank R: A
`[slots, n * R, in]` (the n projections that share an input, q/k/v or gate/up, one after the other)
and one B per projection `[slots, R, out]` (B transposed, so a tile of it is contiguous along the
outputs). The step's tokens, sorted by slot (`order`, with each slot's `starts` and `counts`; base
model tokens are in no slot), are multiplied slot by slot: a program takes up to BLOCK_M tokens of one
slot, so tokens of one adapter share each tile of its factors whatever their order in the batch.

- shrink: `xa[t] = scale[s] * (x[t] A[s]^T)`, [T, n * R] in float32, each projection's scale on its R
  columns;
- expand: `y[t, cols_j] = xa[t, j * R : (j + 1) * R] B_j[s]` for each projection j, into its columns
  of one output; a token in no slot gets zeros.

As in the attention kernels, every load is converted to float32 before any arithmetic, and a dot of
16-bit values runs in tf32 (they are exact in it), of float32 ones at full precision; the shrink's
float32 result is rounded to the factors' dtype before the expand, as vLLM's kernels round it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from gpu_worker.kernels.triton.paged_tile import dot_precision, pad16

BLOCK_M = 16  # tokens of one slot per program (the smallest dot dimension)
BLOCK_N = 64  # output columns per program
BLOCK_K = 32  # input features per step of the shrink's reduction


@triton.jit
def _slot_rows(order_ptr, starts_ptr, counts_ptr, slot, pid_m, BLOCK_M: tl.constexpr):
    """The program's tokens: up to BLOCK_M of `slot`'s, from its run in the sorted order."""
    count = tl.load(counts_ptr + slot)
    offsets = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    valid = offsets < count
    start = tl.load(starts_ptr + slot)
    rows = tl.load(order_ptr + start + offsets, mask=valid, other=0).to(tl.int64)
    return rows, valid, pid_m * BLOCK_M < count


@triton.jit
def _lora_shrink_kernel(
    x_ptr,
    a_ptr,
    scale_ptr,
    out_ptr,
    order_ptr,
    starts_ptr,
    counts_ptr,
    stride_xt,
    stride_as,
    stride_an,
    stride_ss,
    stride_ot,
    IN_FEATURES: tl.constexpr,
    N: tl.constexpr,  # n * R columns
    RANK: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    slot = tl.program_id(2)
    rows, valid, active = _slot_rows(order_ptr, starts_ptr, counts_ptr, slot, tl.program_id(0), BLOCK_M)
    if active:
        cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        col_ok = cols < N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        a_base = a_ptr + slot.to(tl.int64) * stride_as
        for k0 in range(0, IN_FEATURES, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            k_ok = ks < IN_FEATURES
            x = tl.load(
                x_ptr + rows[:, None] * stride_xt + ks[None, :],
                mask=valid[:, None] & k_ok[None, :],
                other=0.0,
            ).to(tl.float32)
            a = tl.load(
                a_base + cols[None, :] * stride_an + ks[:, None],
                mask=k_ok[:, None] & col_ok[None, :],
                other=0.0,
            ).to(tl.float32)
            acc += tl.dot(x, a, input_precision=DOT_PRECISION)
        scale = tl.load(scale_ptr + slot * stride_ss + cols // RANK, mask=col_ok, other=0.0).to(tl.float32)
        acc = acc * scale[None, :]
        out_offsets = rows[:, None] * stride_ot + cols[None, :]
        tl.store(out_ptr + out_offsets, acc, mask=valid[:, None] & col_ok[None, :])


@triton.jit
def _lora_expand_kernel(
    xa_ptr,
    b_ptr,
    out_ptr,
    order_ptr,
    starts_ptr,
    counts_ptr,
    stride_xat,
    xa_col,
    stride_bs,
    stride_br,
    stride_ot,
    out_col,
    OUT_FEATURES: tl.constexpr,
    RANK: tl.constexpr,
    RANK_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    slot = tl.program_id(2)
    rows, valid, active = _slot_rows(order_ptr, starts_ptr, counts_ptr, slot, tl.program_id(0), BLOCK_M)
    if active:
        ranks = tl.arange(0, RANK_PAD)
        rank_ok = ranks < RANK
        xa = tl.load(
            xa_ptr + rows[:, None] * stride_xat + xa_col + ranks[None, :],
            mask=valid[:, None] & rank_ok[None, :],
            other=0.0,
        )
        cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        col_ok = cols < OUT_FEATURES
        b_offsets = slot.to(tl.int64) * stride_bs + ranks[:, None] * stride_br + cols[None, :]
        b = tl.load(b_ptr + b_offsets, mask=rank_ok[:, None] & col_ok[None, :], other=0.0)
        xa = xa.to(b_ptr.dtype.element_ty).to(tl.float32)  # rounded as B, so tf32 holds it exactly
        y = tl.dot(xa, b.to(tl.float32), input_precision=DOT_PRECISION)
        out_offsets = rows[:, None] * stride_ot + out_col + cols[None, :]
        tl.store(out_ptr + out_offsets, y.to(out_ptr.dtype.element_ty), mask=valid[:, None] & col_ok[None, :])


def lora_shrink(
    x: torch.Tensor,
    lora_a: torch.Tensor,
    scale: torch.Tensor,
    order: torch.Tensor,
    starts: torch.Tensor,
    counts: torch.Tensor,
) -> torch.Tensor:
    """x [T, in] (rows contiguous), lora_a [slots, n * R, in], scale [slots, n]; order [T] (token
    indexes sorted by slot), starts / counts [slots] -> xa [T, n * R] float32 (rows of tokens in no
    slot are left unwritten: expand never reads them)."""
    num_tokens, in_features = x.shape
    num_slots, n_cols, _ = lora_a.shape
    out = torch.empty((num_tokens, n_cols), dtype=torch.float32, device=x.device)
    if num_tokens == 0:
        return out
    grid = (triton.cdiv(num_tokens, BLOCK_M), triton.cdiv(n_cols, BLOCK_N), num_slots)
    _lora_shrink_kernel[grid](
        x,
        lora_a,
        scale,
        out,
        order,
        starts,
        counts,
        x.stride(0),
        lora_a.stride(0),
        lora_a.stride(1),
        scale.stride(0),
        out.stride(0),
        IN_FEATURES=in_features,
        N=n_cols,
        RANK=n_cols // scale.shape[1],
        BLOCK_M=BLOCK_M,
        BLOCK_N=BLOCK_N,
        BLOCK_K=BLOCK_K,
        DOT_PRECISION=dot_precision(lora_a.dtype),
    )
    return out


def lora_expand(
    xa: torch.Tensor,
    lora_b: Sequence[torch.Tensor],
    order: torch.Tensor,
    starts: torch.Tensor,
    counts: torch.Tensor,
    dtype: torch.dtype,
) -> torch.Tensor:
    """xa [T, n * R] from `lora_shrink`, lora_b n tensors [slots, R, out_j] -> [T, sum out_j] in
    `dtype`: each projection's delta in its columns, zeros for tokens in no slot."""
    num_tokens = xa.shape[0]
    outs = [b.shape[2] for b in lora_b]
    out = torch.zeros((num_tokens, sum(outs)), dtype=dtype, device=xa.device)
    if num_tokens == 0:
        return out
    rank = lora_b[0].shape[1]
    out_col = 0
    for j, b in enumerate(lora_b):
        grid = (triton.cdiv(num_tokens, BLOCK_M), triton.cdiv(outs[j], BLOCK_N), b.shape[0])
        _lora_expand_kernel[grid](
            xa,
            b,
            out,
            order,
            starts,
            counts,
            xa.stride(0),
            j * rank,
            b.stride(0),
            b.stride(1),
            out.stride(0),
            out_col,
            OUT_FEATURES=outs[j],
            RANK=rank,
            RANK_PAD=pad16(rank),
            BLOCK_M=BLOCK_M,
            BLOCK_N=BLOCK_N,
            DOT_PRECISION=dot_precision(b.dtype),
        )
        out_col += outs[j]
    return out
