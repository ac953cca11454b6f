"""The backoff every service uses while Redis is down: capped, doubling, and never a busy loop."""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from pathlib import Path

import pytest
import redis.exceptions

from common.redis_io.redis_conn import connect, connect_async
from common.redis_io.retry import Backoff, retry_async, wait_for_redis
from harness.processes.redis_process import RedisProcess
from harness.processes.redis_server import free_port


def test_backoff_doubles_to_its_cap_and_resets() -> None:
    backoff = Backoff()
    assert not backoff.failing
    assert [backoff.next_delay() for _ in range(7)] == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0])
    assert backoff.failing
    backoff.reset()
    assert backoff.next_delay() == pytest.approx(0.1)


def test_wait_for_redis_gives_up_when_told_to_stop() -> None:
    client = connect(f"redis://127.0.0.1:{free_port()}/0")  # nothing listens there
    stop = threading.Event()
    timer = threading.Timer(0.5, stop.set)
    timer.start()
    started = time.monotonic()
    assert not wait_for_redis(client, stop)
    assert time.monotonic() - started < 1.0  # the backoff wait ends with `stop`


def test_a_restarted_redis_is_reached_with_the_same_client(tmp_path: Path) -> None:
    """The pooled connection died with the old server: the next call after the restart just works
    (redis-py's own retries are off, so this is the pool replacing a dead connection)."""
    server = RedisProcess(tmp_path / "redis")
    server.start()
    client = connect(server.url)
    try:
        client.set("k", "v")
        server.stop(signal.SIGTERM)
        with pytest.raises(redis.exceptions.ConnectionError):
            client.get("k")  # down: fails at once instead of retrying inside redis-py
        server.start()
        assert client.get("k") == b"v"  # AOF kept it; the dead connection was replaced
    finally:
        client.close()
        server.stop(signal.SIGKILL)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_every_pooled_connection_is_replaced_after_a_restart(tmp_path: Path, sig: int) -> None:
    """Twenty idle connections die with the server: after the restart, twenty concurrent commands
    all succeed on the first try (the gateway's case: one dead socket used to fail one request)."""
    server = RedisProcess(tmp_path / "redis")
    server.start()

    async def run() -> list[object]:
        client = connect_async(server.url)
        try:
            await asyncio.gather(*(client.ping() for _ in range(20)))  # twenty connections, now idle
            # In a thread: the event loop runs on meanwhile, as a service's does.
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(None, server.stop, sig)
            await loop.run_in_executor(None, server.start)
            return await asyncio.gather(*(client.incr("n") for _ in range(20)), return_exceptions=True)
        finally:
            await client.aclose()

    try:
        replies = asyncio.run(run())
        assert not [r for r in replies if isinstance(r, Exception)], replies
    finally:
        server.stop(signal.SIGKILL)


def test_retry_async_rides_out_a_restart_within_its_window(tmp_path: Path) -> None:
    server = RedisProcess(tmp_path / "redis")
    server.start()

    async def run() -> tuple[object, float]:
        client = connect_async(server.url)
        try:
            await client.set("k", "v")
            server.stop(signal.SIGTERM)
            restart = asyncio.get_running_loop().run_in_executor(None, server.start)
            started = time.monotonic()
            value = await retry_async(lambda: client.get("k"), within_s=30)
            await restart
            return value, time.monotonic() - started
        finally:
            await client.aclose()

    async def give_up() -> float:
        client = connect_async(f"redis://127.0.0.1:{free_port()}/0")
        started = time.monotonic()
        with pytest.raises(redis.exceptions.ConnectionError):
            await retry_async(client.ping, within_s=0.5)
        await client.aclose()
        return time.monotonic() - started

    try:
        value, _ = asyncio.run(run())
        assert value == b"v"
        assert asyncio.run(give_up()) < 1.0  # bounded: the last error once the window is over
    finally:
        server.stop(signal.SIGKILL)
