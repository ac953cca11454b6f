"""Reading what the batcher publishes about itself: its stats hash and its metrics snapshot.

`/metrics` and the dashboard's stats events read the same two keys in one round trip.
"""

from __future__ import annotations

import logging
from typing import Any

import msgspec
import redis.asyncio as aioredis

from common.metrics_schema import MetricsSnapshot, decode_snapshot
from common.streams import CellKeys

logger = logging.getLogger(__name__)


async def read_batcher_snapshot(
    redis: aioredis.Redis, keys: CellKeys
) -> tuple[dict[str, float], MetricsSnapshot | None]:
    """The cell's stats hash as numbers, and its snapshot (None before a batcher published one)."""
    pipe = redis.pipeline(transaction=False)
    pipe.hgetall(keys.stats)
    pipe.get(keys.metrics)
    raw_stats, raw_snapshot = await pipe.execute()
    return _numbers(raw_stats), _snapshot(raw_snapshot)


def _numbers(raw: dict[Any, Any]) -> dict[str, float]:
    stats: dict[str, float] = {}
    for key, value in raw.items():
        try:
            stats[key.decode() if isinstance(key, bytes) else str(key)] = float(value)
        except ValueError:
            continue  # not a number: nothing a reader could show
    return stats


def _snapshot(raw: bytes | None) -> MetricsSnapshot | None:
    if raw is None:
        return None  # no batcher has published yet
    try:
        return decode_snapshot(raw)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        logger.warning("unreadable batcher metrics snapshot: %s", exc)
        return None
