"""The attention loop shared by the decode and prefill kernels: K/V tiles read through a block table,
folded into an online softmax.

A layer's variant (its window, softcap and sinks, as gpu_worker/runner/attention/variant.py describes
them; plain arguments, so the kernels import nothing of the runner) enters here: the window as a lower
bound on the positions each row sees (and the first tile the loop reads), softcapping applied to the
scores, and sinks as the softmax's starting state (running max = the sink, sum = 1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import triton
import triton.language as tl

# Scores are scaled by log2(e) so that the softmax runs on exp2.
LOG2E = 1.4426950408889634
# The same inside kernels, which may read only constexpr globals.
LOG2E_C = tl.constexpr(LOG2E)
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
    """K and V, [TILE, HEAD_DIM_PAD] float32 each, of one sequence's tokens at `positions` [TILE], of
    kv head `kv_head` (one, or [TILE, 1]: each position's own).

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
def _tanh(x):
    # Written with exp2 (Triton's core language has no tanh): saturates to +-1, never NaN.
    return 1.0 - 2.0 / (tl.exp2(x * (2.0 * LOG2E_C)) + 1.0)


@triton.jit
def _attend_tile(
    q, q_pos, row_group, m_i, l_i, acc, start, kv_end, window, softcap,
    k_cache_ptr, v_cache_ptr, table_ptr, kv_head, dims, stride_slot, stride_head, qk_scale,
    BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, TILE: tl.constexpr, GROUPS: tl.constexpr,
    DOT_PRECISION: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
):  # fmt: skip
    # GROUPS kv heads side by side: column c is position start + c % TILE of kv head
    # kv_head + c // TILE, and row r sees only the columns of its own `row_group[r]`.
    cols = tl.arange(0, GROUPS * TILE)
    col_group = cols // TILE
    positions = start + cols % TILE
    valid = positions < kv_end
    k, v = load_kv_tiles(
        k_cache_ptr, v_cache_ptr, table_ptr, positions, valid, kv_head + col_group[:, None], dims,
        stride_slot, stride_head, BLOCK_SIZE, HEAD_DIM,
    )  # fmt: skip
    s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
    if HAS_SOFTCAP:
        # `softcap` and the scores are both in log2 units: cap * tanh(s / cap) scales through.
        s = softcap * _tanh(s / softcap)
    allowed = valid[None, :] & (positions[None, :] <= q_pos[:, None])
    if HAS_WINDOW:
        allowed = allowed & (positions[None, :] > q_pos[:, None] - window)
    if GROUPS > 1:
        allowed = allowed & (row_group[:, None] == col_group[None, :])
    s = tl.where(allowed, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    # A row with nothing allowed yet keeps m = -inf, and exp2(-inf - -inf) would be NaN.
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp2(s - m_safe[:, None])
    alpha = tl.exp2(m_i - m_safe)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    if DOT_PRECISION == "ieee":
        pv = tl.dot(p, v, input_precision="ieee")
    else:
        # p is float32 and v exact in tf32: one tf32 pass would round p to 10 bits; three keep
        # float32's precision, still on the tensor cores (decode is bound by reading K/V).
        pv = tl.dot(p, v, input_precision="tf32x3")
    acc = acc * alpha[:, None] + pv
    return m_new, l_i, acc


@triton.jit
def attend_state(
    q, q_pos, row_group, kv_start, kv_end, window, softcap, m_init,
    k_cache_ptr, v_cache_ptr, table_ptr, kv_head, dims, stride_slot, stride_head, qk_scale,
    BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, TILE: tl.constexpr, GROUPS: tl.constexpr,
    DOT_PRECISION: tl.constexpr, WHILE_LOOP: tl.constexpr, HAS_WINDOW: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr,
):  # fmt: skip
    """The online softmax of the float32 rows `q` [M, HEAD_DIM_PAD] over key positions [kv_start,
    kv_end) of one sequence, unnormalized: (running max [M] in log2 units, sum of exponentials [M],
    weighted values [M, HEAD_DIM_PAD]). Each row sees the positions up to its own `q_pos` [M] (causal
    by absolute position) and, with HAS_WINDOW, after q_pos - window; with GROUPS > 1 the key tiles
    hold GROUPS kv heads from `kv_head` on and row r reads kv head kv_head + row_group[r] (_attend_tile).
    `m_init` [M]: each row's sink logit in log2 units, or -inf for none. A row that sees nothing (and
    has no sink) ends with -inf, 0 and zeros."""
    m_i = m_init
    l_i = tl.where(m_init == float("-inf"), 0.0, 1.0)  # the sink's own term exp(sink - m) = 1
    acc = tl.zeros(q.shape, dtype=tl.float32)
    if WHILE_LOOP:
        # Triton's interpreter (under numpy >= 2.4) cannot take a loaded value as a range() bound.
        start = kv_start
        while start < kv_end:
            m_i, l_i, acc = _attend_tile(
                q, q_pos, row_group, m_i, l_i, acc, start, kv_end, window, softcap,
                k_cache_ptr, v_cache_ptr, table_ptr, kv_head, dims, stride_slot, stride_head, qk_scale,
                BLOCK_SIZE, HEAD_DIM, TILE, GROUPS, DOT_PRECISION, HAS_WINDOW, HAS_SOFTCAP,
            )  # fmt: skip
            start += TILE
    else:
        # A for loop, which the compiler software-pipelines (the next tile loads during this one's math).
        for start in range(kv_start, kv_end, TILE):
            m_i, l_i, acc = _attend_tile(
                q, q_pos, row_group, m_i, l_i, acc, start, kv_end, window, softcap,
                k_cache_ptr, v_cache_ptr, table_ptr, kv_head, dims, stride_slot, stride_head, qk_scale,
                BLOCK_SIZE, HEAD_DIM, TILE, GROUPS, DOT_PRECISION, HAS_WINDOW, HAS_SOFTCAP,
            )  # fmt: skip
    return m_i, l_i, acc


@triton.jit
def normalized(l_i, acc):
    """The attention output [M, HEAD_DIM_PAD] of an online softmax's state: zeros where l_i is 0."""
    return acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]


@triton.jit
def sink_logits(sinks_ptr, heads, valid, HAS_SINKS: tl.constexpr):
    """[M] each row's sink logit in log2 units (the scores' units), -inf where a row has none."""
    if HAS_SINKS:
        sinks = tl.load(sinks_ptr + heads, mask=valid, other=float("-inf")).to(tl.float32) * LOG2E_C
    else:
        sinks = tl.full(heads.shape, float("-inf"), dtype=tl.float32)
    return sinks


def dot_precision(dtype: torch.dtype) -> str:
    """float32 pools get exact float32 products (tf32 would change greedy tokens); 16-bit values are
    exact in tf32, so their products use the tensor cores at no cost in accuracy (the probabilities
    they are weighted by are not: `_attend_tile` gives that product three tf32 passes)."""
    return "ieee" if dtype == torch.float32 else "tf32"


@dataclass(frozen=True, slots=True)
class KernelVariant:
    """A layer's variant as the kernels take it: plain numbers, 0 for off, and the constexpr flags
    that compile each feature in only where it is used."""

    window: int
    softcap: float  # in log2 units, as the scores
    sinks: torch.Tensor | None

    @classmethod
    def of(cls, window: int | None, softcap: float | None, sinks: torch.Tensor | None) -> KernelVariant:
        return cls(window or 0, 0.0 if softcap is None else softcap * LOG2E, sinks)

    def args(self, like: torch.Tensor) -> dict[str, Any]:
        """The kernel arguments: `sinks_ptr`, `window`, `softcap` and the three flags."""
        return {
            "sinks_ptr": like if self.sinks is None else self.sinks,  # never read without HAS_SINKS
            "window": self.window,
            "softcap": self.softcap,
            "HAS_WINDOW": self.window > 0,
            "HAS_SOFTCAP": self.softcap > 0,
            "HAS_SINKS": self.sinks is not None,
        }


PLAIN_KERNEL = KernelVariant(0, 0.0, None)


@dataclass(frozen=True, slots=True)
class PagedBatch:
    """One step's tensors as the decode and prefill kernels take them alike.

    out/query [T, heads, head_dim] of the whole step (sequence b's tokens at query_start_loc[b] ..
    query_start_loc[b + 1], [B + 1] int32); pools [num_blocks, block_size, kv_heads, head_dim]
    contiguous, already holding this step's K/V; block_tables [B, max_blocks] int32; seq_lens [B]
    int32 (cached + this step's tokens; 0: a padding row, whose output is zeros)."""

    out: torch.Tensor
    query: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    query_start_loc: torch.Tensor

    @property
    def queries_per_kv(self) -> int:
        return int(self.query.shape[1] // self.k_cache.shape[2])

    def tensors(self) -> tuple[torch.Tensor, ...]:
        """The kernels' first pointer arguments after `out`, in their order."""
        return (
            self.query,
            self.k_cache,
            self.v_cache,
            self.block_tables,
            self.seq_lens,
            self.query_start_loc,
        )

    def args(self) -> dict[str, Any]:
        """Strides, pool layout and dot precision."""
        out, query, k_cache = self.out, self.query, self.k_cache
        return {
            "stride_ot": out.stride(0),
            "stride_oh": out.stride(1),
            "stride_qt": query.stride(0),
            "stride_qh": query.stride(1),
            "stride_bt": self.block_tables.stride(0),
            "stride_cache_slot": k_cache.stride(1),
            "stride_cache_head": k_cache.stride(2),
            "HEAD_DIM": query.shape[2],
            "BLOCK_SIZE": k_cache.shape[1],
            "HEAD_DIM_PAD": pad16(query.shape[2]),
            "DOT_PRECISION": dot_precision(k_cache.dtype),
            "WHILE_LOOP": INTERPRETED,
        }


def pad16(n: int) -> int:
    """A tl.dot dimension: a power of two, at least 16 (the smallest the GPU's dot accepts)."""
    return max(16, triton.next_power_of_2(n))
