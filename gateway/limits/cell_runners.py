"""Whether a cell's workers can run a request of its kind (common/pooling_rules.py): a generation
model asked for embeddings, or a pooling model asked to generate, is a 400 that says so, before the
request is queued. Read from the workers each cell announces (`WorkerInfo`), again after CACHE_S; a
cell whose workers have not announced themselves yet takes the request (its batcher decides)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import msgspec
import redis.asyncio as aioredis
from starlette.applications import Starlette

from common.pooling_rules import refusal
from common.protocol import PoolingParams, WorkerInfo, decode_worker
from common.streams import cell_keys
from openai_frontend.protocol.errors import invalid_request

CACHE_S = 2.0  # how long a cell's workers are taken as read


@dataclass(slots=True)
class CellRunners:
    _cells: dict[str, tuple[float, list[WorkerInfo]]] = field(default_factory=dict)

    async def workers(self, redis: aioredis.Redis, cell: str) -> list[WorkerInfo]:
        now = time.monotonic()
        taken_at, infos = self._cells.get(cell, (float("-inf"), []))
        if now - taken_at >= CACHE_S:
            raw: Any = await redis.hvals(cell_keys(cell).workers)
            infos = []
            for data in raw:
                try:
                    infos.append(decode_worker(data))
                except msgspec.DecodeError:
                    continue
            self._cells[cell] = (now, infos)
        return infos

    async def check(
        self, redis: aioredis.Redis, cell: str, params: PoolingParams | None, num_prompt_tokens: int
    ) -> None:
        """Raise a 400 with the reason when no worker of the cell can ever run such a request."""
        infos = await self.workers(redis, cell)
        reasons = [refusal(i, i.max_num_batched_tokens, params, num_prompt_tokens) for i in infos]
        if infos and all(reasons):
            raise invalid_request(str(reasons[0]))


def cell_runners(app: Starlette) -> CellRunners:
    """The app's one CellRunners, made on first use."""
    runners = getattr(app.state, "cell_runners", None)
    if not isinstance(runners, CellRunners):
        runners = app.state.cell_runners = CellRunners()
    return runners
