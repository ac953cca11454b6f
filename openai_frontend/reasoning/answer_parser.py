"""A choice's text read into what its message holds: thoughts (reasoning_content), content and tool
calls. The reasoning parser goes first; the answer after the thoughts goes to the tool parser."""

from __future__ import annotations

from openai_frontend.reasoning.parser import ReasoningParser
from openai_frontend.tools.parsers.deltas import ParsedDelta, ToolParser


class AnswerParser:
    def __init__(self, reasoning: ReasoningParser | None, tools: ToolParser | None) -> None:
        self._reasoning = reasoning
        self._tools = tools
        self.call_end = tools.call_end if tools is not None else None

    @property
    def made_calls(self) -> bool:
        return self._tools is not None and self._tools.made_calls

    @property
    def thinking(self) -> bool:
        """Whether the thoughts may still go on (usage counts the tokens until they end)."""
        return self._reasoning is not None and self._reasoning.thinking

    def feed(self, text: str) -> ParsedDelta:
        split = self._reasoning.feed(text) if self._reasoning is not None else ParsedDelta(content=text)
        return self._answer(split, final=False)

    def finish(self) -> ParsedDelta:
        split = self._reasoning.finish() if self._reasoning is not None else ParsedDelta()
        return self._answer(split, final=True)

    def _answer(self, split: ParsedDelta, final: bool) -> ParsedDelta:
        if self._tools is None:
            return split
        parsed = self._tools.feed(split.content) if split.content else ParsedDelta()
        if final:
            parsed = parsed.then(self._tools.finish())
        parsed.reasoning = split.reasoning
        return parsed
