"""Redis clients with the timeouts every service needs, and stream-writing helpers."""

from __future__ import annotations

import time

import redis
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.retry import Retry

# Blocking reads never ask Redis to block longer than this (ms); the socket timeout stays well above it.
MAX_BLOCK_MS = 1000
SOCKET_TIMEOUT_S = 10.0
# The default retention window (CBSERVE_RETENTION_S): a finished request's token stream and keys stay
# this long (the resume window), and stream entries are trimmed by this age (MINID), never by a
# small MAXLEN. docs/reliability.md (*Retention*) lists every key and how it goes.
RETENTION_S = 15 * 60


# redis-py's own retries are off: by default it silently repeats any command (an XADD included)
# for a few seconds after a connection error, which hides a Redis restart from the batcher (it must
# rebuild its state after one) and can write a request twice. Services retry in their own code, with
# common/retry.py, where they know what is safe to repeat. A pooled connection that died with the
# old server is still replaced at checkout, so a restart costs no error once Redis is back.


def connect(url: str) -> redis.Redis:
    return redis.Redis.from_url(
        url,
        socket_timeout=SOCKET_TIMEOUT_S,
        socket_connect_timeout=5.0,
        health_check_interval=30,
        retry=Retry(NoBackoff(), 0),
    )


def connect_async(url: str) -> aioredis.Redis:
    return aioredis.Redis.from_url(
        url,
        socket_timeout=SOCKET_TIMEOUT_S,
        socket_connect_timeout=5.0,
        health_check_interval=30,
        max_connections=4096,
        retry=AsyncRetry(NoBackoff(), 0),
    )


def entry_key(entry_id: str) -> tuple[int, int]:
    """A stream entry id ("<ms>-<seq>") as a sortable pair; ValueError when it is not one."""
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def min_id(retention_s: float = RETENTION_S, now: float | None = None) -> str:
    """The MINID below which a stream's entries are older than the retention window."""
    now_ms = int((time.time() if now is None else now) * 1000)
    return f"{max(now_ms - int(retention_s * 1000), 0)}-0"


def as_str(value: bytes | str) -> str:
    """A reply of a client that leaves replies undecoded (as these do), as text."""
    return value.decode() if isinstance(value, bytes) else value


def as_bytes(value: bytes | str) -> bytes:
    return value if isinstance(value, bytes) else value.encode()
