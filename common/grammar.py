"""A StructuredOutput as an xgrammar Grammar: one conversion, shared by the front end (which checks a
request's grammar before queuing it) and the worker (which compiles it against the model's vocabulary).

xgrammar imports torch, so it is imported on first use: a gateway that never sees a structured
request never loads it.
"""

from __future__ import annotations

import json
import re
from typing import Any

from common.protocol import StructuredOutput

# xgrammar's errors start with a timestamp and a C++ source location; clients see only the message.
_CPP_PREFIX = re.compile(r"^\s*\[[\d:]+\]\s+\S+:\d+:\s*(Check failed: \(.*?\) is false:\s*)?")


class GrammarError(ValueError):
    """The definition cannot be turned into a grammar; the message says why, in the grammar engine's words."""


def build_grammar(output: StructuredOutput) -> Any:
    """The xgrammar `Grammar` the output must follow. Raises GrammarError for an invalid definition."""
    import xgrammar as xgr

    try:
        if output.kind == "json":
            # Compact JSON (", " and ": " between items, no other whitespace): with free whitespace a
            # model can spend its whole budget on blanks. Strict mode forbids properties the schema
            # does not name, so every output validates against the schema.
            return xgr.Grammar.from_json_schema(output.definition, any_whitespace=False, strict_mode=True)
        if output.kind == "json_object":
            return xgr.Grammar.from_json_schema('{"type": "object"}', any_whitespace=False, strict_mode=False)
        if output.kind == "regex":
            return xgr.Grammar.from_regex(output.definition)
        if output.kind == "choice":
            return xgr.Grammar.from_ebnf(_choice_ebnf(json.loads(output.definition)))
        return xgr.Grammar.from_ebnf(output.definition)
    except RuntimeError as exc:
        raise GrammarError(_CPP_PREFIX.sub("", str(exc)).strip()) from None


def _choice_ebnf(choices: list[str]) -> str:
    # JSON string literals are EBNF string literals: quotes, backslashes and control characters escaped.
    return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)
