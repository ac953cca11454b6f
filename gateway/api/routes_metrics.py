"""GET /metrics: Prometheus text format, the gateway's own metrics plus the batchers' read from Redis.

Per model: the request metrics carry `model_name`, and so do the vLLM load gauges of every cell. The
`cbserve:` batcher metrics are one cell's, the default model's home cell (gateway/app_state.py
`home_cell`), or with `?model=NAME` that model's (a Prometheus job per model passes it as a param).
"""

from __future__ import annotations

import asyncio
import logging
import time

import redis.exceptions
from fastapi import APIRouter
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from common.streams import cell_keys
from gateway.app_state import GatewayState, State
from gateway.observability.batcher_collector import BatcherCollector
from gateway.observability.batcher_snapshot import read_batcher_snapshot
from gateway.observability.cell_collector import CellCollector, CellReading

logger = logging.getLogger(__name__)
router = APIRouter()

# A scrape must answer even when Redis hangs; the batcher's part is then left out.
_REDIS_TIMEOUT_S = 2.0


@router.get("/metrics")
async def metrics(state: State, model: str | None = None) -> Response:
    home = state.home_cell(model)
    readings = await _read_cells(state, home)
    batcher = CollectorRegistry()
    # The `cbserve:` batcher metrics show the home cell (the first reading): CBSERVE_CELL with one model.
    own = readings[0] if readings else CellReading(home, {}, None)
    batcher.register(BatcherCollector(dict(own.stats) if readings else None, own.snapshot, time.time()))
    batcher.register(CellCollector(readings))
    body = state.metrics.exposition() + generate_latest(batcher)
    return Response(body, media_type=CONTENT_TYPE_LATEST)


def metric_cells(state: GatewayState, home: str) -> list[str]:
    """The home cell, then the other cells this gateway places requests in."""
    return list(dict.fromkeys([home, *state.cells]))


async def _read_cells(state: GatewayState, home: str) -> list[CellReading]:
    """Time a PING (the Redis round-trip histogram), then read every cell's stats and snapshot
    concurrently (each cell's keys are in its own slot); empty when Redis cannot be read."""
    try:
        async with asyncio.timeout(_REDIS_TIMEOUT_S):
            start = time.perf_counter()
            await state.redis.ping()
            state.metrics.redis_rtt.observe(time.perf_counter() - start)
            for router in state.routers.values():
                await router.refresh(state.redis)
            cells = metric_cells(state, home)
            read = await asyncio.gather(*(read_batcher_snapshot(state.redis, cell_keys(c)) for c in cells))
    except (redis.exceptions.RedisError, TimeoutError) as exc:
        logger.warning("metrics: cannot read the batcher's stats from redis: %s", exc or type(exc).__name__)
        return []
    model_of = {cell: name for name, router in state.routers.items() for cell in router.cells}
    # CBSERVE_CELL with one model, even when it is not among GATEWAY_CELLS.
    default = state.models.default.rules.name
    return [
        CellReading(cell, stats, snapshot, model_of.get(cell, default))
        for cell, (stats, snapshot) in zip(cells, read, strict=True)
    ]
