"""SSE framing (gateway/streaming/sse.py) that every client parses, however it splits lines."""

from __future__ import annotations

import json

from gateway.streaming.sse import framed, sse_event
from openai_frontend.follow.stream_out import KEEPALIVE, StreamEvent


def test_a_data_line_stays_one_line_for_clients_that_split_like_splitlines() -> None:
    # A token may decode to any of these; httpx's aiter_lines (str.splitlines) breaks lines at them.
    text = "a\x85b\u2028c\u2029d\x1ce\x0bf\r\ng"
    data = json.dumps({"choices": [{"text": text}]}, ensure_ascii=False)
    event = sse_event(data, event_id="1-0").decode()
    head, data_line, blank = event.splitlines()
    assert (head, blank) == ("id: 1-0", "") and data_line.startswith("data: ")
    assert json.loads(data_line.removeprefix("data: ")) == {"choices": [{"text": text}]}


def test_a_keepalive_is_a_comment_line_that_dispatches_nothing() -> None:
    # A blank line would dispatch an event with empty data, which the SDKs fail to parse as JSON.
    assert framed(KEEPALIVE) == b": keep-alive\n"
    assert framed(StreamEvent('{"type": "ping"}', type="ping")) == b'event: ping\ndata: {"type": "ping"}\n\n'
