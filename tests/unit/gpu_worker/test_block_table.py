"""The runner's persistent block table: a step's rows equal its requests' block ids, whatever
happened to them since the last step (grown, cut back by a rolled-back step, dropped, new)."""

from __future__ import annotations

import torch

from common.protocol import SamplingParams
from gpu_worker.runner.block_table import BlockTable
from gpu_worker.runner.cached_request_state import CachedRequestState


def _state(req_id: str, block_ids: list[int]) -> CachedRequestState:
    return CachedRequestState(
        req_id=req_id,
        token_ids=[1],
        num_prompt_tokens=1,
        sampling_params=SamplingParams(),
        block_ids=block_ids,
        num_computed_tokens=0,
        attempt=0,
    )


def _read(table: BlockTable, states: list[CachedRequestState]) -> list[list[int]]:
    lengths = [len(s.block_ids) for s in states]
    return table.gather(table.sync(states), lengths).tolist()


def _expected(states: list[CachedRequestState]) -> list[list[int]]:
    width = max(len(s.block_ids) for s in states)
    return [s.block_ids + [0] * (width - len(s.block_ids)) for s in states]


def test_rows_follow_growth_rollback_and_reuse() -> None:
    table = BlockTable(max_num_reqs=2, max_num_blocks_per_req=2)
    a, b = _state("a", [5, 6]), _state("b", [9])
    assert _read(table, [a, b]) == [[5, 6], [9, 0]]
    a.block_ids.extend([7, 8, 11])  # past the table's width: it grows
    assert _read(table, [b, a]) == [[9, 0, 0, 0, 0], [5, 6, 7, 8, 11]]
    # A rolled-back step cuts a back; the next step gives it other blocks at the same places.
    del a.block_ids[2:]
    table.truncate("a", 2)
    a.block_ids.extend([20, 21, 22])
    assert _read(table, [a]) == [[5, 6, 20, 21, 22]]
    # b is dropped and its row goes to c, which must not see b's blocks; more requests than rows.
    table.remove("b")
    others = [_state(f"r{i}", [30 + i] * (i % 3 + 1)) for i in range(5)]
    c = _state("c", [40])
    states = [c, a, *others]
    assert _read(table, states) == _expected(states)


def test_a_table_made_for_one_step_reads_the_same() -> None:
    states = [_state("a", [3, 4, 5]), _state("b", [8])]
    persistent = BlockTable(1, 1)
    _read(persistent, states)
    states[1].block_ids.append(2)
    one_step = BlockTable(len(states), 0)
    assert _read(persistent, states) == _read(one_step, states) == _expected(states)
    assert persistent.table.dtype == torch.int32
