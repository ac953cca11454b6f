"""build_input_batch: decodes longest first, grouped by context length, each group's table and mask exact."""

from __future__ import annotations

import torch

from common.protocol import SamplingParams
from gpu_worker.input_batch import ScheduledRequest, build_input_batch
from gpu_worker.kv_cache import KVCache
from gpu_worker.request_state import RequestState

BLOCK_SIZE = 4


def _decode(req_id: str, context_len: int, first_block: int) -> ScheduledRequest:
    """A request whose next step computes its last known token: context_len - 1 are cached."""
    num_blocks = -(-context_len // BLOCK_SIZE)
    state = RequestState(
        req_id=req_id,
        token_ids=list(range(3, 3 + context_len)),
        num_prompt_tokens=context_len - 1,
        sampling_params=SamplingParams(max_tokens=8),
        block_ids=list(range(first_block, first_block + num_blocks)),
        num_computed_tokens=context_len - 1,
        attempt=0,
    )
    return ScheduledRequest(state=state, num_tokens=1)


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
    batch = build_input_batch(requests, _cache(), torch.device("cpu"), group_decodes=True)

    assert [r.state.req_id for r in batch.scheduled] == ["a", "c", "e", "d", "f", "b"]
    groups = batch.attn_metadata.decodes
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
    assert batch.attn_metadata.slot_mapping.tolist() == [39, 80 + 36, 160 + 32, 120 + 15, 200 + 14, 40 + 7]


def test_one_group_when_grouping_is_off() -> None:
    requests = [_decode("long", 40, 0), _decode("short", 5, 20)]
    batch = build_input_batch(requests, _cache(), torch.device("cpu"), group_decodes=False)
    (group,) = batch.attn_metadata.decodes
    assert (group.start, group.end) == (0, 2)
    assert group.block_tables.tolist()[1] == [20, 21] + [0] * 8
