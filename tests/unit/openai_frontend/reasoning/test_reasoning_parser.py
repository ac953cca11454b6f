"""The `<think>` reasoning parser: what it makes of an output, whether the prompt opened the thoughts
or not, and that it makes the same of it however the output is split; the grammar that lets the
thoughts run free before the answer's; the count of the thoughts' tokens."""

from __future__ import annotations

import itertools
import json
import random

import pytest
from xgrammar.testing import _is_grammar_accept_string

from common.protocol import StructuredOutput
from openai_frontend.reasoning import prompt_state, reasoning_for_template
from openai_frontend.reasoning.answer_parser import AnswerParser
from openai_frontend.reasoning.grammar import grammar_after_thoughts
from openai_frontend.reasoning.think import ThinkParser
from openai_frontend.reasoning.usage import ReasoningCounter
from openai_frontend.tools.parsers import new_parser

# name -> (output, whether the prompt opened the thoughts, its thoughts, its answer)
CASES: dict[str, tuple[str, bool, str, str]] = {
    "thoughts then answer": (
        "<think>\nhm </thin> {x}\n</think>\n\nThe answer.",
        False,
        "\nhm </thin> {x}\n",
        "The answer.",
    ),
    "blanks before the thoughts": ("\n <think>a</think>b", False, "a", "b"),
    "no thoughts": ("Just <think> an answer", False, "", "Just <think> an answer"),
    "the prompt opened them": ("so...\n</think>\n\nok", True, "so...\n", "ok"),
    "cut off while thinking": ("<think>still going </th", False, "still going </th", ""),
    "empty thoughts": ("<think></think>\n\n{}", False, "", "{}"),
}


def _split(parser: AnswerParser, text: str, cuts: list[int]) -> tuple[str, str, list[tuple[str | None, str]]]:
    bounds = [0, *sorted(cuts), len(text)]
    deltas = [parser.feed(text[a:b]) for a, b in itertools.pairwise(bounds)] + [parser.finish()]
    whole = deltas[0]
    for delta in deltas[1:]:
        whole = whole.then(delta)
    return whole.reasoning, whole.content, [(c.name, c.arguments) for c in whole.tool_calls]


@pytest.mark.parametrize("name", sorted(CASES))
def test_thoughts_split_whole_and_anywhere(name: str) -> None:
    text, opened, thoughts, answer = CASES[name]
    assert _split(AnswerParser(ThinkParser(opened), None), text, []) == (thoughts, answer, [])
    rng = random.Random(name)
    for _ in range(100):
        cuts = rng.sample(range(len(text) + 1), rng.randint(1, min(8, len(text))))
        assert _split(AnswerParser(ThinkParser(opened), None), text, cuts) == (thoughts, answer, [])


def test_calls_are_read_from_the_answer_only() -> None:
    call = '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>'
    text = '<think>maybe <tool_call>\n{"name": "no"}</think>\n\n' + call
    parser = AnswerParser(ThinkParser(False), new_parser("hermes", "r", None))
    thoughts, content, calls = _split(parser, text, [7, 30, 60])
    assert thoughts == 'maybe <tool_call>\n{"name": "no"}' and content == ""
    assert calls == [("f", ""), (None, '{"a": 1}')] and parser.made_calls


def test_where_the_prompt_leaves_the_thoughts() -> None:
    assert prompt_state("<|im_start|>assistant\n<think>\n") == "open"
    assert prompt_state("<|im_start|>assistant\n<think>\n\n</think>\n\n") == "closed"
    assert prompt_state("<|im_start|>assistant\n") == "none"
    assert reasoning_for_template("{{ '<think>' }}{{ '</think>' }}") == "think"
    # DeepSeek-R1's: the generation prompt opens the thoughts, and nothing in it closes them.
    assert (
        reasoning_for_template("{% if add_generation_prompt %}{{ '<｜Assistant｜><think>\\n' }}{% endif %}")
        == "think"
    )
    assert reasoning_for_template("{{ messages }}") is None


@pytest.mark.parametrize("opened", [False, True])
def test_the_grammar_lets_thoughts_run_before_the_schema(opened: bool) -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    output = StructuredOutput(kind="json", definition=json.dumps(schema))
    grammar = grammar_after_thoughts(output, opened).definition
    start = "" if opened else "<think>"
    assert _is_grammar_accept_string(grammar, start + 'free {"a": "x"} text\n</think>\n\n{"a": 1}')
    assert not _is_grammar_accept_string(grammar, start + 'thoughts</think>{"a": "x"}')
    assert _is_grammar_accept_string(grammar, '{"a": 1}') is not opened  # thoughts are optional unless opened


def test_the_thoughts_tokens_are_counted() -> None:
    texts = ["<think>", "a", "b", "</think>", "\n\n", "ans", "wer"]
    counter = ReasoningCounter(False, lambda token_id: texts[token_id])
    counter.add([0, 1, 2])
    counter.add([3, 4, 5, 6])
    assert counter.num_tokens == 4
    plain = ReasoningCounter(False, lambda token_id: texts[token_id])
    plain.add([5, 6])
    assert plain.num_tokens == 0
    opened = ReasoningCounter(True, lambda token_id: texts[token_id])
    opened.add([1, 2, 3, 4, 5])
    assert opened.num_tokens == 3
