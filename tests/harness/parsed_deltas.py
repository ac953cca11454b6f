"""A parser's deltas for a text cut at given places, joined as an OpenAI client joins a stream's
pieces: the content, and each call's id, name and arguments. Shared by the tool and reasoning parser
tests, which check that any cutting joins to the same message as the whole text."""

from __future__ import annotations

import itertools

from openai_frontend.tools.parsers.deltas import ParsedDelta, ToolParser


def joined(parser: ToolParser, text: str, cuts: list[int]) -> tuple[str, list[list[str]]]:
    bounds = [0, *sorted(cuts), len(text)]
    deltas = [parser.feed(text[a:b]) for a, b in itertools.pairwise(bounds)] + [parser.finish()]
    return join(deltas)


def join(deltas: list[ParsedDelta]) -> tuple[str, list[list[str]]]:
    content, calls = "", {}
    for delta in deltas:
        content += delta.content
        for call in delta.tool_calls:
            if call.id is not None:
                assert call.index not in calls
                calls[call.index] = [call.id, call.name or "", ""]
            calls[call.index][2] += call.arguments
    return content, list(calls.values())
