"""Every held request's block ids in one persistent host tensor, a row each (vLLM v1's BlockTable).

A step's block table used to be built from every scheduled request's whole list of block ids, which
costs as much as the contexts are long, each step. Here a request's row is written when it arrives
and then only with the blocks it gained, and a step reads its rows with one gather.

The runner's `CachedRequestState.block_ids` stay the truth; `sync` brings rows up to them, and the
runner says when a list is cut back (`truncate`, on a rolled-back step) or dropped (`remove`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from gpu_worker.runner.cached_request_state import CachedRequestState

Blocks = np.ndarray[Any, np.dtype[Any]]


@dataclass(slots=True)
class _Row:
    index: int
    num_synced: int  # how many of the request's block ids the row holds


class BlockTable:
    def __init__(self, max_num_reqs: int = 8, max_num_blocks_per_req: int = 64) -> None:
        self.table = torch.zeros((max(1, max_num_reqs), max(1, max_num_blocks_per_req)), dtype=torch.int32)
        self._rows: dict[str, _Row] = {}
        self._free = list(range(self.table.shape[0] - 1, -1, -1))

    def sync(self, states: Sequence[CachedRequestState]) -> list[int]:
        """Each state's row, written up to its block ids; rows in `states`' order."""
        rows = []
        for state in states:
            row = self._rows.get(state.req_id)
            if row is None:
                row = self._rows[state.req_id] = _Row(self._take_row(), 0)
            num_blocks = len(state.block_ids)
            if num_blocks != row.num_synced:
                self._write(row, state.block_ids)
            rows.append(row.index)
        return rows

    def gather(
        self, rows: list[int], num_blocks: Sequence[int] | Blocks, out: Blocks | None = None
    ) -> Blocks:
        """[len(rows), max(num_blocks)] int32 numpy: each row's first `num_blocks` ids, padded with
        block 0 (what the row holds past them may be blocks another request holds now); written into
        `out` (a step's persistent buffer) when given."""
        counts = np.asarray(num_blocks, dtype=np.int64)
        width = int(counts.max(initial=0))
        if out is None:
            out = np.empty((len(rows), width), dtype=np.int32)
        out[:] = self.table.numpy()[rows, :width]
        out[np.arange(width) >= counts[:, None]] = 0
        return out

    def truncate(self, req_id: str, num_blocks: int) -> None:
        row = self._rows.get(req_id)
        if row is not None:
            row.num_synced = min(row.num_synced, num_blocks)

    def remove(self, req_id: str) -> None:
        row = self._rows.pop(req_id, None)
        if row is not None:
            self._free.append(row.index)

    def clear(self) -> None:
        self._rows.clear()
        self._free = list(range(self.table.shape[0] - 1, -1, -1))

    def _write(self, row: _Row, block_ids: list[int]) -> None:
        num_blocks = len(block_ids)
        if num_blocks > self.table.shape[1]:
            self._grow(self.table.shape[0], max(num_blocks, 2 * self.table.shape[1]))
        if num_blocks > row.num_synced:
            new = block_ids[row.num_synced :]
            self.table[row.index, row.num_synced : num_blocks] = torch.tensor(new, dtype=torch.int32)
        row.num_synced = num_blocks

    def _take_row(self) -> int:
        if not self._free:
            old = self.table.shape[0]
            self._grow(2 * old, self.table.shape[1])
            self._free = list(range(2 * old - 1, old - 1, -1))
        return self._free.pop()

    def _grow(self, num_rows: int, num_cols: int) -> None:
        grown = torch.zeros((num_rows, num_cols), dtype=torch.int32)
        grown[: self.table.shape[0], : self.table.shape[1]] = self.table
        self.table = grown
