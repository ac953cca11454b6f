"""Redis clients with the timeouts every service needs, and stream-writing helpers."""

from __future__ import annotations

import time
from typing import Any, cast
from urllib.parse import unquote

import redis
import redis.asyncio as aioredis
import redis.asyncio.cluster as aiocluster
import redis.cluster
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.maint_notifications import MaintNotificationsConfig
from redis.retry import Retry

from common.settings import RETENTION_S

# Blocking reads never ask Redis to block longer than this (ms); the socket timeout stays well above it.
MAX_BLOCK_MS = 1000
SOCKET_TIMEOUT_S = 10.0


# redis-py's own retries are off: by default it silently repeats any command (an XADD included)
# for a few seconds after a connection error, which hides a Redis restart from the batcher (it must
# rebuild its state after one) and can write a request twice. Services retry in their own code, with
# common/redis_io/retry.py, where they know what is safe to repeat.
#
# Dead pooled connections are replaced instead, so a restart costs no error once Redis is back:
# - on checkout, a socket the old server closed (EOF) is reconnected. redis-py skips that check
#   while "maintenance notifications" are on, and their default ("auto") counts as on: they are for
#   Redis Enterprise's hitless upgrades, so they are turned off here;
# - a connection that failed makes the pool drop every idle one, which may have died with it
#   without the EOF having arrived yet (a reset, a server on another host).
_NO_MAINT = MaintNotificationsConfig(enabled=False)


class _Pool(redis.ConnectionPool):
    def release(self, connection: Any) -> None:
        if not connection.is_connected:  # it failed (or never connected): the idle ones may be dead too
            self.disconnect(inuse_connections=False)
        super().release(connection)


class _AsyncPool(aioredis.ConnectionPool):
    async def release(self, connection: Any) -> None:
        if not connection.is_connected:
            await self.disconnect(inuse_connections=False)
        await super().release(connection)


def _options() -> dict[str, Any]:
    return {
        "socket_timeout": SOCKET_TIMEOUT_S,
        "socket_connect_timeout": 5.0,
        "health_check_interval": 30,
        "maint_notifications_config": _NO_MAINT,
    }


def connect(url: str, cluster: bool = False) -> redis.Redis:
    """A client of the Redis at `url`, or with `cluster` of the Redis Cluster whose nodes it names."""
    if cluster:
        return _connect_cluster(url)
    pool = _Pool.from_url(url, retry=Retry(NoBackoff(), 0), **_options())
    client = redis.Redis(connection_pool=pool)
    client.auto_close_connection_pool = True  # as from_url does: closing the client closes its pool
    return client


def connect_async(url: str, cluster: bool = False) -> aioredis.Redis:
    if cluster:
        return _connect_cluster_async(url)
    pool = _AsyncPool.from_url(url, max_connections=4096, retry=AsyncRetry(NoBackoff(), 0), **_options())
    client = aioredis.Redis(connection_pool=pool)
    client.auto_close_connection_pool = True
    return client


# ----- Redis Cluster ---------------------------------------------------------------------------------
# Every multi-key command and script of cbserve names keys of one slot (common/streams.py), which is
# what RedisCluster routes. It keeps redis-py's own retries: they carry MOVED / ASK redirections and a
# failover to a replica; a repeated write is harmless where it matters (readers drop duplicate token
# events, submit_once writes a request once). The clients are typed as Redis: they answer the same
# commands, and every caller stays one type.


def cluster_nodes(url: str) -> tuple[list[tuple[str, int]], dict[str, Any]]:
    """`redis[s]://[user:password@]host:port,host:port[/0]` as (nodes, connection options)."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in ("redis", "rediss"):
        raise ValueError("a cluster REDIS_URL looks like redis://[user:password@]host:port,host:port")
    netloc, _, db = rest.partition("/")
    if db.split("?")[0] not in ("", "0"):
        raise ValueError("Redis Cluster has only database 0: drop the /<db> from REDIS_URL")
    auth, _, hosts = netloc.rpartition("@")
    options: dict[str, Any] = {"ssl": scheme == "rediss"}
    if auth:
        user, _, password = auth.partition(":")
        options.update(username=unquote(user) or None, password=unquote(password) or None)
    nodes = []
    for node in hosts.split(","):
        host, _, port = node.strip().rpartition(":")
        nodes.append((host.strip("[]") or node.strip(), int(port or 6379)))
    return nodes, options


def _connect_cluster(url: str) -> redis.Redis:
    nodes, options = cluster_nodes(url)
    startup = [redis.cluster.ClusterNode(host, port) for host, port in nodes]
    client = redis.cluster.RedisCluster(startup_nodes=startup, **options, **_options())
    return cast(redis.Redis, client)


def _connect_cluster_async(url: str) -> aioredis.Redis:
    nodes, options = cluster_nodes(url)
    startup = [aiocluster.ClusterNode(host, port) for host, port in nodes]
    client = aiocluster.RedisCluster(startup_nodes=startup, max_connections=4096, **options, **_options())
    return cast(aioredis.Redis, client)


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
