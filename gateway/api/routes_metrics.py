"""GET /metrics: Prometheus text format, the gateway's own metrics plus the batcher's read from Redis."""

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
async def metrics(state: State) -> Response:
    readings = await _read_cells(state)
    batcher = CollectorRegistry()
    # The `cbserve:` batcher metrics show CBSERVE_CELL (the first reading), as before cells.
    own = readings[0] if readings else CellReading(state.settings.cell, {}, None)
    batcher.register(BatcherCollector(dict(own.stats) if readings else None, own.snapshot, time.time()))
    batcher.register(CellCollector(state.served.rules.name, readings))
    body = state.metrics.exposition() + generate_latest(batcher)
    return Response(body, media_type=CONTENT_TYPE_LATEST)


def metric_cells(state: GatewayState) -> list[str]:
    """CBSERVE_CELL, then the other cells this gateway places requests in."""
    return list(dict.fromkeys([state.settings.cell, *state.router.cells]))


async def _read_cells(state: GatewayState) -> list[CellReading]:
    """Time a PING (the Redis round-trip histogram), then read every cell's stats and snapshot
    concurrently (each cell's keys are in its own slot); empty when Redis cannot be read."""
    try:
        async with asyncio.timeout(_REDIS_TIMEOUT_S):
            start = time.perf_counter()
            await state.redis.ping()
            state.metrics.redis_rtt.observe(time.perf_counter() - start)
            await state.router.refresh(state.redis)
            cells = metric_cells(state)
            read = await asyncio.gather(*(read_batcher_snapshot(state.redis, cell_keys(c)) for c in cells))
    except (redis.exceptions.RedisError, TimeoutError) as exc:
        logger.warning("metrics: cannot read the batcher's stats from redis: %s", exc or type(exc).__name__)
        return []
    return [CellReading(cell, stats, snapshot) for cell, (stats, snapshot) in zip(cells, read, strict=True)]
