"""`<think>` … `</think>` read incrementally: the thoughts become `reasoning_content`, the rest the
answer. One parser serves streams and whole answers, so streamed pieces join to the message.

As vLLM's deepseek_r1 / qwen3 parsers: an output that starts (after blanks) with `<think>`, or one
whose prompt opened the thoughts, thinks until `</think>`; one that does not is all answer. Thoughts
cut off by max_tokens stay thoughts. The blanks between `</think>` and the answer belong to neither.
"""

from __future__ import annotations

from openai_frontend.reasoning import CLOSE, OPEN
from openai_frontend.tools.parsers.deltas import ParsedDelta


def _held(text: str, tag: str) -> int:
    """Length of the longest end of `text` that could begin `tag`."""
    return next((k for k in range(min(len(text), len(tag) - 1), 0, -1) if text.endswith(tag[:k])), 0)


class ThinkParser:
    def __init__(self, open_in_prompt: bool) -> None:
        # "start": not yet known whether the output thinks; "thoughts"; "blanks": just after
        # `</think>`; "answer".
        self._state = "thoughts" if open_in_prompt else "start"
        self._buffer = ""
        self.num_reasoning_chars = 0  # given out as thoughts so far

    @property
    def thinking(self) -> bool:
        """Whether the text so far may still be thoughts (the answer has not begun)."""
        return self._state in ("start", "thoughts")

    @property
    def in_thoughts(self) -> bool:
        return self._state == "thoughts"

    def feed(self, text: str) -> ParsedDelta:
        self._buffer += text
        return self._step(final=False)

    def finish(self) -> ParsedDelta:
        return self._step(final=True)

    def _step(self, final: bool) -> ParsedDelta:
        delta = ParsedDelta()
        if self._state == "start":
            stripped = self._buffer.lstrip()
            if stripped.startswith(OPEN):
                self._state, self._buffer = "thoughts", stripped[len(OPEN) :]
            elif not final and OPEN.startswith(stripped):
                return delta  # blanks or the start of `<think>`: not decided yet
            else:
                self._state = "answer"
        if self._state == "thoughts":
            end = self._buffer.find(CLOSE)
            if end < 0:
                decided = len(self._buffer) - (0 if final else _held(self._buffer, CLOSE))
                delta.reasoning, self._buffer = self._buffer[:decided], self._buffer[decided:]
                self.num_reasoning_chars += len(delta.reasoning)
                return delta
            delta.reasoning, self._buffer = self._buffer[:end], self._buffer[end + len(CLOSE) :]
            self.num_reasoning_chars += len(delta.reasoning)
            self._state = "blanks"
        if self._state == "blanks":
            self._buffer = self._buffer.lstrip()
            if not self._buffer:
                return delta
            self._state = "answer"
        delta.content, self._buffer = self._buffer, ""
        return delta
