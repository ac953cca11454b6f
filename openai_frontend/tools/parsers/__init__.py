"""Tool-call formats: which one a model writes (read from its chat template), its parser and the
grammar that forces calls in it. Hermes (`<tool_call>` JSON blocks) is the one implemented."""

from __future__ import annotations

import hashlib
from typing import Any

from openai_frontend.tools.parsers.hermes import START, HermesToolParser
from openai_frontend.tools.parsers.hermes_grammar import forced_calls_grammar, strict_auto_grammar

__all__ = ["HermesToolParser", "forced_grammar", "new_parser", "parser_for_template", "strict_grammar"]

HERMES = "hermes"


def parser_for_template(template: str | None) -> str | None:
    """The tool-call format a chat template teaches its model, or None when it knows no tools."""
    if template is not None and "tools" in template and START in template:
        return HERMES
    return None


def forced_grammar(parser: str, functions: list[dict[str, Any]], one_call: bool) -> str:
    """EBNF for calls in `parser`'s format (only Hermes exists); raises GrammarError."""
    assert parser == HERMES, parser
    return forced_calls_grammar(functions, one_call)


def strict_grammar(parser: str, functions: list[dict[str, Any]], one_call: bool) -> str:
    """EBNF for `auto` with strict functions in `parser`'s format; raises GrammarError."""
    assert parser == HERMES, parser
    return strict_auto_grammar(functions, one_call)


def new_parser(parser: str, req_id: str, max_calls: int | None) -> HermesToolParser:
    """A parser for one choice. Its call ids derive from the choice's request id, so a replay (resume,
    fetch by id) names the calls as the first answer did; they reveal nothing of the id."""
    assert parser == HERMES, parser

    def call_id(index: int) -> str:
        return "call_" + hashlib.sha256(f"{req_id}:{index}".encode()).hexdigest()[:24]

    return HermesToolParser(call_id, max_calls)
