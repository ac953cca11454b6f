"""Streaming by re-reading: a format says what the whole text so far holds (content decided, calls
with their arguments so far), and this parser gives out what each new piece of text added.

A format's reading only ever grows (decided content and each call's arguments are prefixes of what
the longer text gives), so the streamed pieces join exactly to the whole answer's message, and the
format's code is the same for both. Re-reading costs a pass over the text per piece: answers with
tools are short, and a pass is a regex search until calls begin.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from openai_frontend.tools.parsers.deltas import ParsedDelta, ToolCallDelta


@dataclass(slots=True)
class Call:
    name: str
    arguments: str  # JSON text so far: the model's own, or built from its format (then in pieces)


@dataclass(slots=True)
class Reading:
    content: str = ""  # decided so far; text that may still open a call is held back
    calls: list[Call] = field(default_factory=list)


# (the text so far, whether it is the whole output) -> what it holds
ReadFn = Callable[[str, bool], Reading]


def blanks_held(content: str, final: bool, calls_follow: bool) -> str:
    """Blanks that touch calls separate them and are not content; trailing blanks of a stream are
    held until more text says whether a call follows."""
    return content.rstrip() if calls_follow or not final else content


class SnapshotToolParser:
    """Feed a choice's text as it arrives; each feed returns what it adds to the message."""

    def __init__(
        self,
        read: ReadFn,
        call_id: Callable[[int], str],
        max_calls: int | None = None,
        call_end: str | None = None,
    ) -> None:
        self._read = read
        self._call_id = call_id
        self._max_calls = max_calls  # None: any number; 1 with parallel_tool_calls false
        self.call_end = call_end
        self._text = ""
        self._num_content = 0  # characters of content given out
        self._num_sent: list[int] = []  # per call: characters of its arguments given out

    def feed(self, text: str) -> ParsedDelta:
        self._text += text
        return self._delta(self._read(self._text, False))

    def finish(self) -> ParsedDelta:
        return self._delta(self._read(self._text, True))

    @property
    def num_calls(self) -> int:
        return len(self._num_sent)

    @property
    def made_calls(self) -> bool:
        return self.num_calls > 0

    def _delta(self, reading: Reading) -> ParsedDelta:
        delta = ParsedDelta(content=reading.content[self._num_content :])
        self._num_content = max(self._num_content, len(reading.content))
        for index, call in enumerate(reading.calls):
            kept = self._max_calls is None or index < self._max_calls
            if index == len(self._num_sent):
                self._num_sent.append(0)
                if kept:
                    delta.tool_calls.append(ToolCallDelta(index, "", id=self._call_id(index), name=call.name))
            piece = call.arguments[self._num_sent[index] :]
            self._num_sent[index] = max(self._num_sent[index], len(call.arguments))
            if piece and kept:
                delta.tool_calls.append(ToolCallDelta(index, piece))
        return delta
