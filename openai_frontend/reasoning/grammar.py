"""Structured outputs and forced tool calls for a model that thinks: the grammar lets it think freely
until `</think>`, then applies to the answer, as vLLM's reasoning-aware structured outputs do. Here it
is one grammar (a structural tag written out as EBNF): thoughts, a few blanks, then the request's own
grammar, so the worker needs nothing new. Thoughts are optional unless the prompt opened them."""

from __future__ import annotations

import json
from typing import Any

import msgspec

from common.grammar import GrammarError, build_grammar
from common.protocol import SamplingParams, StructuredOutput
from openai_frontend.reasoning import CLOSE, OPEN
from openai_frontend.reasoning.request import Thinking

# xgrammar 0.2 spells a bounded string with characters that let raw control characters in; the
# worker masks those in JSON outputs, which this one is no longer (see tools/parsers/hermes_grammar.py).
_BOUNDED_CHAR = '[^\\"\\\\\\r\\n]'
_JSON_CHAR = '[^\\0-\\x1f\\"\\\\]'
_BLANKS = {"type": "regex", "pattern": "[ \\n]{0,4}"}  # between `</think>` and the answer


def after_thoughts(params: SamplingParams, thinking: Thinking) -> SamplingParams:
    """`params` with its grammar starting after the thoughts, when the model thinks."""
    output = params.structured_output
    if output is None or thinking["reasoning_parser"] is None:
        return params
    return msgspec.structs.replace(
        params, structured_output=grammar_after_thoughts(output, thinking["reasoning_open"])
    )


def grammar_after_thoughts(output: StructuredOutput, open_in_prompt: bool) -> StructuredOutput:
    import xgrammar as xgr

    answer = str(build_grammar(output))
    if output.kind in ("json", "json_object"):
        answer = answer.replace(_BOUNDED_CHAR, _JSON_CHAR)
    thoughts: dict[str, Any] = {
        "type": "tag",
        "begin": "" if open_in_prompt else OPEN,
        "content": {"type": "any_text", "excludes": [OPEN]},  # thoughts do not nest
        "end": CLOSE,
    }
    if not open_in_prompt:
        thoughts = {"type": "optional", "content": thoughts}
    fmt = {"type": "sequence", "elements": [thoughts, _BLANKS, {"type": "grammar", "grammar": answer}]}
    try:
        grammar = xgr.Grammar.from_structural_tag(json.dumps({"type": "structural_tag", "format": fmt}))
    except (RuntimeError, ValueError) as exc:
        raise GrammarError(str(exc)) from None
    return StructuredOutput(kind="grammar", spec=str(grammar))
