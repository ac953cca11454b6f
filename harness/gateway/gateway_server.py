"""A real gateway (uvicorn in a thread) on a private Redis, an HTTP client, and the worker harness.

The `gateway` and `make_gateway` fixtures (tests/stack/conftest.py) start it."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import httpx
import uvicorn
from fastapi import FastAPI

from gateway.app import create_app
from gateway.security.connection_guard import uvicorn_options
from gateway.settings import GatewaySettings
from harness.gateway.stream_harness import StreamHarness
from harness.processes.redis_server import free_port


@dataclass
class RunningGateway:
    url: str
    settings: GatewaySettings
    client: httpx.Client
    harness: StreamHarness
    app: FastAPI  # its state (`app.state.gateway`) once the server has started


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
