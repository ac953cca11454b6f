"""The little of the OpenAI HTTP API the terminal clients need: list models, post, read an SSE stream."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx

# Connecting fails fast; a stream may go quiet for long (a queue ahead of it, a slow first token).
TIMEOUT = httpx.Timeout(10.0, read=600.0)


class ApiError(RuntimeError):
    """The server refused or failed a request; the message is the server's own when it sent one."""


def normalize_base_url(base_url: str) -> str:
    """Accept both `http://host:port` and the SDK-style `http://host:port/v1`."""
    url = base_url.rstrip("/")
    return url.removesuffix("/v1")


def make_client(base_url: str) -> httpx.Client:
    return httpx.Client(base_url=normalize_base_url(base_url), timeout=TIMEOUT)


def _error_text(response: httpx.Response) -> str:
    try:
        error = response.json().get("error", {})
        message = error.get("message") if isinstance(error, dict) else None
    except (ValueError, AttributeError):
        message = None
    return f"HTTP {response.status_code}: {message or response.text[:500]}"


def default_model(client: httpx.Client) -> str:
    """The first model GET /v1/models lists (the gateway serves exactly one)."""
    response = client.get("/v1/models")
    if response.status_code != 200:
        raise ApiError(_error_text(response))
    models = response.json().get("data") or []
    if not models:
        raise ApiError("the server lists no models")
    return str(models[0]["id"])


def post_json(client: httpx.Client, path: str, body: dict[str, Any]) -> dict[str, Any]:
    response = client.post(path, json=body)
    if response.status_code != 200:
        raise ApiError(_error_text(response))
    data: dict[str, Any] = response.json()
    return data


def stream_chunks(client: httpx.Client, path: str, body: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """POST with `stream: true` and yield each SSE `data:` JSON chunk until `[DONE]`.

    Closing the generator early closes the connection, which makes the gateway abort the request.
    """
    with client.stream("POST", path, json={**body, "stream": True}) as response:
        if response.status_code != 200:
            response.read()
            raise ApiError(_error_text(response))
        for line in response.iter_lines():
            if not line.startswith("data:"):
                continue  # `id:` lines and blank separators carry nothing the clients need
            data = line.removeprefix("data:").strip()
            if data == "[DONE]":
                return
            chunk = json.loads(data)
            if "error" in chunk:  # a failure after the 200 status went out arrives as an event
                raise ApiError(str(chunk["error"].get("message", chunk["error"])))
            yield chunk
    raise ApiError("the stream ended without [DONE]")
