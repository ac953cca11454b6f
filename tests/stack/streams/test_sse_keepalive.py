"""A streamed request that waits (queued, a slow step, Redis away) still sends bytes: an SSE comment
every `sse_keepalive_s`, which clients skip. Before, such a stream sent nothing for as long as it
waited, up to the request timeout (an hour), and a client or proxy could not tell it from a dead one.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx

from harness.gateway.gateway_server import RunningGateway


def _lines_until_two_keepalives(gateway: RunningGateway, path: str, body: dict[str, Any]) -> list[str]:
    """The stream's lines up to its second keep-alive, which must come within 10 s."""
    gateway.harness.heartbeat()  # a worker seems alive; no batcher or worker answers the request
    lines: list[str] = []
    started = time.monotonic()
    with httpx.stream("POST", f"{gateway.url}{path}", json=body, timeout=30) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            lines.append(line)
            if lines.count(": keep-alive") >= 2:
                break
    waited_s = time.monotonic() - started
    assert lines.count(": keep-alive") == 2 and waited_s < 10, (lines, waited_s)
    return lines


def test_a_waiting_stream_sends_keepalive_comments(make_gateway: Callable[..., RunningGateway]) -> None:
    gateway = make_gateway(sse_keepalive_s=1.0)
    body = {"prompt": [5, 6, 7], "max_tokens": 4, "stream": True}
    lines = _lines_until_two_keepalives(gateway, "/v1/completions", body)
    assert not any(line.startswith("data: ") and '"text"' in line for line in lines), lines  # no token yet
    gateway.harness.next_request()  # the request was queued as usual


def test_a_waiting_response_stream_sends_keepalive_comments(
    make_gateway: Callable[..., RunningGateway],
) -> None:
    """The Responses API's stream too (before, it sent nothing between its opening events and the
    first token)."""
    gateway = make_gateway(sse_keepalive_s=1.0)
    body = {"input": "hi", "max_output_tokens": 4, "stream": True}
    lines = _lines_until_two_keepalives(gateway, "/v1/responses", body)
    assert "event: response.created" in lines, lines  # the opening events came first
    assert not any("output_text.delta" in line for line in lines), lines  # no token yet
