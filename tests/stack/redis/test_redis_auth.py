"""Services reach a Redis that requires a password through credentials in REDIS_URL."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import redis

from common.redis_io.redis_conn import connect, connect_async
from harness.processes.redis_server import free_port
from harness.processes.services import Stack, wait_for

PASSWORD = "s3cret-pw"


@pytest.fixture()
def password_redis(tmp_path: Path) -> Iterator[int]:
    binary = shutil.which("redis-server")
    assert binary, "redis-server must be on PATH"
    port = free_port()
    args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--requirepass", PASSWORD]
    proc = subprocess.Popen([*args, "--dir", str(tmp_path)], stdout=subprocess.DEVNULL)
    probe = redis.Redis(port=port, password=PASSWORD)

    def answers() -> bool:
        try:
            return bool(probe.ping())
        except redis.ConnectionError:
            assert proc.poll() is None, "redis-server exited"
            return False

    try:
        wait_for(answers, 10, "redis-server with a password to answer")
        yield port
    finally:
        probe.close()
        proc.kill()
        proc.wait()


def test_clients_authenticate_from_the_url(password_redis: int) -> None:
    good = connect(f"redis://:{PASSWORD}@127.0.0.1:{password_redis}/0")
    assert good.ping()
    with pytest.raises(redis.AuthenticationError):
        connect(f"redis://:wrong@127.0.0.1:{password_redis}/0").ping()
    with pytest.raises(redis.AuthenticationError):
        connect(f"redis://127.0.0.1:{password_redis}/0").ping()  # NOAUTH
    good.close()


def test_tls_urls_are_accepted() -> None:
    """rediss:// builds TLS connections (no TLS-enabled redis-server here to talk to)."""
    sync_client = connect("rediss://:pw@redis.example:6380/0")
    assert sync_client.connection_pool.connection_class is redis.SSLConnection
    async_client = connect_async("rediss://user:pw@redis.example:6380/0")
    kwargs = async_client.connection_pool.connection_kwargs
    assert async_client.connection_pool.connection_class.__name__ == "SSLConnection"
    assert (kwargs["username"], kwargs["password"]) == ("user", "pw")


def test_stack_runs_on_a_password_redis(password_redis: int, make_stack: Callable[[], Stack]) -> None:
    stack = make_stack()
    stack.redis_url = f"redis://:{PASSWORD}@127.0.0.1:{password_redis}/0"
    stack.start_batcher()
    stack.start_worker()
    stack.start_gateway()
    stack.wait_ready(num_workers=1)
    response = httpx.post(
        f"{stack.base_url}/v1/completions", json={"prompt": "hi", "max_tokens": 3}, timeout=60
    )
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] == 3
