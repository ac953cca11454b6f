"""gpt-oss's harmony format: the channel parser (analysis thoughts, final answer, messages to
functions) and the tool parser after it, whole and however the output is split; the template signs
that pick them; the grammars that force calls (and let the analysis run first); the count of the
thoughts' tokens."""

from __future__ import annotations

import itertools
import json
import random
from typing import Any

import pytest
from xgrammar.testing import _is_grammar_accept_string

from common.protocol import StructuredOutput
from harness.models.tiny_model import TEMPLATES
from openai_frontend.reasoning import REASONING_PARSERS, chosen, reasoning_for_template
from openai_frontend.reasoning.answer_parser import AnswerParser
from openai_frontend.reasoning.grammar import harmony_after_thoughts
from openai_frontend.reasoning.harmony import HarmonyParser
from openai_frontend.reasoning.usage import ReasoningCounter
from openai_frontend.tools.parsers import (
    PARSERS,
    chosen_parser,
    forced_grammar,
    new_parser,
    parser_for_template,
    strict_grammar,
)

ARGS = '{"city": "Paris", "q": "<|end|> }{"}'
CALL = "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>" + ARGS + "<|call|>"
# name -> (output, its thoughts, its content, its calls as (name, arguments))
CASES: dict[str, tuple[str, str, str, list[tuple[str, str]]]] = {
    "thoughts then answer": (
        "<|channel|>analysis<|message|>User says hi.<|end|>"
        "<|start|>assistant<|channel|>final<|message|>Hello!",
        "User says hi.",
        "Hello!",
        [],
    ),
    "thoughts then a call": (
        "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant" + CALL,
        "Need weather.",
        "",
        [("get_weather", ARGS)],
    ),
    "recipient before the channel": (
        "<|start|>assistant to=functions.now<|channel|>commentary json<|message|>{}",
        "",
        "",
        [("now", "{}")],
    ),
    "a preamble then two calls": (
        "<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant"
        + CALL
        + "<|start|>assistant<|channel|>commentary to=functions.now <|constrain|>json<|message|>{}<|call|>",
        "",
        "Checking.",
        [("get_weather", ARGS), ("now", "{}")],
    ),
    "no header: all answer": ("Just <|channel text", "", "Just <|channel text", []),
    "cut off while thinking": ("<|channel|>analysis<|message|>still <|en", "still <|en", "", []),
    "a call cut off": (
        '<|channel|>commentary to=functions.f <|constrain|>json<|message|>{"a": [1, ',
        "",
        "",
        [("f", '{"a": [1, ')],
    ),
}


def _split(text: str, cuts: list[int], tools: bool = True) -> tuple[str, str, list[tuple[str, str]]]:
    parser = AnswerParser(HarmonyParser(), new_parser("harmony", "r", None) if tools else None)
    bounds = [0, *sorted(cuts), len(text)]
    deltas = [parser.feed(text[a:b]) for a, b in itertools.pairwise(bounds)] + [parser.finish()]
    whole = deltas[0]
    for delta in deltas[1:]:
        whole = whole.then(delta)
    calls: dict[int, list[str]] = {}
    for call in whole.tool_calls:
        calls.setdefault(call.index, [call.name or "", ""])[1] += call.arguments
    return whole.reasoning, whole.content, [(name, arguments) for name, arguments in calls.values()]


@pytest.mark.parametrize("name", sorted(CASES))
def test_channels_and_calls_split_whole_and_anywhere(name: str) -> None:
    text, thoughts, content, calls = CASES[name]
    assert _split(text, []) == (thoughts, content, calls)
    rng = random.Random(name)
    for _ in range(100):
        cuts = rng.sample(range(len(text) + 1), rng.randint(1, min(10, len(text))))
        assert _split(text, cuts) == (thoughts, content, calls)


def test_without_tools_a_call_stays_in_the_answer() -> None:
    text = "<|channel|>analysis<|message|>x<|end|><|start|>assistant" + CALL
    assert _split(text, [], tools=False) == ("x", "<|start|>assistant" + CALL, [])


def test_the_tool_parser_alone_leaves_the_other_messages_in_the_content() -> None:
    parser = new_parser("harmony", "r", None)
    text = "<|channel|>analysis<|message|>x<|end|><|start|>assistant" + CALL
    delta = parser.feed(text).then(parser.finish())
    assert delta.content == "<|channel|>analysis<|message|>x<|end|>"
    assert [c.name for c in delta.tool_calls if c.name] == ["get_weather"] and parser.made_calls


def test_the_template_picks_harmony() -> None:
    template = (TEMPLATES / "gpt_oss.jinja").read_text()
    assert parser_for_template(template) == "harmony"
    assert reasoning_for_template(template) == "harmony"
    # gpt-oss's own template writes the recipient in pieces.
    gpt_oss = (
        """{{- "<|start|>assistant to=" }}{{- "functions." + tool_call.name + "<|channel|>commentary " }}"""
    )
    assert parser_for_template(gpt_oss + "{{ tools }}") == "harmony"
    # GATEWAY_TOOL_PARSER / GATEWAY_REASONING_PARSER name it for a template that is not recognised.
    assert "harmony" in PARSERS and "harmony" in REASONING_PARSERS
    assert chosen_parser("harmony", "{{ messages }}") == chosen("harmony", "{{ messages }}") == "harmony"


FUNCTIONS: list[dict[str, Any]] = [
    {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"enum": ["Paris"]}}}},
    {"name": "now"},
]


def test_a_forced_call_may_think_first() -> None:
    forced = StructuredOutput(kind="grammar", definition=forced_grammar("harmony", FUNCTIONS, one_call=True))
    grammar = harmony_after_thoughts(forced, forced_calls=True).definition
    call = "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
    assert _is_grammar_accept_string(grammar, call + '{"city": "Paris"}')
    thought = "<|channel|>analysis<|message|>Paris, {surely}.<|end|><|start|>assistant"
    assert _is_grammar_accept_string(grammar, thought + call + '{"city": "Paris"}')
    assert not _is_grammar_accept_string(grammar, call + '{"city": "Rome"}')
    assert not _is_grammar_accept_string(grammar, "<|channel|>final<|message|>hi")
    # The grammar ends with the arguments: `<|call|>`, gpt-oss's stop token, ends the output.
    assert not _is_grammar_accept_string(grammar, call + '{"city": "Paris"}<|call|>')
    now = "<|channel|>commentary to=functions.now <|constrain|>json<|message|>{}"
    several = forced_grammar("harmony", FUNCTIONS, one_call=False)
    assert _is_grammar_accept_string(several, call + '{"city": "Paris"}<|call|><|start|>assistant' + now)
    # The thoughts end at their first `<|end|>`, as the parser reads them.
    assert not _is_grammar_accept_string(grammar, "<|channel|>analysis<|message|>a<|end|>b<|end|>" + call)


def test_strict_auto_checks_each_call_opened() -> None:
    grammar = strict_grammar("harmony", [{**FUNCTIONS[0], "strict": True}], one_call=True)
    call = "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
    assert _is_grammar_accept_string(grammar, "Free text.")
    assert _is_grammar_accept_string(grammar, call + '{"city": "Paris"}')
    assert not _is_grammar_accept_string(grammar, call + '{"city": "Rome"}')


def test_a_schema_applies_to_the_final_message() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    output = StructuredOutput(kind="json", definition=json.dumps(schema))
    grammar = harmony_after_thoughts(output, forced_calls=False).definition
    thought = "<|channel|>analysis<|message|>{a: x}<|end|><|start|>assistant"
    assert _is_grammar_accept_string(grammar, thought + '<|channel|>final<|message|>{"a": 1}')
    assert _is_grammar_accept_string(grammar, '<|channel|>final<|message|>{"a": 1}')
    assert not _is_grammar_accept_string(grammar, '<|channel|>final<|message|>{"a": "x"}')


def test_the_analysis_tokens_are_counted() -> None:
    texts = ["<|channel|>", "analysis", "<|message|>", "a", "b", "<|end|>", "<|start|>", "assistant", "final"]
    counter = ReasoningCounter(False, lambda token_id: texts[token_id], "harmony")
    counter.add([0, 1, 2, 3, 4, 5, 6, 7, 0, 8, 2, 3])
    assert counter.num_tokens == 4  # <|message|> a b <|end|>
