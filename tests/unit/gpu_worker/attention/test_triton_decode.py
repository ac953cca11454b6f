"""The split decode kernel (gpu_worker/kernels/triton/paged_decode.py) against eager attention, under
Triton's interpreter: one segment and several (the merge), GQA ratios that pack several kv heads into
a program's rows and ratios that fill them alone, windows, softcapping, sinks, padding rows; and the
host-side choice of the split."""

from __future__ import annotations

import pytest
import torch

from gpu_worker.kernels.triton.paged_decode import (
    MAX_SEGMENTS,
    DecodeScratch,
    kv_groups,
    num_segments,
    paged_decode,
)
from gpu_worker.kernels.triton.paged_tile import KernelVariant, PagedBatch
from gpu_worker.runner.attention.variant import AttentionVariant, allowed_positions, eager_attention_lse
from harness.gpu_worker.paged_steps import DEVICE

HEAD_DIM = 32
BLOCK_SIZE = 16
SCALE = HEAD_DIM**-0.5
# Context lengths of one decode step: long ones over many segments, a short one that fills only the
# first, a single key, and a padding row (seq_len 0).
LENGTHS = [300, 7, 0, 1, 129]


def _step(num_kv_heads: int, queries_per_kv: int, dtype: torch.dtype) -> PagedBatch:
    generator = torch.Generator().manual_seed(1)
    width = -(-max(LENGTHS) // BLOCK_SIZE)
    num_blocks = len(LENGTHS) * width + 3
    shape = (num_blocks, BLOCK_SIZE, num_kv_heads, HEAD_DIM)
    k_cache = torch.randn(shape, generator=generator).to(DEVICE, dtype)
    v_cache = torch.randn(shape, generator=generator).to(DEVICE, dtype)
    # Shuffled blocks: every sequence's table runs through the pool out of order.
    tables = torch.randperm(num_blocks, generator=generator)[: len(LENGTHS) * width].view(len(LENGTHS), width)
    query = torch.randn(len(LENGTHS), num_kv_heads * queries_per_kv, HEAD_DIM, generator=generator)
    return PagedBatch(
        out=torch.full(query.shape, float("nan"), device=DEVICE, dtype=dtype),
        query=query.to(DEVICE, dtype),
        k_cache=k_cache,
        v_cache=v_cache,
        block_tables=tables.to(DEVICE, torch.int32),
        seq_lens=torch.tensor(LENGTHS, dtype=torch.int32, device=DEVICE),
        query_start_loc=torch.arange(len(LENGTHS) + 1, dtype=torch.int32, device=DEVICE),
    )


def _reference(batch: PagedBatch, variant: AttentionVariant) -> torch.Tensor:
    """Each decode by eager attention (transformers' arithmetic, float32) over its gathered context."""
    rows = []
    for b, length in enumerate(batch.seq_lens.tolist()):
        blocks = batch.block_tables[b].long()

        def gather(pool: torch.Tensor, blocks: torch.Tensor = blocks, length: int = length) -> torch.Tensor:
            return pool[blocks].flatten(0, 1)[:length].transpose(0, 1).unsqueeze(0)  # [1, KVH, L, D]

        mask = allowed_positions(torch.tensor([length - 1], device=DEVICE), length, variant.window)
        query = batch.query[b].float().unsqueeze(0).unsqueeze(2)  # [1, H, 1, D]
        out, _ = eager_attention_lse(
            query, gather(batch.k_cache), gather(batch.v_cache), mask, SCALE, variant
        )
        rows.append(out[0, :, 0])
    return torch.stack(rows)


def _variant(name: str, num_heads: int) -> AttentionVariant:
    sinks = torch.linspace(-1.0, 2.0, num_heads, device=DEVICE)
    return {
        "plain": AttentionVariant(),
        "window": AttentionVariant(window=100),
        "all": AttentionVariant(window=100, softcap=2.0, sinks=sinks),
        "sinks": AttentionVariant(sinks=sinks),
    }[name]


def _decode(batch: PagedBatch, variant: AttentionVariant, segments: int, scratch: DecodeScratch) -> None:
    kernel_variant = KernelVariant.of(variant.window, variant.softcap, variant.sinks)
    # No floor past a tile: short contexts split too.
    paged_decode(
        batch, len(LENGTHS), max(LENGTHS), SCALE, scratch, kernel_variant, segments, segment_floor=16
    )


# GQA 1, 4 and 8, packed (several kv heads per program) and not, a ratio that is not a power of two
# (12 of 16 rows), each over one segment and several.
@pytest.mark.parametrize(
    ("num_kv_heads", "queries_per_kv", "variant"),
    [(4, 1, "plain"), (4, 4, "all"), (2, 8, "window"), (4, 3, "sinks"), (1, 32, "plain")],
)
@pytest.mark.parametrize("segments", [1, 5])
def test_decode_matches_eager_attention(
    num_kv_heads: int, queries_per_kv: int, variant: str, segments: int
) -> None:
    batch = _step(num_kv_heads, queries_per_kv, torch.float32)
    attention_variant = _variant(variant, batch.query.shape[1])
    _decode(batch, attention_variant, segments, DecodeScratch())
    expected = _reference(batch, attention_variant)
    torch.testing.assert_close(batch.out, expected, atol=1e-5, rtol=1e-5)
    assert torch.equal(batch.out[LENGTHS.index(0)], torch.zeros_like(batch.out[0]))  # the padding row


def test_split_bfloat16() -> None:
    batch = _step(2, 4, torch.bfloat16)
    variant = _variant("all", batch.query.shape[1])
    _decode(batch, variant, 7, DecodeScratch())
    torch.testing.assert_close(batch.out.float(), _reference(batch, variant), atol=2e-2, rtol=2e-2)


def test_segments_are_merged_not_overwritten() -> None:
    """Each segment alone is a softmax over part of the context: a merge that kept one segment, or
    summed them unweighted, differs from the whole by far more than the tolerance."""
    batch = _step(2, 4, torch.float32)
    _decode(batch, AttentionVariant(), 1, DecodeScratch())
    whole = batch.out.clone()
    scratch = DecodeScratch()
    _decode(batch, AttentionVariant(), 8, scratch)
    torch.testing.assert_close(batch.out, whole, atol=1e-5, rtol=1e-5)
    values, m, l_s = scratch.take(len(LENGTHS) * batch.query.shape[1] * 8, HEAD_DIM, 0, DEVICE)
    # The 300-token decode's first head: segments of whole key tiles, the first several with keys.
    seen = int((l_s[:8] > 0).sum())
    assert seen >= 5 and bool((l_s[:seen] > 0).all()) and bool(torch.isfinite(m[:seen]).all())
    segment_out = values[:seen] / l_s[:seen, None]
    assert all((segment_out[s] - whole[0, 0]).abs().max() > 1e-2 for s in range(seen))


def test_scratch_is_allocated_once_at_its_largest() -> None:
    """A CUDA graph reads the scratch it was captured over: later steps, any batch, use the same memory."""
    scratch = DecodeScratch()
    batch = _step(2, 4, torch.float32)
    _decode(batch, AttentionVariant(), 3, scratch)
    first = scratch.take(1, HEAD_DIM, 0, DEVICE)[0].data_ptr()
    for segments in (2, 5):
        _decode(batch, AttentionVariant(), segments, scratch)
        assert scratch.take(1, HEAD_DIM, 0, DEVICE)[0].data_ptr() == first


def test_segments_past_a_short_context_read_nothing() -> None:
    """A graph captured for long contexts replays its segment count over short ones: the segments
    past the context write no values, and the merge reads none of theirs (here NaN, which would
    spread through any weighted sum)."""
    scratch = DecodeScratch()
    batch = _step(2, 4, torch.float32)
    _decode(batch, AttentionVariant(), 8, scratch)  # allocates the scratch
    scratch.take(len(LENGTHS) * batch.query.shape[1] * 8, HEAD_DIM, 0, DEVICE)[0].fill_(float("nan"))
    batch.seq_lens.copy_(torch.tensor([20, 7, 0, 1, 3]))
    variant = _variant("sinks", batch.query.shape[1])
    _decode(batch, variant, 8, scratch)
    torch.testing.assert_close(batch.out, _reference(batch, variant), atol=1e-5, rtol=1e-5)


def test_num_segments_from_host_sizes() -> None:
    target = 512
    assert num_segments(programs=1, max_seq_len=60, target=target) == 1  # a short context
    assert num_segments(programs=600, max_seq_len=100_000, target=target) == 1  # the GPU is full
    assert num_segments(programs=1, max_seq_len=100_000, target=target) == MAX_SEGMENTS
    for programs in range(1, 700, 7):
        for max_seq_len in (1, 64, 65, 1000, 8192, 131072):
            segments = num_segments(programs, max_seq_len, target)
            # Within the scratch's bound (target rows of programs) whenever split.
            assert segments == 1 or programs * segments <= target
            assert 1 <= segments <= max(1, -(-max_seq_len // 64))


def test_kv_groups_fill_sixteen_rows() -> None:
    assert [kv_groups(8, q) for q in (1, 2, 4, 8, 16, 32)] == [4, 4, 4, 2, 1, 1]  # 4 at most
    assert kv_groups(6, 1) == 2  # a power of two that divides the kv heads
    assert kv_groups(4, 3) == 4  # 12 rows


def _tf32(x: torch.Tensor) -> torch.Tensor:
    """float32 rounded to tf32's 10 mantissa bits, to nearest (as the GPU's cvt.rna.tf32.f32)."""
    bits = x.contiguous().view(torch.int32)
    return ((bits + 0x1000) & ~0x1FFF).view(torch.float32)


def test_three_tf32_passes_keep_the_probabilities_float32() -> None:
    """P·V on a 16-bit pool (`dot_precision`: "tf32", and three passes for P·V in paged_tile.py):
    the values are exact in tf32, so the products lose only the bits of p past 21, where one tf32
    pass (what tl.dot does by default) rounds p to 11 bits. Bounded here against float64 on the
    GPU's arithmetic, emulated (the interpreter computes the dot in float32 whatever it is told)."""
    generator = torch.Generator().manual_seed(2)
    p = torch.softmax(4 * torch.randn(64, 2048, generator=generator), dim=-1)
    v = torch.randn(2048, 128, generator=generator).bfloat16().float()
    assert torch.equal(_tf32(v), v)  # bf16 (and fp16) values pass through tf32 unchanged
    exact = p.double() @ v.double()
    scale = p.double() @ v.double().abs()  # the size of the sum each output is
    big = _tf32(p)
    one_pass = big.double() @ v.double()
    three_passes = (big.double() + _tf32(p - big).double()) @ v.double()  # + tf32(p_small) * v_small = 0
    assert ((one_pass - exact).abs() / scale).max() > 2**-13
    # Here 2^-23.4: below the float32 sum's own rounding (2^-20.2 for p @ v in float32); one pass 2^-11.6.
    assert ((three_passes - exact).abs() / scale).max() < 2**-21
