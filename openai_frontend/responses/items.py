"""A response's output items (thoughts, messages and function calls) read from its text, in the order
written. A model that thinks (reasoning/) opens a `reasoning` item first, done when its answer begins.

Without tools the output is one message, opened before any text. With tools the text goes through
the request's tool parser (tools/parsers/): text outside calls opens a message item (or extends the
one being written), each call opens a `function_call` item whose arguments then grow; an item is done
when the next one opens or the response ends. Every change is reported, so the stream's events and
the Response object's `output` come from the same code: the object is the whole text read at once.

A parser's delta holds content and call pieces without their order, so the text is fed in pieces
that each end a call block (`</tool_call>` in Hermes): in each delta, pieces of the call already open come
first, then content, then a new call. That makes the items the same however the text was cut.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

from openai_frontend.generate.parsers import answer_parser
from openai_frontend.generate.request import PreparedRequest
from openai_frontend.responses.store import StoredCall, Turn
from openai_frontend.tools.parsers import ParsedDelta, ToolCallDelta

_MESSAGE_PREFIX, _CALL_PREFIX, _ITEM_PREFIX, _REASONING_PREFIX = "msg_", "call_", "fc_", "rs_"


@dataclass(slots=True)
class ReasoningItem:
    id: str
    text: str = ""


@dataclass(slots=True)
class MessageItem:
    id: str
    text: str = ""


@dataclass(slots=True)
class CallItem:
    id: str  # the item's id (fc_...)
    call_id: str  # what a function_call_output answers (call_...)
    name: str
    arguments: str = ""


Item = ReasoningItem | MessageItem | CallItem
# (what happened, output index, the added text, thoughts or arguments); "added" and "done" carry "".
Change = tuple[Literal["added", "reasoning", "text", "arguments", "done"], int, str]


def _pieces(text: str, end: str | None) -> list[str]:
    """`text` cut after each end of a call block (formats that mark none: models write their content
    before their calls)."""
    if end is None:
        return [text]
    parts = text.split(end)
    return [p + end for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


class OutputItems:
    """Feed a response's text as it arrives; each call says how the items changed."""

    def __init__(self, meta: PreparedRequest) -> None:
        self._req_id = meta.req_id
        self._parser = answer_parser(meta)
        self.items: list[Item] = []
        self._open = False  # the last item is still being written
        self._calls: dict[int, int] = {}  # a parser call index -> its output index

    def opening(self) -> list[Change]:
        """Without tools the message opens before any text (an empty answer is an empty message)."""
        return [] if self._parser is not None else self._open_item(MessageItem(self._message_id(0)))

    def feed(self, text: str) -> list[Change]:
        if self._parser is None:
            return self._content(text)
        changes: list[Change] = []
        for piece in _pieces(text, self._parser.call_end):
            changes += self._apply(self._parser.feed(piece))
        return changes

    def finish(self) -> list[Change]:
        """The text has ended: what the parser held back (the last item stays open; see `close`)."""
        return [] if self._parser is None else self._apply(self._parser.finish())

    def close(self) -> list[Change]:
        if not self._open:
            return []
        self._open = False
        return [("done", len(self.items) - 1, "")]

    def _apply(self, delta: ParsedDelta) -> list[Change]:
        changes = self._reasoning(delta.reasoning)
        current = self._open_call_index()
        for call in delta.tool_calls:
            if call.index == current:
                changes += self._arguments(call)
        changes += self._content(delta.content)
        for call in delta.tool_calls:
            if call.index != current:
                changes += self._call(call)
        return changes

    def _open_call_index(self) -> int | None:
        if not self._open or not isinstance(self.items[-1], CallItem):
            return None
        return next(i for i, at in self._calls.items() if at == len(self.items) - 1)

    def _reasoning(self, text: str) -> list[Change]:
        if not text:
            return []
        changes: list[Change] = []
        if not (self._open and isinstance(self.items[-1], ReasoningItem)):
            changes += self._open_item(ReasoningItem(_REASONING_PREFIX + self._req_id))
        item = self.items[-1]
        assert isinstance(item, ReasoningItem)
        item.text += text
        return [*changes, ("reasoning", len(self.items) - 1, text)]

    def _content(self, text: str) -> list[Change]:
        if not text:
            return []
        changes: list[Change] = []
        if not (self._open and isinstance(self.items[-1], MessageItem)):
            changes += self._open_item(MessageItem(self._message_id(len(self.items))))
        item = self.items[-1]
        assert isinstance(item, MessageItem)
        item.text += text
        return [*changes, ("text", len(self.items) - 1, text)]

    def _call(self, call: ToolCallDelta) -> list[Change]:
        changes: list[Change] = []
        if call.id is not None:
            item_id = _ITEM_PREFIX + call.id.removeprefix(_CALL_PREFIX)
            changes += self._open_item(CallItem(item_id, call.id, call.name or ""))
            self._calls[call.index] = len(self.items) - 1
        return changes + self._arguments(call)

    def _arguments(self, call: ToolCallDelta) -> list[Change]:
        at = self._calls.get(call.index)
        if at is None or not call.arguments:
            return []
        item = self.items[at]
        assert isinstance(item, CallItem)
        item.arguments += call.arguments
        return [("arguments", at, call.arguments)]

    def _open_item(self, item: Item) -> list[Change]:
        changes = self.close()
        self.items.append(item)
        self._open = True
        return [*changes, ("added", len(self.items) - 1, "")]

    def _message_id(self, output_index: int) -> str:
        # The first message keeps the id a response without tools always had.
        suffix = "" if not any(isinstance(i, MessageItem) for i in self.items) else f"_{output_index}"
        return _MESSAGE_PREFIX + self._req_id + suffix


def output_items(meta: PreparedRequest, text: str) -> list[Item]:
    """The items of a whole answer: `text` read at once, as a stream of it would have built them."""
    items = OutputItems(meta)
    items.opening()
    items.feed(text)
    items.finish()
    return items.items


def answer_turn(items: list[Item]) -> Turn:
    """The answer as the next turn's history: one assistant turn, its texts joined, then its calls
    (as a chat answer holds them)."""
    text = "".join(i.text for i in items if isinstance(i, MessageItem))
    calls = [StoredCall(i.call_id, i.name, i.arguments) for i in items if isinstance(i, CallItem)]
    return Turn("assistant", text, tool_calls=calls or None)


def cut_call(turn: Turn) -> bool:
    """Whether a call of the answer was cut by max_output_tokens: its arguments are not whole JSON."""
    for call in turn.tool_calls or []:
        try:
            json.loads(call.arguments)
        except json.JSONDecodeError:
            return True
    return False
