"""Paged attention: variable-length query chunks over paged context, a decode being a chunk of one token.

A chunk's K/V are already in the pool (written just before), and so are the earlier chunks of its
prompt; each query attends causally by absolute position over everything up to itself. Grid:
(sequence, query block, kv head); one program takes BLOCK_Q query tokens times the QUERIES_PER_KV
query heads of its kv head as the BLOCK_M rows of one tile (vLLM's unified-attention layout), so GQA
reads K/V once, with an online softmax over tiles up to each block's last query, so short contexts
never pay for the longest one. Programs past a sequence's query length exit at once: the grid is
sized by the step's longest chunk, and every sequence of the step is served by one launch.

The backend launches it once a layer, for the step's prefill chunks; its decodes go to the decode
kernel (paged_decode.py), which packs GQA heads and splits long contexts. A one-token chunk given
here takes its query heads as the rows, padded to 16. A padding row (seq_len 0, as CUDA graphs
replay a padded batch) gets zeros.
"""

from __future__ import annotations

import triton
import triton.language as tl

from gpu_worker.kernels.triton.paged_tile import (
    LOG2E,
    PLAIN_KERNEL,
    KernelVariant,
    PagedBatch,
    attend_state,
    normalized,
    pad16,
    sink_logits,
)

TILE_N = 32  # keys per softmax step
BLOCK_M = 64  # query rows (tokens x heads of one kv head) per program of a prefill launch


# Per-step integers are not specialized (Triton would compile a variant for 1 and for multiples of
# 16), so the first mixed steps of a run do not recompile the kernel (nor does a new block-table
# width or a layer's window).
@triton.jit(do_not_specialize=["first_seq", "stride_bt", "window"])
def _paged_attention_kernel(
    out_ptr,
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    seq_lens_ptr,
    query_start_loc_ptr,
    first_seq,
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
    BLOCK_M: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    TILE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    WHILE_LOOP: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr,
    HAS_SINKS: tl.constexpr,
):
    seq = first_seq + tl.program_id(0)
    q_block = tl.program_id(1)
    kv_head = tl.program_id(2)
    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    if q_block * BLOCK_Q < q_len:
        seq_len = tl.load(seq_lens_ptr + seq)
        context_start = seq_len - q_len  # tokens cached by earlier chunks

        rows = tl.arange(0, BLOCK_M)
        token = q_block * BLOCK_Q + rows // QUERIES_PER_KV  # index within this chunk
        head = kv_head * QUERIES_PER_KV + rows % QUERIES_PER_KV
        row_valid = (rows < BLOCK_Q * QUERIES_PER_KV) & (token < q_len)
        q_pos = context_start + token  # absolute position of each row's query
        dims = tl.arange(0, HEAD_DIM_PAD)
        q_mask = row_valid[:, None] & (dims[None, :] < HEAD_DIM)
        q_offsets = (q_start + token).to(tl.int64)[:, None] * stride_qt + head[:, None] * stride_qh
        q = tl.load(q_ptr + q_offsets + dims[None, :], mask=q_mask, other=0.0).to(tl.float32)

        table = block_tables_ptr + seq.to(tl.int64) * stride_bt
        # Keys past this block's last query are masked for all of its rows: stop before them.
        kv_end = tl.minimum(seq_len, context_start + (q_block + 1) * BLOCK_Q)
        kv_start = 0
        if HAS_WINDOW:
            # Keys before this block's first query's window are masked for all of its rows: skip them.
            kv_start = tl.maximum(context_start + q_block * BLOCK_Q - window + 1, 0)
        m_init = sink_logits(sinks_ptr, head, row_valid, HAS_SINKS)
        _, l_i, acc = attend_state(
            q, q_pos, rows, kv_start, kv_end, window, softcap, m_init,
            k_cache_ptr, v_cache_ptr, table, kv_head, dims, stride_cache_slot, stride_cache_head, qk_scale,
            BLOCK_SIZE, HEAD_DIM, TILE, 1, DOT_PRECISION, WHILE_LOOP, HAS_WINDOW, HAS_SOFTCAP,
        )  # fmt: skip
        out = normalized(l_i, acc)
        # A row that sees no key (a padding row, seq_len 0) gets zeros, never NaN.
        o_offsets = (q_start + token).to(tl.int64)[:, None] * stride_ot + head[:, None] * stride_oh
        tl.store(out_ptr + o_offsets + dims[None, :], out.to(out_ptr.dtype.element_ty), mask=q_mask)


def paged_attention(
    batch: PagedBatch,
    first_seq: int,
    num_seqs: int,
    max_query_len: int,
    scale: float,
    variant: KernelVariant = PLAIN_KERNEL,
) -> None:
    """Attend sequences first_seq .. first_seq + num_seqs - 1 of the step (`PagedBatch`), whose
    longest chunk is `max_query_len` tokens."""
    if num_seqs == 0:
        return
    queries_per_kv = batch.queries_per_kv
    # One-token chunks take their query heads as the rows, padded to a dot's size (the decodes'
    # own kernel packs them better: paged_decode.py); longer chunks as many of their tokens' heads
    # as BLOCK_M rows hold.
    block_m = pad16(queries_per_kv) if max_query_len == 1 else max(BLOCK_M, pad16(queries_per_kv))
    block_q = block_m // queries_per_kv
    grid = (num_seqs, triton.cdiv(max_query_len, block_q), batch.k_cache.shape[2])
    _paged_attention_kernel[grid](
        batch.out,
        *batch.tensors(),
        first_seq,
        qk_scale=scale * LOG2E,
        QUERIES_PER_KV=queries_per_kv,
        BLOCK_M=block_m,
        BLOCK_Q=block_q,
        TILE=TILE_N,
        **batch.args(),
        **variant.args(batch.seq_lens),
    )
