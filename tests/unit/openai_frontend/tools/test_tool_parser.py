"""The Hermes tool parser: what it makes of an output, and that it makes the same of it however the
output is split into deltas (a stream's pieces always add up to the non-streamed message)."""

from __future__ import annotations

import random

import pytest

from harness.gateway.parsed_deltas import joined
from openai_frontend.tools.parsers import new_parser, parser_for_template
from openai_frontend.tools.parsers.hermes import HermesToolParser

CALL = '<tool_call>\n{"name": "get", "arguments": {"a": {"b": "x}"}, "c": [1, 2]}}\n</tool_call>'
# name -> (output, its content, its calls as (name, arguments))
CASES: dict[str, tuple[str, str, list[tuple[str, str]]]] = {
    "plain text, kept exactly": ("  no calls <tool but text  ", "  no calls <tool but text  ", []),
    "text then calls": (
        "Hi there.\n" + CALL + '\n<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call>\n',
        "Hi there.",
        [("get", '{"a": {"b": "x}"}, "c": [1, 2]}'), ("now", "{}")],
    ),
    "text around a call": (
        'pre <tool_call>{"name": "f", "arguments": {"q": "</tool"}}</tool_call>\n\npost',
        "pre post",
        [("f", '{"q": "</tool"}')],
    ),
    "arguments before the name": (
        '<tool_call>\n{"arguments": {"x": 1}, "name": "g"}\n</tool_call>',
        "",
        [("g", '{"x": 1}')],
    ),
    "a block that is no call": (
        "<tool_call>\nnot json\n</tool_call> tail",
        "<tool_call>\nnot json\n</tool_call> tail",
        [],
    ),
    "cut off by max_tokens": ('<tool_call>\n{"name": "get", "arguments": {"a": 1', "", [("get", '{"a": 1')]),
    "cut off before the head": ('ok <tool_call>\n{"na', 'ok <tool_call>\n{"na', []),
    "a name with a bad escape": (
        '<tool_call>{"name": "a\\q", "arguments": {}}</tool_call>',
        '<tool_call>{"name": "a\\q", "arguments": {}}</tool_call>',
        [],
    ),
    "escaped name": ('<tool_call>{"name": "a\\"b", "arguments": {}}</tool_call>', "", [('a"b', "{}")]),
}


def _parse(text: str, cuts: list[int], max_calls: int | None = None) -> tuple[str, list[list[str]]]:
    return joined(HermesToolParser(lambda i: f"call_{i}", max_calls), text, cuts)


@pytest.mark.parametrize("name", sorted(CASES))
def test_parse_whole_and_split_anywhere(name: str) -> None:
    text, expected_content, calls = CASES[name]
    content, found = _parse(text, [])
    assert content == expected_content
    assert [(n, a) for _, n, a in found] == calls
    assert [i for i, _, _ in found] == [f"call_{k}" for k in range(len(calls))]
    assert _parse(text, list(range(len(text) + 1))) == (content, found)  # one character at a time
    rng = random.Random(name)
    for _ in range(200):
        cuts = rng.sample(range(len(text) + 1), rng.randint(1, min(8, len(text))))
        assert _parse(text, cuts) == (content, found)


def test_max_calls_drops_later_calls() -> None:
    text, _, _ = CASES["text then calls"]
    content, found = _parse(text, [], max_calls=1)
    assert content == "Hi there." and [n for _, n, _ in found] == ["get"]


def test_call_ids_derive_from_the_request() -> None:
    def first_id(req_id: str) -> str | None:
        return new_parser("hermes", req_id, None).feed(CALL).tool_calls[0].id

    assert first_id("r1") == first_id("r1") != first_id("r2")
    assert (first_id("r1") or "").startswith("call_") and "r1" not in (first_id("r1") or "")


def test_parser_follows_the_template() -> None:
    assert parser_for_template("{% for t in tools %}<tool_call>{% endfor %}") == "hermes"
    assert parser_for_template("{% for m in messages %}{{ m.content }}{% endfor %}") is None
    assert parser_for_template(None) is None
