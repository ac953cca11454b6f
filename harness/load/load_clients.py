"""HTTP clients for the load, soak and disconnect checks: stream, hang up, resume, or wait whole.

Each returns an `Outcome`: what its client saw, and whether the answer was whole. A stream is whole
when it ended with `[DONE]`, no error event, and as many token ids as it asked for (`ignore_eos` and a
fixed `max_tokens`), so a lost, repeated or extra token shows.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

import httpx


@dataclass
class Outcome:
    req_id: str = ""
    status: int = 0
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    errors: list[Any] = field(default_factory=list)
    last_event_id: str | None = None  # SSE `id:` of the last event read: where a resume starts
    done: bool = False  # `[DONE]` read (a stream), or a whole body (not streaming)
    left_at: float | None = None  # time.time() when the client hung up early

    def is_whole(self, max_tokens: int) -> bool:
        return (
            self.done
            and not self.errors
            and self.finish_reason == "length"
            and len(self.token_ids) == max_tokens
        )


def completion_body(prompt: list[int], max_tokens: int, *, stream: bool) -> dict[str, Any]:
    return {
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "return_token_ids": True,
        "stream": stream,
    }


async def _read_events(response: httpx.Response, out: Outcome, hang_up_after: int | None) -> bool:
    """Read SSE events into `out`; True when it stopped early (`hang_up_after` tokens, with an id)."""
    event_id: str | None = None
    async for line in response.aiter_lines():
        if line.startswith("id: "):
            event_id = line[len("id: ") :]
            continue
        if not line.startswith("data: "):
            continue
        data = line[len("data: ") :]
        if data == "[DONE]":
            out.done = True
            continue
        out.last_event_id = event_id or out.last_event_id
        event_id = None
        chunk = json.loads(data)
        if "error" in chunk:
            out.errors.append(chunk["error"])
            continue
        for choice in chunk["choices"]:
            out.token_ids.extend(choice.get("token_ids") or [])
            out.finish_reason = choice.get("finish_reason") or out.finish_reason
        if hang_up_after is not None and len(out.token_ids) >= hang_up_after and out.last_event_id:
            return True
    return False


async def _stream(
    client: httpx.AsyncClient, method: str, url: str, hang_up_after: int | None, **kwargs: Any
) -> Outcome:
    out = Outcome()
    async with client.stream(method, url, **kwargs) as response:
        out.status = response.status_code
        out.req_id = response.headers.get("x-request-id", "")
        if response.status_code != 200:
            out.errors.append((await response.aread()).decode(errors="replace"))
            return out
        left = await _read_events(response, out, hang_up_after)
    # Leaving the block with the body unread closes the connection: the gateway sees a disconnect.
    if left and not out.done:
        out.left_at = time.time()
    return out


async def stream(
    client: httpx.AsyncClient, body: dict[str, Any], hang_up_after: int | None = None
) -> Outcome:
    """POST a streaming completion; hang up once `hang_up_after` tokens have arrived, if given."""
    return await _stream(client, "POST", "/v1/completions", hang_up_after, json=body)


async def resume(client: httpx.AsyncClient, left: Outcome) -> Outcome:
    """The rest of a stream its client left: `GET /v1/requests/{id}/stream` after its last event id."""
    headers = {"Last-Event-ID": left.last_event_id or ""}
    return await _stream(client, "GET", f"/v1/requests/{left.req_id}/stream", None, headers=headers)


async def complete(client: httpx.AsyncClient, body: dict[str, Any]) -> Outcome:
    """A non-streaming completion, read whole."""
    response = await client.post("/v1/completions", json=body)
    out = Outcome(status=response.status_code, req_id=response.headers.get("x-request-id", ""))
    if response.status_code != 200:
        out.errors.append(response.text)
        return out
    choice = response.json()["choices"][0]
    out.token_ids = list(choice.get("token_ids") or [])
    out.finish_reason = choice["finish_reason"]
    out.done = True
    return out


async def complete_and_leave(client: httpx.AsyncClient, body: dict[str, Any], after_s: float) -> Outcome:
    """A non-streaming completion whose client gives up after `after_s` (the gateway aborts it)."""
    try:
        return await asyncio.wait_for(complete(client, body), timeout=after_s)
    except TimeoutError:
        return Outcome(left_at=time.time())
