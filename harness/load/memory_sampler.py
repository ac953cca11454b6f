"""Samples a gateway's RSS and Redis's memory while a load runs: peaks, and one row per interval."""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field

import redis

from harness.load.leftovers import redis_memory, rss_kib


@dataclass
class MemorySampler:
    redis_url: str
    gateway_pid: int | None
    period_s: float = 0.25
    row_every_s: float = 30.0  # one row of the series per this many seconds (its peaks)
    peak_rss_kib: int = 0
    peak_redis: dict[str, int] = field(default_factory=dict)
    rows: list[dict[str, float]] = field(default_factory=list)

    async def run(self, stop: asyncio.Event) -> None:
        r = redis.Redis.from_url(self.redis_url)
        start = time.monotonic()
        row: dict[str, float] = {}
        while not stop.is_set():
            mem = await asyncio.to_thread(redis_memory, r)
            rss = rss_kib(self.gateway_pid) if self.gateway_pid is not None else 0
            for key, value in mem.items():
                self.peak_redis[key] = max(self.peak_redis.get(key, 0), value)
            self.peak_rss_kib = max(self.peak_rss_kib, rss)
            elapsed = time.monotonic() - start
            if row and elapsed >= row["t_s"] + self.row_every_s:
                self.rows.append(row)
                row = {}
            row.setdefault("t_s", round(elapsed))
            row["gateway_rss_mib"] = max(row.get("gateway_rss_mib", 0.0), round(rss / 1024, 1))
            row["redis_used_mib"] = max(row.get("redis_used_mib", 0.0), round(mem["used_memory"] / 2**20, 2))
            # The gateway's pool keeps a connection per peak concurrent command: its RSS follows them.
            row["redis_clients"] = max(row.get("redis_clients", 0), mem["connected_clients"])
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.period_s)
        if row:
            self.rows.append(row)
