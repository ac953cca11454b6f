"""A message's streamed events in Anthropic's order, built as its text arrives (no I/O).

`message_start` (the Message with no content yet), then per content block `content_block_start`, its
deltas (`text_delta`, or `input_json_delta` pieces of a call's input) and `content_block_stop`; a
`ping` right after the first block starts (or before the end when none did), as Anthropic sends it;
then `message_delta` (stop reason, stop sequence, usage) and `message_stop`. The blocks are the output
items read from the text (responses/items.py), so a stream and the whole Message hold the same blocks.
A failure after the stream began is an `error` event.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from openai_frontend.anthropic.errors import error_body
from openai_frontend.anthropic.message import message_object, opened_block, stop_reason, usage
from openai_frontend.follow.stream_out import StreamEvent
from openai_frontend.generate.request import PreparedRequest
from openai_frontend.protocol.errors import OpenAIError
from openai_frontend.responses.items import CallItem, Change, OutputItems


def event(type_: str, **fields: Any) -> StreamEvent:
    return StreamEvent(json.dumps({"type": type_, **fields}), type=type_)


@dataclass
class MessageEvents:
    request: PreparedRequest
    _items: OutputItems = field(init=False)
    _pinged: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        self._items = OutputItems(self.request)

    def _events(self, changes: list[Change]) -> list[StreamEvent]:
        events: list[StreamEvent] = []
        for kind, index, piece in changes:
            item = self._items.items[index]
            if kind == "added":
                events.append(event("content_block_start", index=index, content_block=opened_block(item)))
                events += self._ping()
            elif kind == "text":
                delta = {"type": "text_delta", "text": piece}
                events.append(event("content_block_delta", index=index, delta=delta))
            elif kind == "reasoning":
                delta = {"type": "thinking_delta", "thinking": piece}
                events.append(event("content_block_delta", index=index, delta=delta))
            elif kind == "arguments":
                delta = {"type": "input_json_delta", "partial_json": piece}
                events.append(event("content_block_delta", index=index, delta=delta))
            else:
                events.append(event("content_block_stop", index=index))
        return events

    def _ping(self) -> list[StreamEvent]:
        if self._pinged:
            return []
        self._pinged = True
        return [event("ping")]

    def opening(self) -> list[StreamEvent]:
        start = event("message_start", message=message_object(self.request, []))
        return [start, *self._events(self._items.opening())]

    def delta(self, text: str) -> list[StreamEvent]:
        return self._events(self._items.feed(text))

    def closing(
        self, finish_reason: str | None, matched: str | None, num_output_tokens: int
    ) -> list[StreamEvent]:
        """The text has ended: what the parser held back, the last block's stop, the message's end."""
        events = self._events(self._items.finish()) + self._events(self._items.close())
        made_calls = any(isinstance(item, CallItem) for item in self._items.items)
        reason = stop_reason(finish_reason, matched, made_calls)
        return [
            *events,
            *self._ping(),
            event(
                "message_delta",
                delta={"stop_reason": reason, "stop_sequence": matched},
                usage=usage(self.request, num_output_tokens),
            ),
            event("message_stop"),
        ]


def error_event(error: OpenAIError) -> StreamEvent:
    """The stream stops without an end (the request failed, timed out, or Redis went away)."""
    return StreamEvent(json.dumps(error_body(error)), type="error")
