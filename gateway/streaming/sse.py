"""Server-sent events framing, written by hand (no extra dependency)."""

from __future__ import annotations

from openai_frontend.follow.stream_out import StreamEvent

# Every SSE answer: never cached, and not buffered by a proxy (nginx reads X-Accel-Buffering).
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


# Characters JSON leaves unescaped that clients splitting lines like str.splitlines (httpx's
# aiter_lines) break a data line at, though SSE ends lines only at CR and LF: a token decoding to one
# of them cut its chunk's JSON in two. Inside JSON strings the escape is the same text.
_LINE_BREAKS = str.maketrans({c: f"\\u{ord(c):04x}" for c in "\x85\u2028\u2029"})


def sse_event(data: str, event_id: str | None = None, event: str | None = None) -> bytes:
    """One event; `event_id` (a token stream entry id) lets a client resume with Last-Event-ID, and
    `event` names its type (the dashboard's `step` and `stats`; OpenAI streams send none)."""
    head = f"id: {event_id}\n" if event_id is not None else ""
    if event is not None:
        head += f"event: {event}\n"
    return f"{head}data: {data.translate(_LINE_BREAKS)}\n\n".encode()


def framed(event: StreamEvent) -> bytes:
    """A stream-out's event as SSE. A comment goes alone, with no blank line after it: a blank line
    dispatches an event, and decoders that keep the last event id (the OpenAI and Anthropic SDKs) then
    hand their client an event with empty data, which it fails to parse as JSON."""
    if event.comment is not None:
        return f": {event.comment}\n".encode()
    return sse_event(event.data, event.id, event.type)
