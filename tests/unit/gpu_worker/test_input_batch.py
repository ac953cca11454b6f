"""build_input_batch: decodes longest first, grouped by context length, each group's table and mask exact."""

from __future__ import annotations

from typing import Any

import torch

from common.protocol import SamplingParams
from gpu_worker.runner.attention.torch_attn import TorchAttentionBackend
from gpu_worker.runner.cached_request_state import CachedRequestState
from gpu_worker.runner.input_batch import InputBatch, ScheduledRequest, build_input_batch
from gpu_worker.runner.kv_cache import KVCache
from gpu_worker.runner.step_input_buffers import StepInputBuffers

BLOCK_SIZE = 4


def _decode(req_id: str, context_len: int, first_block: int) -> ScheduledRequest:
    """A request whose next step computes its last known token: context_len - 1 are cached."""
    num_blocks = -(-context_len // BLOCK_SIZE)
    state = CachedRequestState(
        req_id=req_id,
        token_ids=list(range(3, 3 + context_len)),
        num_prompt_tokens=context_len - 1,
        sampling_params=SamplingParams(max_tokens=8),
        block_ids=list(range(first_block, first_block + num_blocks)),
        num_computed_tokens=context_len - 1,
        attempt=0,
    )
    return ScheduledRequest(state=state, num_tokens=1)


def _prompt_chunk(req_id: str, computed: int, num_tokens: int, blocks: list[int]) -> ScheduledRequest:
    """A 9-token prompt of which `computed` are cached and `num_tokens` run this step."""
    state = CachedRequestState(
        req_id=req_id,
        token_ids=list(range(9)),
        num_prompt_tokens=9,
        sampling_params=SamplingParams(),
        block_ids=blocks,
        num_computed_tokens=computed,
        attempt=0,
    )
    return ScheduledRequest(state=state, num_tokens=num_tokens)


def _backend(group_decodes: bool) -> TorchAttentionBackend:
    return TorchAttentionBackend(_cache(), group_decodes=group_decodes)


def _cache() -> KVCache:
    return KVCache.allocate(
        num_layers=1,
        num_blocks=64,
        block_size=BLOCK_SIZE,
        num_kv_heads=1,
        head_dim=2,
        dtype=torch.float32,
        device=torch.device("cpu"),
    )


def test_decodes_group_by_length_longest_first() -> None:
    # Context lengths 40 (10 blocks), 8 (2), 37 (10), 16 (4), 33 (9), 15 (4).
    lengths = {"a": 40, "b": 8, "c": 37, "d": 16, "e": 33, "f": 15}
    requests = [_decode(name, n, first_block=10 * i) for i, (name, n) in enumerate(lengths.items())]
    batch = build_input_batch(requests, _backend(group_decodes=True), torch.device("cpu"))

    assert [r.state.req_id for r in batch.scheduled] == ["a", "c", "e", "d", "f", "b"]
    groups = batch.attn_metadata.metadata.decodes
    # 10 and 9 blocks share a group; 4 blocks is under 0.8 x 10; 2 is under 0.8 x 4.
    assert [(g.start, g.end) for g in groups] == [(0, 3), (3, 5), (5, 6)]
    assert [tuple(g.block_tables.shape) for g in groups] == [(3, 10), (2, 4), (1, 2)]
    # Padding uses block 0 and the mask hides it; a group whose tables are all full needs no mask.
    assert groups[0].block_tables[2].tolist() == [*range(40, 49), 0]
    assert groups[0].mask is not None
    assert groups[0].mask[:, 0, 0].sum(dim=1).tolist() == [40, 37, 33]
    assert groups[1].mask is not None and groups[1].mask[:, 0, 0].sum(dim=1).tolist() == [16, 15]
    assert groups[2].mask is None
    # Each token still goes to its own slot (first block x 4 + position) and position.
    assert batch.position_ids[0].tolist() == [39, 36, 32, 15, 14, 7]
    assert batch.attn_metadata.common.slot_mapping.tolist() == [
        39,
        80 + 36,
        160 + 32,
        120 + 15,
        200 + 14,
        40 + 7,
    ]


def test_one_group_when_grouping_is_off() -> None:
    requests = [_decode("long", 40, 0), _decode("short", 5, 20)]
    batch = build_input_batch(requests, _backend(group_decodes=False), torch.device("cpu"))
    (group,) = batch.attn_metadata.metadata.decodes
    assert (group.start, group.end) == (0, 2)
    assert group.block_tables.tolist()[1] == [20, 21] + [0] * 8


def test_common_metadata_of_decodes_and_chunks() -> None:
    # A decode over 6 tokens, a first chunk of 5 and a later chunk of 3 starting mid-block at 6.
    decode = _decode("d", 7, first_block=20)
    first = _prompt_chunk("p", computed=0, num_tokens=5, blocks=[7, 3, 9])
    later = _prompt_chunk("c", computed=6, num_tokens=3, blocks=[30, 12, 5])
    batch = build_input_batch([first, later, decode], _backend(group_decodes=True), torch.device("cpu"))
    common = batch.attn_metadata.common
    assert [r.state.req_id for r in batch.scheduled] == ["d", "p", "c"]
    assert common.query_start_loc.tolist() == [0, 1, 6, 9]
    assert common.query_start_loc.dtype == common.seq_lens.dtype == common.block_tables.dtype == torch.int32
    assert common.seq_lens.tolist() == [7, 5, 9]
    # Only the blocks covering each context, padded with block 0.
    assert common.block_tables.tolist() == [[20, 21, 0], [7, 3, 0], [30, 12, 5]]
    assert (common.num_decodes, common.num_actual_tokens, common.max_query_len, common.max_seq_len) == (
        1,
        9,
        5,
        9,
    )
    assert batch.position_ids[0].tolist() == [6, 0, 1, 2, 3, 4, 6, 7, 8]
    assert common.slot_mapping.tolist() == [86, 28, 29, 30, 31, 12, 50, 51, 20]
    assert batch.input_ids[0].tolist() == [9, 0, 1, 2, 3, 4, 6, 7, 8]
    # "p" has more prompt to go: only "d" and "c" sample, at their last tokens.
    assert [r.state.req_id for r in batch.sampling_reqs] == ["d", "c"]
    assert batch.logits_indices.tolist() == [0, 8]


def test_empty_step() -> None:
    # A step that only frees requests schedules nothing; its batch is empty but well typed.
    batch = build_input_batch([], _backend(group_decodes=True), torch.device("cpu"))
    common = batch.attn_metadata.common
    assert batch.input_ids.shape == (1, 0) and batch.position_ids.dtype == torch.long
    assert common.query_start_loc.tolist() == [0] and common.num_reqs == 0
    assert batch.logits_indices.numel() == 0 and batch.scheduled == []


def _tensors(batch: InputBatch) -> dict[str, list[Any]]:
    common = batch.attn_metadata.common
    fields = {
        "input_ids": batch.input_ids,
        "position_ids": batch.position_ids,
        "logits_indices": batch.logits_indices,
        "slot_mapping": common.slot_mapping,
        "query_start_loc": common.query_start_loc,
        "seq_lens": common.seq_lens,
        "block_tables": common.block_tables,
    }
    return {name: t.tolist() for name, t in fields.items()}


def test_persistent_buffers_hold_each_step_exactly() -> None:
    """Steps written over the last one's buffers (a long request's rows, then shorter ones and a
    chunk in its place) read as the same step built alone."""
    steps = [
        [_decode("a", 40, 0), _decode("b", 8, 10)],
        [_decode("b", 9, 10), _prompt_chunk("p", computed=0, num_tokens=5, blocks=[7, 3, 9])],
        [_decode("c", 3, 30)],
        [],
        [_prompt_chunk("q", computed=6, num_tokens=3, blocks=[30, 12, 5]), _decode("a", 41, 0)],
    ]
    backend = _backend(group_decodes=True)
    buffers = StepInputBuffers(2, 6, 3, torch.device("cpu"))  # grown by the first step
    for requests in steps:
        alone = _tensors(build_input_batch(requests, backend, torch.device("cpu")))
        kept = _tensors(build_input_batch(requests, backend, torch.device("cpu"), buffers=buffers))
        assert kept == alone
