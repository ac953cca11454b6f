"""GET /metrics: Prometheus text format, the gateway's own metrics plus the batcher's read from Redis."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Annotated

import redis.exceptions
from fastapi import APIRouter, Depends
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from common.metrics_schema import MetricsSnapshot
from gateway.app_state import GatewayState, get_state
from gateway.observability.batcher_collector import BatcherCollector
from gateway.observability.batcher_snapshot import read_batcher_snapshot

logger = logging.getLogger(__name__)
router = APIRouter()

# A scrape must answer even when Redis hangs; the batcher's part is then left out.
_REDIS_TIMEOUT_S = 2.0


@router.get("/metrics")
async def metrics(state: Annotated[GatewayState, Depends(get_state)]) -> Response:
    stats, snapshot = await _read_batcher(state)
    batcher = CollectorRegistry()
    batcher.register(BatcherCollector(stats, snapshot, time.time()))
    body = generate_latest(state.metrics.registry) + generate_latest(batcher)
    return Response(body, media_type=CONTENT_TYPE_LATEST)


async def _read_batcher(state: GatewayState) -> tuple[dict[str, float] | None, MetricsSnapshot | None]:
    """Time a PING (the Redis round-trip histogram), then read the batcher's stats and snapshot."""
    try:
        async with asyncio.timeout(_REDIS_TIMEOUT_S):
            start = time.perf_counter()
            await state.redis.ping()
            state.metrics.redis_rtt.observe(time.perf_counter() - start)
            return await read_batcher_snapshot(state.redis, state.keys)
    except (redis.exceptions.RedisError, TimeoutError) as exc:
        logger.warning("metrics: cannot read the batcher's stats from redis: %s", exc or type(exc).__name__)
        return None, None
