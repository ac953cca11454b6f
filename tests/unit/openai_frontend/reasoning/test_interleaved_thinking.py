"""A thinking model with tools: it thinks, then calls (and after the results thinks again). The
`<think>` parser goes first and each format's tool parser reads the answer after the thoughts, so
streamed pieces, cut anywhere, join to the whole answer's thoughts, content and calls."""

from __future__ import annotations

import itertools
import random

import pytest

from openai_frontend.reasoning.answer_parser import AnswerParser
from openai_frontend.reasoning.think import ThinkParser
from openai_frontend.tools.parsers import new_parser

ARGS = '{"city": "Paris"}'
THOUGHTS = "The user wants weather; <tool_call> comes next."
CALLS = {
    "hermes": '<tool_call>\n{"name": "get_weather", "arguments": ' + ARGS + "}\n</tool_call>",
    "llama3_json": '<|python_tag|>{"name": "get_weather", "parameters": ' + ARGS + "}",
    "mistral": '[TOOL_CALLS][{"name": "get_weather", "arguments": ' + ARGS + "}]",
    "qwen3_xml": "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
    "</function>\n</tool_call>",
}


def _read(parser: str, text: str, cuts: list[int]) -> tuple[str, str, list[tuple[str, str]]]:
    answer = AnswerParser(ThinkParser(False), new_parser(parser, "r", None, {"get_weather": ["city"]}))
    bounds = [0, *sorted(cuts), len(text)]
    deltas = [answer.feed(text[a:b]) for a, b in itertools.pairwise(bounds)] + [answer.finish()]
    reasoning, content, calls = "", "", dict[int, list[str]]()
    for delta in deltas:
        reasoning, content = reasoning + delta.reasoning, content + delta.content
        for call in delta.tool_calls:
            calls.setdefault(call.index, [call.name or "", ""])[1] += call.arguments
    return reasoning, content, [(name, arguments) for name, arguments in calls.values()]


@pytest.mark.parametrize("parser", sorted(CALLS))
def test_thoughts_then_a_call_streamed_anywhere(parser: str) -> None:
    text = f"<think>{THOUGHTS}</think>\n\n{CALLS[parser]}"
    whole = _read(parser, text, [])
    assert whole[:2] == (THOUGHTS, "") and [name for name, _ in whole[2]] == ["get_weather"]
    assert whole[2][0][1].replace(" ", "") == ARGS.replace(" ", "")
    rng = random.Random(parser)
    for _ in range(60):
        assert _read(parser, text, rng.sample(range(len(text) + 1), rng.randint(1, 10))) == whole


def test_after_the_result_it_thinks_again() -> None:
    """The next turn (the call's result in the prompt) opens new thoughts and answers."""
    text = "<think>It is sunny in Paris.</think>\n\nSunny, 21 degrees."
    assert _read("hermes", text, [5, 40]) == ("It is sunny in Paris.", "Sunny, 21 degrees.", [])
