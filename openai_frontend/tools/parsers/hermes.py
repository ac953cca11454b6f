"""Hermes tool calls in a model's output, read incrementally: `<tool_call>\n{"name": ..., "arguments":
{...}}\n</tool_call>` blocks (Qwen2.5's and Hermes' format, and that of this repo's ChatML template).

One parser serves streaming and whole answers: a whole answer is its text fed at once, so the deltas
a stream sends always add up to the non-streamed message. Like vLLM's hermes_tool_parser:
- text outside the blocks is content; the blanks that separate it from a block are not;
- a call starts (id, name) as soon as `{"name": "...", "arguments": ` is complete, and its arguments
  then stream as the model writes them: the model's own JSON text, never re-serialized (the
  final arguments are exactly the streamed pieces joined);
- a block whose JSON has no name is content, as written; one cut off by `max_tokens` keeps the
  arguments written so far (as OpenAI does at finish_reason `length`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable

from openai_frontend.tools.parsers.deltas import ParsedDelta, ToolCallDelta

START, END = "<tool_call>", "</tool_call>"
# A call's head, name first (as the template writes it); its arguments follow.
_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"arguments"\s*:\s*')


def _held_prefix(text: str, tag: str) -> int:
    """Length of the longest end of `text` that could begin `tag`: held back until it is decided."""
    for k in range(min(len(text), len(tag) - 1), 0, -1):
        if text.endswith(tag[:k]):
            return k
    return 0


def _json_string(literal: str) -> str | None:
    try:
        return str(json.loads(literal))
    except json.JSONDecodeError:  # a bad escape: no head, the block is decided at its end
        return None


class HermesToolParser:
    """Feed a choice's text as it arrives; each feed returns what it adds to the message."""

    call_end: str | None = END

    def __init__(self, call_id: Callable[[int], str], max_calls: int | None = None) -> None:
        self._call_id = call_id
        # None: any number; 1 with parallel_tool_calls false (later calls are dropped).
        self._max_calls = max_calls
        self._buffer = ""  # text not yet given out: a possible tag, separating blanks, an open block
        self._in_block = False
        self._after_block = False  # the last thing read was a call: blanks after it are dropped
        self._blanks = ""  # blanks after the last content, given out if more content follows
        self._name: str | None = None  # the open block's call, once its head is complete
        self._args_at = 0  # where its arguments start in the block
        self._sent = 0  # characters of its arguments given out
        self.num_calls = 0  # calls found, dropped ones included

    def feed(self, text: str) -> ParsedDelta:
        self._buffer += text
        delta = ParsedDelta()
        while self._step(delta, final=False):
            pass
        return delta

    def finish(self) -> ParsedDelta:
        """The end of the output: whatever was held back is decided."""
        delta = ParsedDelta()
        while self._step(delta, final=True):
            pass
        return delta

    @property
    def made_calls(self) -> bool:
        return self.num_calls > 0

    def _step(self, delta: ParsedDelta, final: bool) -> bool:
        """Consume what can be decided; True when the buffer changed state (run again)."""
        return self._block(delta, final) if self._in_block else self._text(delta, final)

    def _text(self, delta: ParsedDelta, final: bool) -> bool:
        start = self._buffer.find(START)
        if start >= 0:
            self._content(self._buffer[:start], delta)
            self._buffer = self._buffer[start + len(START) :]
            self._in_block = True
            return True
        decided = len(self._buffer) - (0 if final else _held_prefix(self._buffer, START))
        self._content(self._buffer[:decided], delta)
        self._buffer = self._buffer[decided:]
        if final and not self._after_block:
            delta.content += self._blanks  # the output's own trailing blanks, no block after them
        return False

    def _content(self, text: str, delta: ParsedDelta) -> None:
        """Blanks that touch a block separate it: those after one are dropped, those before one are
        held and given out only if more content follows."""
        if self._after_block:
            text = text.lstrip()
            self._after_block = not text
        body = text.rstrip()
        if not body:
            self._blanks += text
            return
        delta.content += self._blanks + body
        self._blanks = text[len(body) :]

    def _block(self, delta: ParsedDelta, final: bool) -> bool:
        end = self._buffer.find(END)
        body = self._buffer if end < 0 else self._buffer[:end]
        if self._name is None:
            head = _HEAD.match(body)
            name = None if head is None else _json_string(head.group(1))
            if head is not None and name is not None:
                self._open_call(name, head.end(), delta)
        if end < 0 and not final:
            if self._name is not None:
                self._send_arguments(body[: len(body) - _held_prefix(body, END)], delta)
            return False
        if self._name is not None:
            self._send_arguments(body[: len(body) - (0 if end >= 0 else _held_prefix(body, END))], delta)
            self._after_block = True
        elif self._whole_call(body, delta):
            self._after_block = True
        else:  # not a call: content as written
            self._content(START + body + (END if end >= 0 else ""), delta)
        self._buffer = "" if end < 0 else self._buffer[end + len(END) :]
        self._in_block, self._name, self._sent = False, None, 0
        return end >= 0

    def _open_call(self, name: str, args_at: int, delta: ParsedDelta) -> None:
        self._name, self._args_at, self._sent = name, args_at, 0
        index = self.num_calls
        self.num_calls += 1
        if self._kept(index):
            delta.tool_calls.append(ToolCallDelta(index, "", id=self._call_id(index), name=name))

    def _send_arguments(self, body: str, delta: ParsedDelta) -> None:
        # What follows the arguments is the call object's closing brace, and blanks.
        arguments = body[self._args_at :].strip()
        arguments = arguments[:-1].rstrip() if arguments.endswith("}") else arguments
        piece = arguments[self._sent :]
        self._sent = len(arguments)
        index = self.num_calls - 1
        if piece and self._kept(index):
            delta.tool_calls.append(ToolCallDelta(index, piece))

    def _whole_call(self, body: str, delta: ParsedDelta) -> bool:
        """A block whose head the stream could not read (`arguments` first, say): one call, if its
        JSON holds a name and arguments."""
        try:
            call = json.loads(body)
        except (json.JSONDecodeError, RecursionError):  # any text a model writes, nested however deep
            return False
        if not (isinstance(call, dict) and isinstance(call.get("name"), str) and "arguments" in call):
            return False
        arguments = call["arguments"]
        text = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
        index = self.num_calls
        self.num_calls += 1
        if self._kept(index):
            delta.tool_calls.append(ToolCallDelta(index, text, id=self._call_id(index), name=call["name"]))
        return True

    def _kept(self, index: int) -> bool:
        return self._max_calls is None or index < self._max_calls
