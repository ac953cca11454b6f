"""What requests leave behind in Redis and the services: for the retention, load and soak checks."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from common import streams


def leftovers(r: redis.Redis) -> dict[str, int]:
    """Everything that must reach 0 once no request runs and a retention window has passed."""
    counts = {
        pattern: sum(1 for _ in r.scan_iter(match=pattern, count=1000))
        for pattern in streams.REQUEST_KEY_PATTERNS
    }
    for stream in (streams.REQUESTS_STREAM, streams.BATCHER_INBOX, streams.DEAD_LETTER_STREAM):
        counts[stream] = int(r.xlen(stream))
    groups: Any = r.xinfo_groups(streams.REQUESTS_STREAM) if r.exists(streams.REQUESTS_STREAM) else []
    counts["pending"] = sum(int(g["pending"]) for g in groups)
    stats = batcher_stats(r)
    for name in ("num_running", "num_waiting"):
        counts[name] = int(stats.get(name, 0))
    return counts


def batcher_stats(r: redis.Redis) -> dict[str, float]:
    raw: Any = r.hgetall(streams.BATCHER_STATS)
    return {k.decode(): float(v) for k, v in raw.items()}


def redis_memory(r: redis.Redis) -> dict[str, int]:
    """Redis's own accounting: all it allocated, the data alone, and its clients' share."""
    info: Any = r.info("memory")
    clients: Any = r.info("clients")
    return {
        "used_memory": int(info["used_memory"]),
        "used_memory_dataset": int(info["used_memory_dataset"]),
        "mem_clients_normal": int(info["mem_clients_normal"]),
        "connected_clients": int(clients["connected_clients"]),
    }


def keys_bytes(r: redis.Redis) -> int:
    """What the keys hold (MEMORY USAGE, summed): Redis's data without its clients' connections, and
    without the dashboard's step trace, which is capped by its length (BATCHER_TRACE_MAXLEN), not age."""
    keys = (k for k in r.scan_iter(count=1000) if k != streams.BATCHER_TRACE.encode())
    return sum(int(r.memory_usage(key) or 0) for key in keys)


def rss_kib(pid: int) -> int:
    """Resident memory of a process (VmRSS), in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


@dataclass
class Snapshot:
    """Memory and leftovers at one moment."""

    memory: dict[str, int]  # redis_memory()
    keys_bytes: int
    leftovers: dict[str, int]
    rss_kib: int | None  # the gateway's, when its pid is known
    trace_bytes: int  # the dashboard's step trace, capped by length

    @classmethod
    def take(cls, r: redis.Redis, gateway_pid: int | None) -> Snapshot:
        rss = rss_kib(gateway_pid) if gateway_pid else None
        trace = int(r.memory_usage(streams.BATCHER_TRACE) or 0)
        return cls(redis_memory(r), keys_bytes(r), leftovers(r), rss, trace)


def wait_cleared(r: redis.Redis, timeout_s: float) -> float | None:
    """Seconds until every leftover was gone (polled twice a second); None if some outlived `timeout_s`."""
    start = time.monotonic()
    while any(leftovers(r).values()):
        if time.monotonic() - start > timeout_s:
            return None
        time.sleep(0.5)
    return round(time.monotonic() - start, 1)
