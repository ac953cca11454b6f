"""gpt-oss's harmony channels read incrementally: an `analysis` message becomes `reasoning_content`,
a `final` (or a `commentary` preamble) message the content, and a message to a function
(`<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}<|call|>`) goes to the
answer whole, markers and all, for the harmony tool parser (tools/parsers/harmony.py) to read.

The output starts after the prompt's `<|start|>assistant`: headers up to `<|message|>`, bodies up to
`<|end|>`, `<|call|>` or `<|return|>`. An output that opens no header is all answer, as vLLM's
harmony parser reads text outside messages. Thoughts cut off by max_tokens stay thoughts.
"""

from __future__ import annotations

import regex

from openai_frontend.reasoning.buffered import BufferedParser, held
from openai_frontend.tools.parsers.deltas import ParsedDelta

START, CHANNEL, MESSAGE = "<|start|>", "<|channel|>", "<|message|>"
END, CALL, RETURN = "<|end|>", "<|call|>", "<|return|>"
ANALYSIS = "analysis"
_BODY_ENDS = (END, CALL, RETURN, START)
_CHANNEL = regex.compile(r"<\|channel\|>\s*(\w+)")
_TO_FUNCTION = regex.compile(r"\bto=functions\.")


class HarmonyParser(BufferedParser):
    def __init__(self) -> None:
        super().__init__()  # the prompt ends in `<|start|>assistant`: the output starts outside messages
        # "between": before a header, "header", "body" (of `_mode`: reasoning, content, call), "plain".
        self._state = "between"
        self._mode = "content"

    @property
    def thinking(self) -> bool:
        """Whether thoughts may still come (an output of plain text has none)."""
        return self._state != "plain"

    @property
    def in_thoughts(self) -> bool:
        return self._state == "body" and self._mode == "reasoning"

    def _step(self, final: bool) -> ParsedDelta:
        delta = ParsedDelta()
        while self._buffer:
            if self._state == "between" and not self._between(final):
                break
            if self._state == "header" and not self._header(delta, final):
                break
            if self._state == "body" and not self._body(delta, final):
                break
            if self._state == "plain":
                delta.content, self._buffer = delta.content + self._buffer, ""
        return delta

    def _between(self, final: bool) -> bool:
        text = self._buffer.lstrip()
        if text.startswith((START, CHANNEL)):
            self._state, self._buffer = "header", text
        elif not final and (START.startswith(text) or CHANNEL.startswith(text)):
            return False  # blanks or the start of a header: not decided yet
        else:
            self._state = "plain"
        return True

    def _header(self, delta: ParsedDelta, final: bool) -> bool:
        end = self._buffer.find(MESSAGE)
        if end < 0:
            if final:  # a header cut off: its text is all there is
                self._state = "plain"
                return True
            return False
        header, self._buffer = self._buffer[: end + len(MESSAGE)], self._buffer[end + len(MESSAGE) :]
        channel = _CHANNEL.search(header)
        if _TO_FUNCTION.search(header):
            self._mode = "call"
            delta.content += header
        else:
            self._mode = "reasoning" if channel is not None and channel.group(1) == ANALYSIS else "content"
        self._state = "body"
        return True

    def _body(self, delta: ParsedDelta, final: bool) -> bool:
        found = [(i, tag) for tag in _BODY_ENDS if (i := self._buffer.find(tag)) >= 0]
        if not found:
            decided = len(self._buffer) - (0 if final else held(self._buffer, _BODY_ENDS))
            self._give(delta, self._buffer[:decided])
            self._buffer = self._buffer[decided:]
            return False
        end, tag = min(found)
        self._give(delta, self._buffer[:end])
        if tag == START:
            self._buffer = self._buffer[end:]
        else:
            if self._mode == "call":
                delta.content += tag  # the call's end, for the tool parser
            self._buffer = self._buffer[end + len(tag) :]
        self._state = "between"
        return True

    def _give(self, delta: ParsedDelta, text: str) -> None:
        if self._mode == "reasoning":
            delta.reasoning += text
        else:
            delta.content += text
