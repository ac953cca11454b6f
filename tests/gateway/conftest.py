"""A real gateway (uvicorn in a thread) on a private Redis, an HTTP client, and the worker harness."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from gateway.app import create_app
from gateway.security.connection_guard import uvicorn_options
from gateway.settings import GatewaySettings
from tests.conftest import free_port
from tests.stream_harness import StreamHarness


@dataclass
class RunningGateway:
    url: str
    settings: GatewaySettings
    client: httpx.Client
    harness: StreamHarness


def start_server(settings: GatewaySettings) -> tuple[uvicorn.Server, threading.Thread, str]:
    port = free_port()
    config = uvicorn.Config(
        create_app(settings),
        host="127.0.0.1",
        port=port,
        log_level="warning",
        timeout_graceful_shutdown=2,
        **uvicorn_options(settings),  # as `python -m gateway` runs it
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="gateway-uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("gateway did not start")
        time.sleep(0.01)
    return server, thread, f"http://127.0.0.1:{port}"


@pytest.fixture()
def gateway(redis_url: str, tiny_model_dir: Path) -> Iterator[RunningGateway]:
    settings = GatewaySettings(model=tiny_model_dir, redis_url=redis_url, request_timeout_s=60)
    server, thread, url = start_server(settings)
    harness = StreamHarness(redis_url)
    client = httpx.Client(base_url=url, timeout=30)
    try:
        yield RunningGateway(url, settings, client, harness)
    finally:
        client.close()
        harness.close()
        server.should_exit = True
        thread.join(timeout=15)


@pytest.fixture()
def make_gateway(redis_url: str, tiny_model_dir: Path) -> Iterator[Callable[..., RunningGateway]]:
    """Starts gateways with settings overrides (GatewaySettings field names) on the test's Redis."""
    started: list[tuple[uvicorn.Server, threading.Thread, RunningGateway]] = []

    def make(**overrides: Any) -> RunningGateway:
        settings = GatewaySettings(
            model=tiny_model_dir, redis_url=redis_url, **{"request_timeout_s": 60, **overrides}
        )
        server, thread, url = start_server(settings)
        running = RunningGateway(
            url, settings, httpx.Client(base_url=url, timeout=30), StreamHarness(redis_url)
        )
        started.append((server, thread, running))
        return running

    try:
        yield make
    finally:
        for server, thread, running in started:
            running.client.close()
            running.harness.close()
            server.should_exit = True
            thread.join(timeout=15)
