"""The grammars that force tool calls in a family's own format (tool_choice required or named), or
check each call a model opens against its function's schema (auto with strict functions). Built as
xgrammar structural tags and written out as EBNF, so the worker needs nothing new; Hermes keeps its
own (hermes_grammar.py).

Arguments follow the schema as compact JSON (the same grammar as response_format's), as Qwen3-Coder's
XML parameters, or as the keyword arguments of a pythonic call (its required parameters, in the
schema's order, each value a JSON literal, which the pythonic parser reads).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from common.grammar import GrammarError
from openai_frontend.tools.parsers.hermes_grammar import arguments_schema

# xgrammar 0.2 spells a bounded string with characters that let raw control characters in (see
# hermes_grammar.py); JSON arguments need them escaped.
_BOUNDED_CHAR = '[^\\"\\\\\\r\\n]'
_JSON_CHAR = '[^\\0-\\x1f\\"\\\\]'


@dataclass(frozen=True, slots=True)
class CallSyntax:
    begin: str  # before the first call
    call_begin: str  # before a call's arguments; `{name}` is the function's name
    call_end: str
    separator: str  # between two calls
    end: str  # after the last call
    style: Literal["json", "qwen_xml", "pythonic"] = "json"

    def head(self, name: str) -> str:
        return self.call_begin.replace("{name}", name)


def forced_family_grammar(syntax: CallSyntax, functions: list[dict[str, Any]], one_call: bool) -> str:
    """EBNF for one call (or, unless `one_call`, one or more) of `functions`, nothing else."""
    tags = [_tag(syntax, f, strict=True, whole=False) for f in functions]
    calls = {
        "type": "tags_with_separator",
        "tags": tags,
        "separator": syntax.separator,
        "at_least_one": True,
        "stop_after_first": one_call,
    }
    parts: list[dict[str, Any]] = [{"type": "const_string", "value": s} for s in (syntax.begin,) if s]
    parts += [calls] + [{"type": "const_string", "value": s} for s in (syntax.end,) if s]
    return _ebnf(parts[0] if len(parts) == 1 else {"type": "sequence", "elements": parts})


def strict_family_grammar(syntax: CallSyntax, functions: list[dict[str, Any]], one_call: bool) -> str:
    """EBNF for auto with strict functions: free text, and each call opened follows its function's
    schema when strict (any object otherwise); one call per opening of the calls."""
    trigger = syntax.begin + syntax.call_begin.split("{name}")[0]
    tags = [_tag(syntax, f, strict=bool(f.get("strict")), whole=True) for f in functions]
    return _ebnf(
        {"type": "triggered_tags", "triggers": [trigger], "tags": tags, "stop_after_first": one_call}
    )


def _tag(syntax: CallSyntax, function: dict[str, Any], strict: bool, whole: bool) -> dict[str, Any]:
    schema = arguments_schema(function.get("parameters")) if strict else {"type": "object"}
    return {
        "type": "tag",
        "begin": (syntax.begin if whole else "") + syntax.head(function["name"]),
        "content": _content(syntax, schema),
        "end": syntax.call_end + (syntax.end if whole else ""),
    }


def _content(syntax: CallSyntax, schema: dict[str, Any]) -> dict[str, Any]:
    if syntax.style == "qwen_xml":
        return {"type": "json_schema", "json_schema": schema, "style": "qwen_xml", "max_whitespace_cnt": 2}
    if syntax.style == "json":
        return {"type": "grammar", "grammar": _json_ebnf(schema)}
    properties: dict[str, Any] = schema.get("properties", {})
    required = [k for k in properties if k in schema.get("required", [])]
    parts: list[dict[str, Any]] = []
    for i, key in enumerate(required):
        parts.append({"type": "const_string", "value": (", " if i else "") + f"{key}="})
        parts.append({"type": "grammar", "grammar": _json_ebnf(properties[key])})
    if not parts:
        return {"type": "const_string", "value": ""}
    return {"type": "sequence", "elements": parts}


def _json_ebnf(schema: dict[str, Any]) -> str:
    import xgrammar as xgr

    strict = schema != {"type": "object"}
    try:
        grammar = xgr.Grammar.from_json_schema(json.dumps(schema), any_whitespace=False, strict_mode=strict)
    except RuntimeError as exc:
        raise GrammarError(str(exc)) from None
    return str(grammar)


def _ebnf(fmt: dict[str, Any]) -> str:
    import xgrammar as xgr

    try:
        grammar = xgr.Grammar.from_structural_tag(json.dumps({"type": "structural_tag", "format": fmt}))
    except (RuntimeError, ValueError) as exc:
        raise GrammarError(str(exc)) from None
    return str(grammar).replace(_BOUNDED_CHAR, _JSON_CHAR)
