"""Reading a gateway SSE response in tests: events as (id, data) pairs, exactly as framed."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx


@dataclass
class SSEEvent:
    id: str | None
    data: str

    def json(self) -> Any:
        return json.loads(self.data)


def parse_sse(raw: str) -> list[SSEEvent]:
    """Split a complete SSE body; every event must be `[id: X\\n]data: Y` and end with a blank line."""
    assert raw.endswith("\n\n"), f"body does not end an event: {raw[-40:]!r}"
    events = []
    for block in raw[:-2].split("\n\n"):
        event_id = None
        data = None
        for line in block.split("\n"):
            field, _, value = line.partition(": ")
            if field == "id":
                event_id = value
            elif field == "data":
                data = value
            else:
                raise AssertionError(f"unexpected SSE line {line!r}")
        assert data is not None, f"event without data: {block!r}"
        events.append(SSEEvent(event_id, data))
    return events


def post_sse(client: httpx.Client, path: str, body: dict[str, Any]) -> tuple[httpx.Response, list[SSEEvent]]:
    with client.stream("POST", path, json=body) as response:
        raw = response.read().decode()
    return response, parse_sse(raw)


def get_sse(
    client: httpx.Client, path: str, headers: dict[str, str] | None = None
) -> tuple[httpx.Response, list[SSEEvent]]:
    with client.stream("GET", path, headers=headers) as response:
        raw = response.read().decode()
    return response, parse_sse(raw) if response.status_code == 200 else []


def sse_events(response: httpx.Response) -> Iterator[SSEEvent]:
    """A streamed response's events as they arrive, each with the id line before it, if any."""
    event_id: str | None = None
    for line in response.iter_lines():
        if line.startswith("id: "):
            event_id = line[len("id: ") :]
        elif line.startswith("data: "):
            yield SSEEvent(event_id, line[len("data: ") :])
            event_id = None


def read_then_hang_up(
    url: str, path: str, body: dict[str, Any], num_ids: int, headers: dict[str, str] | None = None
) -> tuple[str, list[SSEEvent]]:
    """Stream `body`, read until `num_ids` events with an id have arrived, then drop the connection.
    Returns the request id (X-Request-Id) and the events read."""
    events: list[SSEEvent] = []
    with (
        httpx.Client(base_url=url, timeout=60) as client,
        client.stream("POST", path, json=body, headers=headers) as response,
    ):
        assert response.status_code == 200, response.read()
        req_id = response.headers["x-request-id"]
        for event in sse_events(response):
            events.append(event)
            if sum(e.id is not None for e in events) >= num_ids:
                return req_id, events
    raise AssertionError(f"the stream ended after {len(events)} events")


@contextmanager
def post_raw(url: str, path: str, body: dict[str, Any]) -> Iterator[socket.socket]:
    """POST `body` on a plain socket that is closed when the block ends, whatever was answered:
    a client that goes away while it waits for a non-streaming answer."""
    parts = urlsplit(url)
    data = json.dumps(body).encode()
    head = f"POST {path} HTTP/1.1\r\nhost: {parts.netloc}\r\ncontent-type: application/json\r\n"
    with socket.create_connection((parts.hostname, parts.port), timeout=30) as sock:
        sock.sendall(head.encode() + f"content-length: {len(data)}\r\n\r\n".encode() + data)
        yield sock
