"""The interface every reasoning format's parser has, and the parser for a format's name."""

from __future__ import annotations

from typing import Protocol

from openai_frontend.reasoning import HARMONY
from openai_frontend.reasoning.harmony import HarmonyParser
from openai_frontend.reasoning.think import ThinkParser
from openai_frontend.tools.parsers.deltas import ParsedDelta


class ReasoningParser(Protocol):
    @property
    def thinking(self) -> bool:
        """Whether thoughts may still come (usage counts tokens until they cannot)."""
        ...

    @property
    def in_thoughts(self) -> bool: ...

    def feed(self, text: str) -> ParsedDelta: ...

    def finish(self) -> ParsedDelta: ...


def new_reasoning_parser(name: str, open_in_prompt: bool) -> ReasoningParser:
    """A parser for one choice of a model whose thoughts `name` tells apart."""
    return HarmonyParser() if name == HARMONY else ThinkParser(open_in_prompt)
