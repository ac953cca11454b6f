"""Fixtures of the tests that start services: a real gateway in a thread on the test's own Redis."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from gateway.settings import GatewaySettings
from harness.gateway.gateway_server import RunningGateway, start_server
from harness.gateway.stream_harness import StreamHarness


@pytest.fixture()
def gateway(redis_url: str, tiny_model_dir: Path) -> Iterator[RunningGateway]:
    settings = GatewaySettings(model=tiny_model_dir, redis_url=redis_url, request_timeout_s=60)
    server, thread, url = start_server(settings)
    harness = StreamHarness(redis_url)
    client = httpx.Client(base_url=url, timeout=30)
    try:
        yield RunningGateway(url, settings, client, harness, server.config.app)
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
            url, settings, httpx.Client(base_url=url, timeout=30), StreamHarness(redis_url), server.config.app
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
