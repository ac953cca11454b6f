"""The grammar that forces Hermes tool calls (`tool_choice` required or a named function): `<tool_call>`
blocks whose JSON names one of the tools and whose arguments follow that tool's parameters schema.

vLLM forces a bare JSON list of calls instead; keeping the model's own format means the forced
output reads like any other (the same parser, the same history when it is sent back). The grammar
is EBNF text (StructuredOutput kind `grammar`), so the worker needs nothing new.
"""

from __future__ import annotations

import json
import re
from typing import Any

from common.grammar import GrammarError
from openai_frontend.tools.parsers.hermes import END, START

# xgrammar names the JSON grammar's start rule `root`; ours wraps it under another name.
_CALL_RULE = "tool_call_json"
# A bare `root` outside string literals and character classes (which are skipped as they are).
_ROOT_REF = re.compile(r'"(?:[^"\\]|\\.)*"|\[(?:[^\]\\]|\\.)*\]|\broot\b')
# xgrammar 0.2 spells a string with a maxLength as these characters, which lets raw control
# characters (invalid JSON) in; the worker masks them for JSON outputs, but tool calls need "\n".
_BOUNDED_CHAR = '[^\\"\\\\\\r\\n]'
_JSON_CHAR = '[^\\0-\\x1f\\"\\\\]'


def arguments_schema(parameters: dict[str, Any] | None) -> dict[str, Any]:
    """A function's arguments are a JSON object: no parameters means `{}`."""
    if parameters is None:
        return {"type": "object", "properties": {}}
    return parameters if "type" in parameters else {"type": "object", **parameters}


def strict_auto_grammar(functions: list[dict[str, Any]], one_call: bool) -> str:
    """EBNF for `tool_choice` auto with strict functions: free text, and wherever the model opens a
    `<tool_call>` block, a call of one of `functions` whose arguments follow its schema when it is
    strict (any JSON object otherwise); with `one_call`, the output ends after the first call. It is
    xgrammar's triggered structural tag, written out as EBNF so that the worker needs nothing new.
    Raises GrammarError when a schema cannot be followed."""
    import xgrammar as xgr

    tags = [
        {
            "type": "tag",
            "begin": f'{START}\n{{"name": {json.dumps(f["name"])}, "arguments": ',
            "content": {
                "type": "json_schema",
                "json_schema": arguments_schema(f.get("parameters"))
                if f.get("strict")
                else {"type": "object"},
            },
            "end": f"}}\n{END}",
        }
        for f in functions
    ]
    triggered = {"type": "triggered_tags", "triggers": [START], "tags": tags, "stop_after_first": one_call}
    try:
        grammar = xgr.Grammar.from_structural_tag(json.dumps({"type": "structural_tag", "format": triggered}))
    except RuntimeError as exc:
        raise GrammarError(str(exc)) from None
    return str(grammar).replace(_BOUNDED_CHAR, _JSON_CHAR)


def forced_calls_grammar(functions: list[dict[str, Any]], one_call: bool) -> str:
    """EBNF for one call (or, unless `one_call`, one or more, a line apart) of one of `functions`
    (OpenAI function objects: name, parameters). Raises GrammarError when a schema cannot be followed."""
    import xgrammar as xgr

    calls = [
        {
            "type": "object",
            "properties": {"name": {"const": f["name"]}, "arguments": arguments_schema(f.get("parameters"))},
            "required": ["name", "arguments"],
        }
        for f in functions
    ]
    schema = calls[0] if len(calls) == 1 else {"anyOf": calls}
    try:
        call_json = xgr.Grammar.from_json_schema(json.dumps(schema), any_whitespace=False, strict_mode=True)
    except RuntimeError as exc:
        raise GrammarError(str(exc)) from None
    rules = _ROOT_REF.sub(lambda m: _CALL_RULE if m.group() == "root" else m.group(), str(call_json))
    block = f"{json.dumps(START + chr(10))} {_CALL_RULE} {json.dumps(chr(10) + END)}"
    root = f"root ::= {block}" if one_call else f'root ::= {block} ("\\n" {block})*'
    return root + "\n" + rules.replace(_BOUNDED_CHAR, _JSON_CHAR)
