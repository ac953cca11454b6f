"""`<think>` … `</think>` read incrementally: the thoughts become `reasoning_content`, the rest the
answer. One parser serves streams and whole answers, so streamed pieces join to the message.

As vLLM's deepseek_r1 / qwen3 parsers: an output that starts (after blanks) with `<think>`, or one
whose prompt opened the thoughts, thinks until `</think>`; one that does not is all answer. Thoughts
cut off by max_tokens stay thoughts. The blanks between `</think>` and the answer belong to neither.
"""

from __future__ import annotations

from openai_frontend.reasoning import CLOSE, OPEN
from openai_frontend.reasoning.buffered import BufferedParser, held
from openai_frontend.tools.parsers.deltas import ParsedDelta


class ThinkParser(BufferedParser):
    def __init__(self, open_in_prompt: bool) -> None:
        super().__init__()
        # "start": not yet known whether the output thinks; "thoughts"; "blanks": just after
        # `</think>`; "answer".
        self._state = "thoughts" if open_in_prompt else "start"
        self.num_reasoning_chars = 0  # given out as thoughts so far

    @property
    def thinking(self) -> bool:
        """Whether the text so far may still be thoughts (the answer has not begun)."""
        return self._state in ("start", "thoughts")

    @property
    def in_thoughts(self) -> bool:
        return self._state == "thoughts"

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
                decided = len(self._buffer) - (0 if final else held(self._buffer, (CLOSE,)))
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
