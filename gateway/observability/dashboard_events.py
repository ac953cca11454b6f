"""The dashboard's live data, as SSE: every step the batcher traces, and its stats once a second.

One connection replays the last steps (so a freshly opened page has a picture at once), then follows
`llm:batcher:trace` with a bounded blocking XREAD from the last id it sent: no gap between replay and
follow, and a Redis restart only pauses it. Trace entries are relayed byte for byte (they are JSON
already, common/trace_schema.py). Starlette cancels this generator when the client leaves, and the
cancelled XREAD drops its connection, so nothing keeps reading for a page that is gone.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import redis.asyncio as aioredis

from common.metrics_schema import MetricsSnapshot
from common.protocol import FIELD
from common.redis_io.redis_conn import MAX_BLOCK_MS
from common.redis_io.retry import REDIS_DOWN, Backoff
from common.spec_decode.spec_decode_stats import counts_from_stats
from common.streams import CellKeys
from gateway.observability.batcher_snapshot import read_batcher_snapshot
from gateway.streaming.sse import sse_event

# Steps replayed to a new page: the page keeps 100 per worker, so this covers a few busy workers.
REPLAY_STEPS = 400
STATS_INTERVAL_S = 1.0
# Steps relayed per read; a busy batcher's backlog drains over a few reads instead of one huge one.
READ_COUNT = 500


class WorkerStats(msgspec.Struct, kw_only=True):
    num_blocks: int
    num_free_blocks: int
    num_cached_blocks: int  # of the free ones, those holding a reusable prefix
    num_running: int


class DashboardStats(msgspec.Struct, kw_only=True):
    """Sent once a second, so the page is right when no step is being scheduled (an idle system)."""

    time: float  # the gateway's unix time now
    batcher_updated_at: float | None  # when the batcher last wrote its stats (None: never)
    num_waiting: int
    num_running: int
    snapshot_at: float | None  # when the batcher published the snapshot `workers` comes from
    workers: dict[str, WorkerStats]
    # Speculative decoding since the batcher started (None / empty: nothing drafted).
    spec_accepted_len: float | None = None  # vLLM's mean acceptance length: 1 + accepted / drafts
    spec_acceptance_rate: float | None = None  # accepted / drafted tokens
    spec_acceptance_per_pos: list[float] = msgspec.field(default_factory=list)
    spec_num_workers_off: int = 0  # workers whose drafts stopped paying (spec_decode/auto_off.py)


def dashboard_stats(stats: dict[str, float], snapshot: MetricsSnapshot | None, now: float) -> DashboardStats:
    workers = {
        wid: WorkerStats(
            num_blocks=w.num_blocks,
            num_free_blocks=w.num_free_blocks,
            num_cached_blocks=w.num_cached_blocks,
            num_running=w.num_running,
        )
        for wid, w in (snapshot.workers.items() if snapshot is not None else ())
    }
    spec = counts_from_stats(stats)
    return DashboardStats(
        time=now,
        batcher_updated_at=stats.get("updated_at"),
        num_waiting=int(stats.get("num_waiting", 0)),
        num_running=int(stats.get("num_running", 0)),
        snapshot_at=None if snapshot is None else snapshot.updated_at,
        workers=workers,
        spec_accepted_len=spec.mean_accepted_len,
        spec_acceptance_rate=spec.acceptance_rate,
        spec_acceptance_per_pos=spec.acceptance_per_pos,
        spec_num_workers_off=int(stats.get("spec_decode_num_workers_off", 0)),
    )


async def dashboard_events(redis: aioredis.Redis, keys: CellKeys) -> AsyncIterator[bytes]:
    backoff = Backoff()
    last_id = "0-0"  # an empty trace: whatever comes next is new
    replayed = False
    next_stats = 0.0
    while True:
        try:
            if not replayed:
                entries: Any = await redis.xrevrange(keys.trace, count=REPLAY_STEPS)
                for entry_id, fields in reversed(entries):
                    last_id = _s(entry_id)
                    yield _step_event(fields)
                replayed = True
            if time.monotonic() >= next_stats:
                stats, snapshot = await read_batcher_snapshot(redis, keys)
                yield sse_event(_json(dashboard_stats(stats, snapshot, time.time())), event="stats")
                next_stats = time.monotonic() + STATS_INTERVAL_S
            block_ms = max(1, min(MAX_BLOCK_MS, int((next_stats - time.monotonic()) * 1000)))
            resp: Any = await redis.xread({keys.trace: last_id}, block=block_ms, count=READ_COUNT)
            backoff.reset()
        except REDIS_DOWN as exc:
            # Redis restarting: the page says so and keeps its picture; the follow resumes from last_id.
            yield sse_event(_json({"message": f"redis unreachable ({exc})"}), event="unavailable")
            await asyncio.sleep(backoff.next_delay())
            continue
        for _, items in resp or []:
            for entry_id, fields in items:
                last_id = _s(entry_id)
                yield _step_event(fields)


def _step_event(fields: dict[bytes, bytes]) -> bytes:
    return sse_event(fields[FIELD].decode(), event="step")


_encoder = msgspec.json.Encoder()


def _json(value: object) -> str:
    return _encoder.encode(value).decode()


def _s(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
