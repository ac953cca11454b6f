"""Every streamed answer's HTTP response: a stream-out's events (openai_frontend/follow/stream_out.py)
framed as SSE, with the headers every SSE answer carries."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing

from starlette.responses import StreamingResponse

from gateway.streaming.sse import SSE_HEADERS, framed
from openai_frontend.follow.stream_out import StreamEvent


async def _sse(events: AsyncGenerator[StreamEvent, None]) -> AsyncIterator[bytes]:
    async with aclosing(events) as stream:
        async for event in stream:
            yield framed(event)


def sse_response(events: AsyncGenerator[StreamEvent, None], headers: dict[str, str]) -> StreamingResponse:
    """On client disconnect Starlette cancels the body, which closes `events` (the stream-out then
    aborts its requests, or leaves them for a resume, as its follow policy says)."""
    return StreamingResponse(_sse(events), media_type="text/event-stream", headers={**SSE_HEADERS, **headers})
