"""Cascade attention in the torch backend: which decodes share a head (hand-built block tables), and
the step's output with it against the per-decode path on the same pool."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from gpu_worker.runner.attention.cascade import SharedHead, plan_heads
from gpu_worker.runner.attention.torch_attn import TorchAttentionBackend, TorchAttentionMetadata
from gpu_worker.runner.input_batch import ScheduledRequest, build_input_batch
from gpu_worker.settings import WorkerSettings
from harness.gpu_worker.paged_steps import pool, scheduled_request

BS = 16


def test_decodes_sharing_leading_blocks_share_a_head() -> None:
    shared = [9, 3, 7, 1, 12, 4, 8, 2, 30, 31]
    tables = [[*shared, 40, 41], [*shared, 50], [*shared[:9], 60, 61]]
    heads = plan_heads(tables, [12 * BS - 5, 11 * BS, 11 * BS - 1], BS, 8)
    # The third diverges at block 9: the head is the 9 blocks all three hold.
    assert heads == [SharedHead(rows=[0, 1, 2], blocks=shared[:9])]
    assert not heads[0].contiguous  # gathered once


def test_head_leaves_each_decode_its_own_last_token() -> None:
    # Two choices of one prompt at a block boundary: their whole tables are equal, but the last block
    # holds the token each is computing now, so it stays out of the head.
    table = list(range(20, 30))
    heads = plan_heads([table, table], [10 * BS, 10 * BS], BS, 8)
    assert heads == [SharedHead(rows=[0, 1], blocks=table[:9])]
    assert heads[0].contiguous  # read in place


def test_a_decode_sharing_nothing_has_no_head() -> None:
    tables = [list(range(100, 115)), [7, 3, 9, 1, 12, 4, 8, 2, 30, 31, 33]]
    # Reading its own blocks in place would gain nothing over gathering them (docs/benchmarks.md).
    assert plan_heads(tables, [15 * BS, 11 * BS], BS, 8) == []


def test_short_heads_are_not_worth_a_second_read() -> None:
    tables = [[*list(range(8)), 20], [*list(range(8)), 21]]
    # Eight blocks, but the eighth holds each decode's own token.
    assert plan_heads(tables, [8 * BS, 8 * BS], BS, 8) == []
    assert plan_heads(tables, [8 * BS + 1, 8 * BS + 1], BS, 8) == [SharedHead([0, 1], list(range(8)))]


def test_a_head_with_the_right_ends_but_a_hole_is_not_contiguous() -> None:
    # Freed blocks come back in reverse order, so a run's first and last block can match by chance.
    assert not SharedHead(rows=[0, 1], blocks=[100, *range(57, 63), 107]).contiguous
    assert SharedHead(rows=[0, 1], blocks=list(range(57, 65))).contiguous


def _cascade_against_plain(
    requests: list[ScheduledRequest], queries_per_kv: int, group_decodes: bool, dtype: torch.dtype
) -> tuple[TorchAttentionMetadata, torch.Tensor, torch.Tensor]:
    """Both decode paths over the same random pool and step: (cascade metadata, its output, plain output)."""
    num_kv_heads, head_dim = 2, 32
    contexts = []
    for cascade in (True, False):
        kv_cache = pool(512, BS, num_kv_heads, head_dim, dtype)
        fill = torch.Generator().manual_seed(7)  # the same pool for both backends
        for p in (*kv_cache.k_pools, *kv_cache.v_pools):
            p.copy_(torch.randn(p.shape, generator=fill))
        backend = TorchAttentionBackend(kv_cache, group_decodes, cascade=cascade)
        common = build_input_batch(requests, backend, torch.device("cpu")).attn_metadata.common
        contexts.append((backend, common))
    (cascade_backend, common), (plain_backend, _) = contexts
    metadata = cascade_backend.build_metadata(common)
    tokens = common.num_actual_tokens
    rand = torch.Generator().manual_seed(11)
    query = torch.randn(tokens, num_kv_heads * queries_per_kv, head_dim, generator=rand).to(dtype)
    key = torch.randn(tokens, num_kv_heads, head_dim, generator=rand).to(dtype)
    value = torch.randn(tokens, num_kv_heads, head_dim, generator=rand).to(dtype)
    out = cascade_backend.forward(0, query, key, value, metadata, scale=head_dim**-0.5)
    expected = plain_backend.forward(
        0, query, key, value, plain_backend.build_metadata(common), scale=head_dim**-0.5
    )
    return metadata, out, expected


def test_a_head_whose_ends_look_consecutive_is_gathered() -> None:
    head = [100, *range(57, 63), 107]  # 100 and 107 are seven apart over eight blocks
    requests = [
        scheduled_request(0, [*head, 400, 401, 404], 10 * BS + 5, 1),
        scheduled_request(1, [*head, 402, 403, 405], 10 * BS + 2, 1),
    ]
    metadata, out, expected = _cascade_against_plain(requests, 2, True, torch.float32)
    assert metadata.cascade is not None and metadata.cascade.heads[0].block_table is not None
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("queries_per_kv", [1, 4])
def test_cascade_step_in_bfloat16_matches_per_decode_path(queries_per_kv: int) -> None:
    head = list(range(300, 330))
    requests = [
        scheduled_request(0, [*head, 406, 407], 31 * BS + 1, 1),
        scheduled_request(1, [*head, 409], 30 * BS + 7, 1),
        scheduled_request(2, [*head[:12], 410], 12 * BS + 3, 1),
    ]
    metadata, out, expected = _cascade_against_plain(requests, queries_per_kv, True, torch.bfloat16)
    assert metadata.cascade is not None and metadata.cascade.heads
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, expected, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("queries_per_kv", [1, 4])
@pytest.mark.parametrize("group_decodes", [True, False])
def test_cascade_step_matches_per_decode_path(queries_per_kv: int, group_decodes: bool) -> None:
    generator = torch.Generator().manual_seed(queries_per_kv)
    scattered = torch.randperm(200, generator=generator).tolist()
    head_a = scattered[:20]  # shared by decodes 0-2, not consecutive: gathered once
    head_b = list(range(300, 330))  # shared by decodes 3-4, consecutive: read in place
    requests = [
        scheduled_request(0, [*head_a, 400, 401], 20 * BS + 20, 1),
        scheduled_request(1, [*head_a, 402], 20 * BS + 3, 1),
        scheduled_request(2, [*head_a[:15], 403, 404, 405], 17 * BS + 9, 1),
        scheduled_request(3, [*head_b, 406, 407, 408], 32 * BS + 1, 1),
        scheduled_request(4, [*head_b, 409], 30 * BS + 7, 1),
        scheduled_request(5, list(range(200, 240)), 39 * BS + 2, 1),  # alone: no head
        scheduled_request(6, scattered[100:110], 9 * BS + 15, 1),  # alone, scattered
        scheduled_request(7, scattered[120:123], 2 * BS + 1, 1),  # too short for a head
        scheduled_request(8, [*head_a, 410, 411], 20 * BS, 23),  # a prompt chunk over the cached head
    ]
    metadata, out, expected = _cascade_against_plain(requests, queries_per_kv, group_decodes, torch.float32)
    assert metadata.cascade is not None
    # Decodes come longest first: 5, 3, 4, 0, 1, 2, 6, 7.
    assert sorted(h.rows.tolist() for h in metadata.cascade.heads) == [[1, 2], [3, 4, 5]]
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_cascade_attention_is_cpu_only() -> None:
    assert WorkerSettings(model="m").resolved_cascade_attention
    assert not WorkerSettings(model="m", cascade_attention=False).resolved_cascade_attention
    assert not WorkerSettings(model="m", device="cuda").resolved_cascade_attention
    with pytest.raises(ValidationError, match="WORKER_CASCADE_ATTENTION"):
        WorkerSettings(model="m", device="cuda", cascade_attention=True)
