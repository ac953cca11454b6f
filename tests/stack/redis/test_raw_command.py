"""Commands sent packed on a pooled connection (common/redis_io/raw_command.py), on a real Redis."""

from __future__ import annotations

import asyncio

import pytest
import redis
import redis.asyncio as aioredis

from common.redis_io.command_packer import pack, pack_all
from common.redis_io.raw_command import execute, execute_async, raw_capable
from common.redis_io.redis_conn import connect


def test_replies_come_back_in_order_and_an_error_leaves_the_connection_in_step(redis_url: str) -> None:
    client = connect(redis_url)
    try:
        assert raw_capable(client)
        commands = pack_all([("SET", "k", "v"), ("INCR", "k"), ("GET", "k")])  # INCR of text: an error
        with pytest.raises(redis.ResponseError, match="not an integer"):
            execute(client, commands, 3)
        # The replies after the error were read: the pooled connection answers the next command right.
        assert execute(client, pack("GET", "k")) == [b"v"]
        assert execute(client, pack("XADD", "s", "1-1", "m", "x")) == [b"1-1"]
        assert execute(client, pack("XRANGE", "s", "-", "+")) == [[[b"1-1", [b"m", b"x"]]]]
    finally:
        client.close()


def test_the_async_form_answers_as_the_sync_one(redis_url: str) -> None:
    async def scenario() -> list[object]:
        client = aioredis.Redis.from_url(redis_url)
        try:
            assert raw_capable(client)
            with pytest.raises(redis.ResponseError):
                await execute_async(client, pack_all([("SET", "a", "1"), ("HGET", "a", "f")]), 2)
            return await execute_async(client, pack_all([("INCR", "a"), ("GET", "a")]), 2)
        finally:
            await client.aclose()

    assert asyncio.run(scenario()) == [2, b"2"]
