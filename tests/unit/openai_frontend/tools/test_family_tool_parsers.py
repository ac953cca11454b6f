"""The tool-call parsers of each family's format: what each makes of an output, and that it makes
the same of it however the output is split into deltas (a stream's pieces join to the whole answer)."""

from __future__ import annotations

import random

import pytest

from harness.gateway.parsed_deltas import joined
from openai_frontend.tools.parsers import new_parser, parser_for_template

WEATHER = '{"city": "Paris", "unit": "c"}'
# (parser, output) -> (its content, its calls as (name, arguments))
CASES: dict[str, tuple[str, str, str, list[tuple[str, str]]]] = {
    "llama3 one call": (
        "llama3_json",
        '{"name": "get_weather", "parameters": ' + WEATHER + "}",
        "",
        [("get_weather", WEATHER)],
    ),
    "llama3 python_tag, two calls": (
        "llama3_json",
        '<|python_tag|>{"name": "a", "parameters": {"q": "}{"}}; {"name": "now", "arguments": {}}',
        "",
        [("a", '{"q": "}{"}'), ("now", "{}")],
    ),
    "llama3 text": ("llama3_json", "The weather is {fine}. ", "The weather is {fine}. ", []),
    "llama3 JSON that is no call": ("llama3_json", '{"city": "Paris"}', '{"city": "Paris"}', []),
    "llama3 cut off": ("llama3_json", '{"name": "f", "parameters": {"a": [1, ', "", [("f", '{"a": [1, ')]),
    "pythonic two calls": (
        "pythonic",
        '[get_weather(city="Paris", unit=\'c\'), now(), f(x=[1, -2.5], y={"k": None}, z=true)]',
        "",
        [("get_weather", WEATHER), ("now", "{}"), ("f", '{"x": [1, -2.5], "y": {"k": null}, "z": true}')],
    ),
    "pythonic a paren in a string": ("pythonic", '[f(s=")]\\"(")]', "", [("f", '{"s": ")]\\"("}')]),
    "pythonic text": ("pythonic", "[1, 2] is a list", "[1, 2] is a list", []),
    "mistral list": (
        "mistral",
        'Sure. [TOOL_CALLS][{"name": "get_weather", "arguments": ' + WEATHER + ', "id": "abc123def"}, '
        '{"name": "now", "arguments": {}}]',
        "Sure.",
        [("get_weather", WEATHER), ("now", "{}")],
    ),
    "mistral text with brackets": ("mistral", "[TOOL] [CALLS] x", "[TOOL] [CALLS] x", []),
    "mistral v11": (
        "mistral_v11",
        "[TOOL_CALLS]get_weather[ARGS]" + WEATHER + "[TOOL_CALLS]now[ARGS]{}",
        "",
        [("get_weather", WEATHER), ("now", "{}")],
    ),
    "qwen3 xml": (
        "qwen3_xml",
        "Let me check.\n<tool_call>\n<function=get_weather>\n<parameter=city>\n12 Rue\n</parameter>\n"
        '<parameter=days>\n3\n</parameter>\n<parameter=opts>\n{"a": [1]}\n</parameter>\n</function>\n'
        "</tool_call>\n<tool_call>\n<function=now>\n</function>\n</tool_call>",
        "Let me check.",
        [("get_weather", '{"city": "12 Rue", "days": 3, "opts": {"a": [1]}}'), ("now", "{}")],
    ),
    "qwen3 xml string that looks like a number": (
        "qwen3_xml",
        "<tool_call>\n<function=get_weather>\n<parameter=city>\n123\n</parameter>\n</function>\n</tool_call>",
        "",
        [("get_weather", '{"city": "123"}')],
    ),
    "qwen3 xml text": ("qwen3_xml", "a <tool_call> b", "a <tool_call> b", []),
    "deepseek v3": (
        "deepseek_v3",
        "Checking.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
        + WEATHER
        + "\n```<｜tool▁call▁end｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>now\n```json\n{}\n```"
        "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        "Checking.",
        [("get_weather", WEATHER), ("now", "{}")],
    ),
    "deepseek v3.1": (
        "deepseek_v31",
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>"
        + WEATHER
        + "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        "",
        [("get_weather", WEATHER)],
    ),
}
STRINGS = {"get_weather": ["city"]}


def _parse(parser_name: str, text: str, cuts: list[int]) -> tuple[str, list[list[str]]]:
    return joined(new_parser(parser_name, "req", None, STRINGS), text, cuts)


@pytest.mark.parametrize("name", sorted(CASES))
def test_parse_whole_and_split_anywhere(name: str) -> None:
    parser_name, text, expected_content, expected_calls = CASES[name]
    content, found = _parse(parser_name, text, [])
    assert content == expected_content
    assert [(n, a) for _, n, a in found] == expected_calls
    assert _parse(parser_name, text, list(range(len(text) + 1))) == (content, found)
    rng = random.Random(name)
    for _ in range(100):
        cuts = rng.sample(range(len(text) + 1), rng.randint(1, min(8, len(text))))
        assert _parse(parser_name, text, cuts) == (content, found)


def test_max_calls_drops_later_calls() -> None:
    parser = new_parser("pythonic", "req", 1)
    delta = parser.feed("[a(), b(x=1)]")
    assert [c.name for c in delta.tool_calls if c.id] == ["a"]
    assert parser.made_calls


@pytest.mark.parametrize(
    ("template", "parser"),
    [
        ("{{ tools }} {{ '<|python_tag|>' }}", "llama3_json"),
        ('{{ tools }} "parameters": dictionary of argument name and its value', "llama3_json"),
        ("{{ tools }} [func_name1(params_name1=params_value1)]", "pythonic"),
        ("{{ tools }} [TOOL_CALLS][", "mistral"),
        ("{{ tools }} [TOOL_CALLS]{{ name }}[ARGS]", "mistral_v11"),
        ("{{ tools }} <tool_call><function=x><parameter=y>", "qwen3_xml"),
        ("{{ tool_calls }} <｜tool▁calls▁begin｜> ```json", "deepseek_v3"),
        ("{{ tool_calls }} <｜tool▁calls▁begin｜>", "deepseek_v31"),
        ("{{ tools }} <tool_call>", "hermes"),
        ("{{ tools }} <tool_call>{{ name }}<arg_key>", None),
        ("{{ messages }}", None),
    ],
)
def test_the_template_names_the_format(template: str, parser: str | None) -> None:
    assert parser_for_template(template) == parser
