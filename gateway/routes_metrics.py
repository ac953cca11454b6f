"""GET /metrics: Prometheus text format, the gateway's own metrics plus the batcher's read from Redis."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Annotated, Any

import msgspec
import redis.exceptions
from fastapi import APIRouter, Depends
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from common.metrics_schema import MetricsSnapshot, decode_snapshot
from common.streams import BATCHER_METRICS, BATCHER_STATS
from gateway.batcher_collector import BatcherCollector
from gateway.state import GatewayState, get_state

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
            pipe = state.redis.pipeline(transaction=False)
            pipe.hgetall(BATCHER_STATS)
            pipe.get(BATCHER_METRICS)
            raw_stats, raw_snapshot = await pipe.execute()
    except (redis.exceptions.RedisError, TimeoutError) as exc:
        logger.warning("metrics: cannot read the batcher's stats from redis: %s", exc or type(exc).__name__)
        return None, None
    return _numbers(raw_stats), _snapshot(raw_snapshot)


def _numbers(raw: dict[Any, Any]) -> dict[str, float]:
    stats: dict[str, float] = {}
    for key, value in raw.items():
        try:
            stats[key.decode() if isinstance(key, bytes) else str(key)] = float(value)
        except ValueError:
            continue  # not a number: nothing /metrics could show
    return stats


def _snapshot(raw: bytes | None) -> MetricsSnapshot | None:
    if raw is None:
        return None  # no batcher has published yet
    try:
        return decode_snapshot(raw)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        logger.warning("metrics: unreadable batcher snapshot: %s", exc)
        return None
