"""Paged attention for a step's decodes (one query token per sequence), split over the context.

Grid: (sequence, kv-head group, segment). GQA packing: one program takes GROUPS kv heads (up to 4),
so that their query heads fill the 16 rows a dot needs instead of one kv head's heads padded to 16
(4-way GQA: 4 kv heads, no idle row); its key tiles hold 32 keys, 32 / GROUPS of each kv head, and
each row sees only its own kv head's (paged_tile.py). Split-KV
(flash-decoding, vLLM's segmented "3D" decode): with NUM_SEGMENTS > 1 each program attends one
segment of the context and writes its unnormalized float32 state (values, max, sum of exponentials) to
a scratch buffer, and `_merge_kernel` combines a row's segments by log-sum-exp; with 1 segment the
program writes the output itself. The segment count comes from host-known sizes only (batch, heads,
the step's longest context, the GPU's size), never from device data, and the scratch is allocated
once at its largest (`DecodeScratch`), so the launch is the same in a CUDA graph and out of it; each
program sizes its own segment from its sequence's length on the device, so a captured count serves
any context (segments past a short context attend nothing). A padding row (seq_len 0) gets zeros.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from gpu_worker.kernels.triton import paged_tile as tile
from gpu_worker.kernels.triton.paged_tile import PagedBatch, attend_state, normalized, sink_logits

# Keys per softmax step, all of a program's kv heads together (TILE_N // GROUPS each): the register
# footprint of the old one-head decode, 0 spills on Hopper at head_dim 128 (64 spilled, 128 spilled
# 8 KB: ptxas -v, harness/gpu_worker/triton_compile.py's target).
TILE_N = 32
ROWS = 16  # the query heads one program takes where they fit (a dot's smallest side)
MAX_GROUPS = 4  # kv heads a program takes at most: each keeps 8 keys a step
SEGMENT_FLOOR = 64  # fewest keys a segment is given: a shorter one costs more to merge than it saves
MAX_SEGMENTS = 64
PROGRAMS_PER_SM = 4  # programs a launch aims for, per streaming multiprocessor
DEFAULT_SMS = 132  # an H100's, where no GPU is visible (the interpreter, the fake-CUDA lane)


@triton.jit(do_not_specialize=["stride_bt", "window", "segment_floor"])
def _paged_decode_kernel(
    out_ptr, part_out_ptr, part_m_ptr, part_l_ptr, q_ptr, k_cache_ptr, v_cache_ptr,
    block_tables_ptr, seq_lens_ptr, query_start_loc_ptr, sinks_ptr, qk_scale, window, softcap,
    segment_floor, stride_ot, stride_oh, stride_qt, stride_qh, stride_bt, stride_cache_slot,
    stride_cache_head,
    NUM_HEADS: tl.constexpr, QUERIES_PER_KV: tl.constexpr, GROUPS: tl.constexpr,
    BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr, TILE: tl.constexpr, NUM_SEGMENTS: tl.constexpr,
    DOT_PRECISION: tl.constexpr, WHILE_LOOP: tl.constexpr, HAS_WINDOW: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr, HAS_SINKS: tl.constexpr,
):  # fmt: skip
    seq = tl.program_id(0)
    kv_group = tl.program_id(1)
    segment = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + seq)
    token = tl.load(query_start_loc_ptr + seq).to(tl.int64)

    rows = tl.arange(0, BLOCK_M)
    row_valid = rows < GROUPS * QUERIES_PER_KV
    head = kv_group * (GROUPS * QUERIES_PER_KV) + rows  # kv head kv_group * GROUPS + rows // QPK
    dims = tl.arange(0, HEAD_DIM_PAD)
    q_mask = row_valid[:, None] & (dims[None, :] < HEAD_DIM)
    q = tl.load(q_ptr + token * stride_qt + head[:, None] * stride_qh + dims[None, :], mask=q_mask, other=0.0)
    q = q.to(tl.float32)

    # The keys this query sees, [first, seq_len), cut into NUM_SEGMENTS runs of whole tiles.
    first = 0
    if HAS_WINDOW:
        first = tl.maximum(seq_len - window, 0)
    per_segment = tl.cdiv(tl.cdiv(seq_len - first, NUM_SEGMENTS), TILE) * TILE
    per_segment = tl.maximum(per_segment, segment_floor)
    kv_start = first + segment * per_segment
    kv_end = tl.minimum(seq_len, kv_start + per_segment)
    q_pos = tl.full([BLOCK_M], 0, tl.int32) + seq_len - 1
    # The sink is one more term of the softmax: counted once, in the first segment.
    m_init = sink_logits(sinks_ptr, head, row_valid & (segment == 0), HAS_SINKS)
    m_i, l_i, acc = attend_state(
        q, q_pos, rows // QUERIES_PER_KV, kv_start, kv_end, window, softcap, m_init,
        k_cache_ptr, v_cache_ptr, block_tables_ptr + seq.to(tl.int64) * stride_bt, kv_group * GROUPS,
        dims, stride_cache_slot, stride_cache_head, qk_scale,
        BLOCK_SIZE, HEAD_DIM, TILE, GROUPS, DOT_PRECISION, WHILE_LOOP, HAS_WINDOW, HAS_SOFTCAP,
    )  # fmt: skip
    if NUM_SEGMENTS == 1:
        o_offsets = token * stride_ot + head[:, None] * stride_oh + dims[None, :]
        tl.store(out_ptr + o_offsets, normalized(l_i, acc).to(out_ptr.dtype.element_ty), mask=q_mask)
    else:
        part = (seq.to(tl.int64) * NUM_HEADS + head) * NUM_SEGMENTS + segment
        # A segment past the context (a graph's count over a short one) writes only its max and sum:
        # the merge reads no values where the sum is 0. The first always writes (a sink's zeros).
        if (kv_start < kv_end) | (segment == 0):
            tl.store(part_out_ptr + part[:, None] * HEAD_DIM + dims[None, :], acc, mask=q_mask)
        tl.store(part_m_ptr + part, m_i, mask=row_valid)
        tl.store(part_l_ptr + part, l_i, mask=row_valid)


@triton.jit
def _merge_kernel(
    out_ptr, part_out_ptr, part_m_ptr, part_l_ptr, query_start_loc_ptr, stride_ot, stride_oh,
    NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
    NUM_SEGMENTS: tl.constexpr, SEGMENTS_PAD: tl.constexpr,
):  # fmt: skip
    """One query head of one decode: its segments' states merged by log-sum-exp."""
    seq = tl.program_id(0)
    head = tl.program_id(1)
    segments = tl.arange(0, SEGMENTS_PAD)
    present = segments < NUM_SEGMENTS
    part = (seq.to(tl.int64) * NUM_HEADS + head) * NUM_SEGMENTS + segments
    m = tl.load(part_m_ptr + part, mask=present, other=float("-inf"))
    l_s = tl.load(part_l_ptr + part, mask=present, other=0.0)
    m_max = tl.max(m, axis=0)
    # Every segment empty (a padding row): m_max is -inf, and exp2(-inf - -inf) would be NaN.
    weight = tl.exp2(m - tl.where(m_max == float("-inf"), 0.0, m_max))
    total = tl.sum(l_s * weight, axis=0)
    dims = tl.arange(0, HEAD_DIM_PAD)
    mask = (present & (l_s > 0.0))[:, None] & (dims[None, :] < HEAD_DIM)
    acc = tl.load(part_out_ptr + part[:, None] * HEAD_DIM + dims[None, :], mask=mask, other=0.0)
    out = tl.sum(acc * weight[:, None], axis=0) / tl.where(total == 0.0, 1.0, total)
    token = tl.load(query_start_loc_ptr + seq).to(tl.int64)
    o_offsets = token * stride_ot + head * stride_oh + dims
    tl.store(out_ptr + o_offsets, out.to(out_ptr.dtype.element_ty), mask=dims < HEAD_DIM)


def kv_groups(num_kv_heads: int, queries_per_kv: int) -> int:
    """How many kv heads one program takes: as many as fill ROWS rows with their query heads (a
    power of two dividing num_kv_heads, MAX_GROUPS at most), 1 where one kv head's heads fill them."""
    groups = 1
    while groups < MAX_GROUPS and groups * 2 * queries_per_kv <= ROWS and num_kv_heads % (groups * 2) == 0:
        groups *= 2
    return groups


@functools.cache
def _multiprocessors(device: torch.device) -> int:
    if device.type == "cuda" and torch.cuda.is_available():
        return int(torch.cuda.get_device_properties(device).multi_processor_count)
    return DEFAULT_SMS


def target_programs(device: torch.device) -> int:
    """The programs a decode launch aims for, from the device's size (a host property)."""
    return PROGRAMS_PER_SM * _multiprocessors(device)


def num_segments(programs: int, max_seq_len: int, target: int, floor: int = SEGMENT_FLOOR) -> int:
    """Segments per program of `programs` (sequences x kv-head groups) for contexts up to
    `max_seq_len`: 1 where the programs already fill `target` or contexts are short, else as many as
    fill it, each segment of at least `floor` keys. So programs x segments <= target when split."""
    return max(1, min(MAX_SEGMENTS, target // max(programs, 1), triton.cdiv(max_seq_len, floor)))


class DecodeScratch:
    """The float32 partial states of split decodes, allocated at the first split at the largest any
    split of that device and shape can need (`num_segments` bounds it), then reused: a graph
    captured over it and a step run eagerly read the same memory, and no step allocates."""

    def __init__(self) -> None:
        self._buffer: torch.Tensor | None = None

    def take(self, partials: int, head_dim: int, bound: int, device: torch.device) -> list[torch.Tensor]:
        """Views [partials, head_dim], [partials], [partials] of the buffer."""
        need = partials * (head_dim + 2)
        if self._buffer is None or self._buffer.numel() < need or self._buffer.device != device:
            size = max(need, bound * (head_dim + 2))
            self._buffer = torch.empty(size, dtype=torch.float32, device=device)
        values = self._buffer[: partials * head_dim].view(partials, head_dim)
        m, l_s = self._buffer[partials * head_dim : need].view(2, partials).unbind(0)
        return [values, m, l_s]


def paged_decode(
    batch: PagedBatch,
    num_seqs: int,
    max_seq_len: int,
    scale: float,
    scratch: DecodeScratch,
    variant: tile.KernelVariant = tile.PLAIN_KERNEL,
    segments: int | None = None,
    segment_floor: int = SEGMENT_FLOOR,
) -> None:
    """Attend the step's decodes, its sequences 0 .. num_seqs - 1 (one query token each).
    `max_seq_len`: a host bound on their context lengths; `segments`: the split, else chosen by
    `num_segments`; `segment_floor`: the fewest keys of a segment (tests split short contexts)."""
    if num_seqs == 0:
        return
    num_heads, head_dim = batch.query.shape[1:]
    queries_per_kv = batch.queries_per_kv
    groups = kv_groups(batch.k_cache.shape[2], queries_per_kv)
    programs = num_seqs * (batch.k_cache.shape[2] // groups)
    target = target_programs(batch.query.device)
    if segments is None:
        segments = num_segments(programs, max_seq_len, target, segment_floor)
    out = batch.out
    parts = [out, out, out]  # never written with one segment
    if segments > 1:
        bound = target * groups * queries_per_kv
        parts = scratch.take(num_seqs * num_heads * segments, head_dim, bound, out.device)
    common = {"NUM_HEADS": num_heads, "NUM_SEGMENTS": segments}
    _paged_decode_kernel[(num_seqs, programs // num_seqs, segments)](
        out, *parts, *batch.tensors(), qk_scale=scale * tile.LOG2E, segment_floor=segment_floor,
        QUERIES_PER_KV=queries_per_kv, GROUPS=groups, BLOCK_M=tile.pad16(groups * queries_per_kv),
        TILE=TILE_N // groups, **common, **batch.args(), **variant.args(batch.seq_lens),
    )  # fmt: skip
    if segments > 1:
        _merge_kernel[(num_seqs, num_heads)](
            out, *parts, batch.query_start_loc, out.stride(0), out.stride(1),
            HEAD_DIM=head_dim, HEAD_DIM_PAD=tile.pad16(head_dim),
            SEGMENTS_PAD=triton.next_power_of_2(segments), **common,
        )  # fmt: skip
