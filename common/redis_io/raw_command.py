"""Commands on the per-step hot path, sent and read without redis-py's per-command layers.

redis-py's `execute_command` encodes every argument, wraps the call in its retry and observability
hooks and runs a reply callback (an XREAD or XRANGE reply becomes a dict per entry). The few commands a
service sends every step are packed by command_packer.py instead, written to a connection of the
client's own pool (its timeouts, its reconnects) and their replies taken as hiredis parses them
(stream_replies.py reads stream replies). An error reply is raised once every reply of the write is
read, so none is left to answer a later command; any other failure drops the connection.

Redis Cluster clients route by key and follow redirections, which this does not: `raw_capable` says
whether a client can be spoken to this way; callers keep redis-py's commands for the others.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import redis
import redis.asyncio as aioredis


def raw_capable(client: object) -> bool:
    """A plain (not cluster) client, sync or async, whose pool hands out single-node connections."""
    return isinstance(client, redis.Redis | aioredis.Redis)


def execute(client: redis.Redis, packed: bytes, num_replies: int = 1) -> list[Any]:
    """Send `packed` (`num_replies` commands) on one pooled connection; their replies, in order."""
    pool = client.connection_pool
    conn: Any = pool.get_connection()
    try:
        conn.send_packed_command([packed])
        return _raise_first([_reply(conn.read_response) for _ in range(num_replies)])
    except redis.ResponseError:
        raise
    except BaseException:
        conn.disconnect()  # a reply may be left unread on it
        raise
    finally:
        pool.release(conn)


async def execute_async(client: aioredis.Redis, packed: bytes, num_replies: int = 1) -> list[Any]:
    """`execute` for an asyncio client."""
    pool = client.connection_pool
    conn: Any = await pool.get_connection()
    try:
        await conn.send_packed_command([packed])
        return _raise_first([await _reply_async(conn.read_response) for _ in range(num_replies)])
    except redis.ResponseError:
        raise
    except BaseException:
        await conn.disconnect()
        raise
    finally:
        await pool.release(conn)


def _reply(read: Callable[[], Any]) -> Any:
    """One reply; an error reply as its exception, so that the replies after it are read too."""
    try:
        return read()
    except redis.ResponseError as exc:
        return exc


async def _reply_async(read: Callable[[], Awaitable[Any]]) -> Any:
    try:
        return await read()
    except redis.ResponseError as exc:
        return exc


def _raise_first(replies: list[Any]) -> list[Any]:
    for reply in replies:
        if isinstance(reply, redis.ResponseError):
            raise reply
    return replies
