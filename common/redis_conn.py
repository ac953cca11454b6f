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
# Streams other than token streams are trimmed by age (MINID), never by a small MAXLEN.
STREAM_RETENTION_MS = 15 * 60 * 1000
# A finished request's token stream stays readable this long, for resuming clients.
TOKEN_STREAM_TTL_S = 15 * 60


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


def min_id(now: float | None = None) -> str:
    """The MINID below which a stream's entries are older than the retention window."""
    now_ms = int((time.time() if now is None else now) * 1000)
    return f"{max(now_ms - STREAM_RETENTION_MS, 0)}-0"


def as_str(value: bytes | str) -> str:
    """A reply of a client that leaves replies undecoded (as these do), as text."""
    return value.decode() if isinstance(value, bytes) else value


def as_bytes(value: bytes | str) -> bytes:
    return value if isinstance(value, bytes) else value.encode()
