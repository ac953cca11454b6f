"""/health tells the truth: 503 naming the cause while Redis refuses writes (full) or while no batcher
publishes, 200 again once it is over; a request made into a full Redis gets 503 `redis_full`.

Before, /health said ok throughout both (it only counted worker heartbeats), and a full Redis was
reported as "redis unreachable".
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from typing import Any

import httpx

from gateway.health import BATCHER_SILENT_S
from harness.processes.services import Stack, wait_for


def _health(stack: Stack) -> tuple[int, dict[str, Any]]:
    response = httpx.get(f"{stack.base_url}/health", timeout=10)
    return response.status_code, response.json()


def test_health_names_a_full_redis_and_a_missing_batcher(make_stack: Callable[[], Stack]) -> None:
    stack = make_stack().start_all()
    assert _health(stack)[0] == 200
    client = stack.redis()
    client.config_set("maxmemory", 1)  # noeviction: every write that may grow memory is refused
    try:
        wait_for(lambda: _health(stack)[1].get("reason") == "redis_refuses_writes", 10, "/health to say full")
        status, body = _health(stack)
        assert status == 503 and "refuses writes" in body["message"], body
        body_request = {"prompt": [5, 6, 7], "max_tokens": 2}
        response = httpx.post(f"{stack.base_url}/v1/completions", json=body_request, timeout=30)
        assert response.status_code == 503 and int(response.headers["Retry-After"]) > 0, response.text
        assert response.json()["error"]["code"] == "redis_full"
    finally:
        client.config_set("maxmemory", 0)
    wait_for(lambda: _health(stack)[0] == 200, 30, "/health to say ok once memory is freed")

    batcher = stack.procs.pop("batcher")
    batcher.send_signal(signal.SIGKILL)
    batcher.wait()
    wait_for(lambda: _health(stack)[0] == 503, BATCHER_SILENT_S + 20, "/health to miss the batcher")
    status, body = _health(stack)
    assert body["reason"] == "no_batcher" and "127.0.0.1" not in str(body), body
    stack.start_batcher()
    wait_for(lambda: _health(stack)[0] == 200, 60, "/health to say ok with a new batcher")
    client.close()
