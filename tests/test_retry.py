"""The backoff every service uses while Redis is down: capped, doubling, and never a busy loop."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import pytest
import redis.exceptions

from common.redis_conn import connect
from common.retry import Backoff, wait_for_redis
from tests.conftest import free_port
from tests.redis_process import RedisProcess


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
