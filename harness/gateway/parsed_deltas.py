"""A parser's deltas for a text cut at given places, joined as an OpenAI client joins a stream's
pieces: the content, and each call's id, name and arguments. Shared by the tool and reasoning parser
tests, which check that any cutting joins to the same message as the whole text."""

from __future__ import annotations

import itertools
from typing import Any

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


def sdk_stream(stream: Any) -> dict[int, dict[str, Any]]:
    """Each choice of an `openai` SDK chat stream, joined as clients join it: its thoughts
    (vLLM's `reasoning_content`), content, calls ([id, name, arguments] by index), finish reason and
    number of tokens (with logprobs)."""
    choices: dict[int, dict[str, Any]] = {}
    for chunk in stream:
        for c in chunk.choices:
            got = choices.setdefault(
                c.index, {"reasoning": "", "content": "", "calls": {}, "finish": None, "tokens": 0}
            )
            got["reasoning"] += getattr(c.delta, "reasoning_content", None) or ""
            got["content"] += c.delta.content or ""
            for call in c.delta.tool_calls or []:
                if call.id is not None:
                    assert call.index not in got["calls"] and call.type == "function"
                    got["calls"][call.index] = [call.id, call.function.name, ""]
                else:
                    assert call.function.name is None
                got["calls"][call.index][2] += call.function.arguments or ""
            got["tokens"] += len(c.logprobs.content or []) if c.logprobs else 0
            got["finish"] = c.finish_reason or got["finish"]
    return choices


def forced_call(choice: Any) -> Any:
    """The one call of an SDK chat choice whose call was forced (parallel_tool_calls false)."""
    assert choice.finish_reason == "tool_calls", choice.message
    [call] = choice.message.tool_calls or []
    assert call.id.startswith("call_") and call.type == "function"
    return call
