"""Pythonic tool calls (Llama 4, Llama 3.2's small models): the whole answer is a Python list of calls,
`[get_weather(city="Paris"), now()]`, optionally after `<|python_start|>`.

A call opens (id, name) when `name(` is read; its arguments are keyword arguments of Python literals
(JSON's true/false/null read too), given as one JSON object when the call's `)` is read, since they
are converted, not the model's own text. An answer that does not start with such a list is content,
as in vLLM's pythonic parser.
"""

from __future__ import annotations

import ast
import json
from typing import Any

import regex

from openai_frontend.tools.parsers.scan import balanced_end
from openai_frontend.tools.parsers.snapshot import Call, Reading, blanks_held

_START = regex.compile(r"\s*(?:<\|python_start\|>\s*)?\[")
_HEAD = regex.compile(r"\s*(?P<name>[A-Za-z_][\w.-]*)\s*\(")
_NEXT = regex.compile(r"\s*(?P<sep>[,\]])")
_NAMES = {"true": True, "false": False, "null": None, "True": True, "False": False, "None": None}


def read_pythonic(text: str, final: bool) -> Reading:
    start = _START.match(text, partial=True)
    head = None if start is None or start.partial else _HEAD.match(text, start.end(), partial=True)
    undecided = (start is not None and start.partial) or (head is not None and head.partial)
    if start is None or head is None or undecided:
        return Reading("" if undecided and not final else blanks_held(text, final, calls_follow=False))
    calls: list[Call] = []
    at = start.end()
    while (head := _HEAD.match(text, at, partial=True)) is not None and not head.partial:
        close = balanced_end(text, head.end() - 1, quotes="'\"")
        if close is None:
            calls.append(Call(head.group("name"), ""))
            return Reading(calls=calls)
        calls.append(Call(head.group("name"), _arguments(text[head.end() : close - 1])))
        at = close
        sep = _NEXT.match(text, at)
        if sep is None:
            break
        at = sep.end()
        if sep.group("sep") == "]":
            break
    return Reading(text[at:].strip() if final else "", calls)


def _arguments(source: str) -> str:
    """Keyword arguments as a JSON object; `{}` when they are not literals (nothing to give)."""
    try:
        call = ast.parse(f"f({source})", mode="eval").body
        assert isinstance(call, ast.Call) and not call.args
        return json.dumps({k.arg: _value(k.value) for k in call.keywords if k.arg}, ensure_ascii=False)
    except (SyntaxError, ValueError, AssertionError, RecursionError):
        return "{}"


def _value(node: ast.expr) -> Any:
    if isinstance(node, ast.Constant) and (node.value is None or isinstance(node.value, (str, int, float))):
        return node.value
    if isinstance(node, ast.Name) and node.id in _NAMES:
        return _NAMES[node.id]
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_value(e) for e in node.elts]
    if isinstance(node, ast.Dict) and all(isinstance(k, ast.Constant) for k in node.keys):
        return {str(k.value): _value(v) for k, v in zip(node.keys, node.values, strict=True)}  # type: ignore[union-attr]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        value = _value(node.operand)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return -value
    raise ValueError(ast.dump(node))
