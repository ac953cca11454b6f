"""Structured outputs and forced tool calls for a model that thinks: the grammar lets it think freely
until `</think>`, then applies to the answer, as vLLM's reasoning-aware structured outputs do. Here it
is one grammar (a structural tag written out as EBNF): thoughts, a few blanks, then the request's own
grammar, so the worker needs nothing new. Thoughts are optional unless the prompt opened them.

Harmony (gpt-oss): an optional `analysis` message, then the answer in a `final` message, or, for
forced calls, the calls' own messages (their grammar writes their headers)."""

from __future__ import annotations

import json
from typing import Any

import msgspec

from common.grammar import GrammarError, build_grammar
from common.protocol import SamplingParams, StructuredOutput
from openai_frontend.reasoning import CLOSE, HARMONY, OPEN
from openai_frontend.reasoning.harmony import ANALYSIS, CHANNEL, END, MESSAGE, START
from openai_frontend.reasoning.request import Thinking

# xgrammar 0.2 spells a bounded string with characters that let raw control characters in; the
# worker masks those in JSON outputs, which this one is no longer (see tools/parsers/hermes_grammar.py).
_BOUNDED_CHAR = '[^\\"\\\\\\r\\n]'
_JSON_CHAR = '[^\\0-\\x1f\\"\\\\]'
_BLANKS = {"type": "regex", "pattern": "[ \\n]{0,4}"}  # between `</think>` and the answer
# An analysis message ends at its first `<|end|>`, as the harmony parser reads it.
_HARMONY_THOUGHTS = {
    "type": "optional",
    "content": {
        "type": "sequence",
        "elements": [
            {
                "type": "tag",
                "begin": f"{CHANNEL}{ANALYSIS}{MESSAGE}",
                "content": {"type": "any_text", "excludes": [CHANNEL]},  # no header inside the thoughts
                "end": END,
            },
            {"type": "const_string", "value": f"{START}assistant"},
        ],
    },
}
_HARMONY_FINAL = {"type": "const_string", "value": f"{CHANNEL}final{MESSAGE}"}


def after_thoughts(params: SamplingParams, thinking: Thinking, forced_calls: bool) -> SamplingParams:
    """`params` with its grammar starting after the thoughts, when the model thinks; `forced_calls`:
    the grammar is the tools' (it writes the calls' own framing)."""
    output = params.structured_output
    parser = thinking["reasoning_parser"]
    if output is None or parser is None:
        return params
    if parser == HARMONY:
        grammar = harmony_after_thoughts(output, forced_calls)
    else:
        grammar = grammar_after_thoughts(output, thinking["reasoning_open"])
    return msgspec.structs.replace(params, structured_output=grammar)


def _answer(output: StructuredOutput) -> dict[str, Any]:
    answer = str(build_grammar(output))
    if output.kind in ("json", "json_object"):
        answer = answer.replace(_BOUNDED_CHAR, _JSON_CHAR)
    return {"type": "grammar", "grammar": answer}


def harmony_after_thoughts(output: StructuredOutput, forced_calls: bool) -> StructuredOutput:
    answer = [_answer(output)] if forced_calls else [_HARMONY_FINAL, _answer(output)]
    return _structural({"type": "sequence", "elements": [_HARMONY_THOUGHTS, *answer]})


def grammar_after_thoughts(output: StructuredOutput, open_in_prompt: bool) -> StructuredOutput:
    thoughts: dict[str, Any] = {
        "type": "tag",
        "begin": "" if open_in_prompt else OPEN,
        "content": {"type": "any_text", "excludes": [OPEN]},  # thoughts do not nest
        "end": CLOSE,
    }
    if not open_in_prompt:
        thoughts = {"type": "optional", "content": thoughts}
    return _structural({"type": "sequence", "elements": [thoughts, _BLANKS, _answer(output)]})


def _structural(fmt: dict[str, Any]) -> StructuredOutput:
    import xgrammar as xgr

    try:
        grammar = xgr.Grammar.from_structural_tag(json.dumps({"type": "structural_tag", "format": fmt}))
    except (RuntimeError, ValueError) as exc:
        raise GrammarError(str(exc)) from None
    return StructuredOutput(kind="grammar", definition=str(grammar))
