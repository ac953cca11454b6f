"""Sliding windows, logit softcapping and sinks in every attention backend, against transformers' own
eager attention: the torch backend (decode groups and prefill chunks, first and later), cascade
attention over shared heads, and the Triton kernels (under Triton's interpreter on the CPU)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from transformers.models.gemma2.modeling_gemma2 import eager_attention_forward as gemma2_eager
from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward as gpt_oss_eager

from gpu_worker.runner.attention.backend import CommonAttentionMetadata
from gpu_worker.runner.attention.torch_attn import TorchAttentionBackend
from gpu_worker.runner.attention.triton_attn import TritonAttentionBackend
from gpu_worker.runner.attention.variant import AttentionVariant
from gpu_worker.runner.input_batch import ScheduledRequest, build_input_batch
from gpu_worker.runner.kv_cache import KVCache
from harness.gpu_worker.paged_steps import DEVICE, make_step, pool, scheduled_request

NUM_KV_HEADS, QUERIES_PER_KV, HEAD_DIM = 2, 2, 32
NUM_HEADS = NUM_KV_HEADS * QUERIES_PER_KV
SCALE = HEAD_DIM**-0.5
# (cached, new) tokens: decodes of ragged lengths (one within the window), a first prompt chunk longer
# than the window, a later chunk over cached context.
SEQS = [(70, 1), (16, 1), (3, 1), (40, 1), (0, 23), (45, 19)]
SINKS = torch.tensor([1.5, -0.5, 3.0, 0.0])
# Softcap 1.5 on scores of unit-normal queries and keys bends them hard.
VARIANTS = {
    "window": AttentionVariant(window=13),
    "softcap": AttentionVariant(softcap=1.5),
    "sinks": AttentionVariant(sinks=SINKS),
    "window-softcap": AttentionVariant(window=9, softcap=1.5),
    "window-sinks": AttentionVariant(window=20, sinks=SINKS),
}


def transformers_eager(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, query_pos: torch.Tensor, variant: AttentionVariant
) -> torch.Tensor:
    """q [M, H, D] at positions `query_pos` [M] over one sequence's k/v [L, KVH, D], as Gemma 2's
    (softcap) or gpt-oss's (sinks) eager attention computes it, with transformers' sliding-window mask
    (kv > q - window) -> [M, H, D]."""
    keys = torch.arange(k.shape[0])
    allowed = keys[None, :] <= query_pos[:, None]
    if variant.window is not None:
        allowed &= keys[None, :] > query_pos[:, None] - variant.window
    mask = torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)[None, None]
    module = SimpleNamespace(num_key_value_groups=QUERIES_PER_KV, training=False, sinks=variant.sinks)
    # transformers' layout: [1, heads, tokens, head_dim].
    q, k, v = (x.transpose(0, 1).unsqueeze(0) for x in (q, k, v))
    args = (q, k, v, mask)
    if variant.sinks is not None:
        assert variant.softcap is None, "no transformers family has both"
        out, _ = gpt_oss_eager(module, *args, scaling=SCALE)
    else:
        out, _ = gemma2_eager(module, *args, scaling=SCALE, softcap=variant.softcap)
    return out[0]


def expected_step(
    kv_cache: KVCache, common: CommonAttentionMetadata, query: torch.Tensor, variant: AttentionVariant
) -> torch.Tensor:
    """Every sequence of the step through transformers' eager attention over its K/V in the pool
    (written by the step under test)."""
    out = torch.empty_like(query)
    starts, seq_lens = common.query_start_loc_cpu.tolist(), common.seq_lens_cpu.tolist()
    for seq, context_len in enumerate(seq_lens):
        start, end = starts[seq], starts[seq + 1]
        k, v = kv_cache.gather(0, common.block_tables[seq : seq + 1], torch.float32)
        positions = torch.arange(context_len - (end - start), context_len)
        k, v = k[0, :context_len].to(query.dtype), v[0, :context_len].to(query.dtype)
        out[start:end] = transformers_eager(query[start:end], k, v, positions, variant)
    return out


@pytest.mark.parametrize("group_decodes", [True, False], ids=["grouped", "one-group"])
@pytest.mark.parametrize("name", list(VARIANTS))
def test_torch_backend_equals_transformers_eager(name: str, group_decodes: bool) -> None:
    backend = TorchAttentionBackend(pool(64, 4, NUM_KV_HEADS, HEAD_DIM, torch.float32), group_decodes)
    step = make_step(backend, SEQS, num_heads=NUM_HEADS, dtype=torch.float32)
    variant = VARIANTS[name]
    metadata = backend.build_metadata(step.common)
    out = backend.forward(0, step.query, step.key, step.value, metadata, SCALE, variant)
    expected = expected_step(backend.kv_cache, step.common, step.query, variant)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    if variant.window is not None:  # blocks before the windows of long contexts were not read
        decode_reads, prefill_reads = metadata.window_reads[variant.window]
        assert prefill_reads[-1][0] > 0
        # One group holds a 4-token context, whose window starts at block 0.
        assert (decode_reads[0][0] > 0) == group_decodes
    # The variant changes the answer: the test would catch a backend that ignored it.
    plain = backend.forward(0, step.query, step.key, step.value, metadata, SCALE)
    assert not torch.allclose(plain, expected, atol=1e-3)


def test_a_window_covering_every_sequence_is_plain_attention() -> None:
    backend = TorchAttentionBackend(pool(64, 4, NUM_KV_HEADS, HEAD_DIM, torch.float32), True)
    step = make_step(backend, SEQS, num_heads=NUM_HEADS, dtype=torch.float32)
    metadata = backend.build_metadata(step.common)
    wide = backend.forward(0, step.query, step.key, step.value, metadata, SCALE, AttentionVariant(window=71))
    assert torch.equal(wide, backend.forward(0, step.query, step.key, step.value, metadata, SCALE))
    assert metadata.window_reads == {}  # dropped before any mask was built


@pytest.mark.parametrize("name", list(VARIANTS))
def test_triton_kernels_equal_transformers_eager(name: str) -> None:
    backend = TritonAttentionBackend(pool(64, 16, NUM_KV_HEADS, HEAD_DIM, torch.float32))
    step = make_step(backend, SEQS, num_heads=NUM_HEADS, dtype=torch.float32)
    variant = VARIANTS[name]
    if variant.sinks is not None:
        variant = AttentionVariant(variant.window, variant.softcap, variant.sinks.to(DEVICE))
    out = backend.forward(0, step.query, step.key, step.value, step.common, SCALE, variant)
    expected = expected_step(backend.kv_cache, step.common, step.query, variant)
    assert not out.isnan().any()
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_triton_decode_with_sinks_in_bfloat16_matches_float32() -> None:
    backend = TritonAttentionBackend(pool(64, 16, NUM_KV_HEADS, HEAD_DIM, torch.bfloat16))
    step = make_step(backend, SEQS, num_heads=NUM_HEADS, dtype=torch.bfloat16)
    variant = AttentionVariant(window=9, sinks=SINKS.to(DEVICE, torch.bfloat16))
    out = backend.forward(0, step.query, step.key, step.value, step.common, SCALE, variant)
    expected = expected_step(
        backend.kv_cache,
        step.common,
        step.query.float(),
        AttentionVariant(window=9, sinks=SINKS.to(DEVICE, torch.bfloat16).float()),
    )
    torch.testing.assert_close(out.float(), expected, atol=2e-2, rtol=2e-2)


BS = 4


def _cascade_requests() -> list[ScheduledRequest]:
    """Decodes sharing heads of 20 and 30 blocks (80 and 120 tokens, far past every window), one alone,
    and a prompt chunk over the shared head."""
    generator = torch.Generator().manual_seed(3)
    scattered = torch.randperm(200, generator=generator).tolist()
    head_a, head_b = scattered[:20], list(range(300, 330))
    return [
        scheduled_request(0, [*head_a, 400, 401], 20 * BS + 6, 1),
        scheduled_request(1, [*head_a, 402], 20 * BS + 1, 1),  # its own token starts a block
        scheduled_request(2, [*head_a[:15], 403, 404, 405], 17 * BS + 3, 1),
        scheduled_request(3, [*head_b, 406, 407], 31 * BS + 1, 1),
        scheduled_request(4, [*head_b, 409], 30 * BS + 2, 1),
        scheduled_request(5, scattered[100:110], 9 * BS + 3, 1),  # alone: no head
        scheduled_request(6, [*head_a, 410, 411], 20 * BS, 7),  # a prompt chunk over the cached head
    ]


@pytest.mark.parametrize("name", list(VARIANTS))
def test_cascade_decodes_equal_transformers_eager(name: str) -> None:
    kv_cache = pool(512, BS, NUM_KV_HEADS, HEAD_DIM, torch.float32)
    fill = torch.Generator().manual_seed(7)
    for p in (*kv_cache.k_pools, *kv_cache.v_pools):
        p.copy_(torch.randn(p.shape, generator=fill))
    backend = TorchAttentionBackend(kv_cache, group_decodes=True, cascade=True)
    common = build_input_batch(_cascade_requests(), backend, torch.device("cpu")).attn_metadata.common
    metadata = backend.build_metadata(common)
    assert metadata.cascade is not None and len(metadata.cascade.heads) == 2
    rand = torch.Generator().manual_seed(11)
    tokens = common.num_actual_tokens
    query = torch.randn(tokens, NUM_HEADS, HEAD_DIM, generator=rand)
    key = torch.randn(tokens, NUM_KV_HEADS, HEAD_DIM, generator=rand)
    value = torch.randn(tokens, NUM_KV_HEADS, HEAD_DIM, generator=rand)
    variant = VARIANTS[name]
    out = backend.forward(0, query, key, value, metadata, SCALE, variant)
    torch.testing.assert_close(out, expected_step(kv_cache, common, query, variant), atol=1e-5, rtol=1e-5)
