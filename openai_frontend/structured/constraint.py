"""What a body asks its output to follow, as the StructuredOutput the worker enforces.

Two ways to ask: OpenAI's `response_format` on chat (`json_object`, `json_schema`), and vLLM's
`structured_outputs` on both endpoints (`json`, `regex`, `choice`, `grammar`, `json_object`). The
grammar is built here too (`common.grammar`, the worker's own conversion), so a schema, regex or
grammar the engine cannot follow is a 400 naming the field before anything is queued.
"""

from __future__ import annotations

import json
import re

from common.grammar import GrammarError, build_grammar
from common.protocol import StructuredOutput
from openai_frontend.protocol.errors import invalid_request
from openai_frontend.protocol.openai_schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    ResponseFormat,
    StructuredOutputsParams,
)

MAX_DEFINITION_CHARS = 64 * 1024  # a schema, regex or grammar; the worker compiles it against the vocabulary
_SCHEMA_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # as OpenAI requires of json_schema.name
# vLLM options that would change the answer if ignored. Its disable_* options are accepted: outputs
# here never fall back to another engine, never hold free whitespace and never add properties.
_UNSUPPORTED_OPTIONS = ("whitespace_pattern", "structural_tag")


def asks_for_grammar(body: CompletionRequest | ChatCompletionRequest) -> bool:
    """Whether the body constrains its output or has tools (their check then builds grammars: worth
    a thread)."""
    if isinstance(body, ChatCompletionRequest) and body.tools:
        return True
    fmt = body.response_format if isinstance(body, ChatCompletionRequest) else None
    return body.structured_outputs is not None or (fmt is not None and fmt.type != "text")


def structured_output(
    body: CompletionRequest | ChatCompletionRequest, tool_calls: StructuredOutput | None = None
) -> StructuredOutput | None:
    """The grammar the output must follow, or None; raises a 400 when it cannot be enforced.
    `tool_calls` is the grammar of forced or strict tool calls (tools.py), already checked."""
    fmt = body.response_format if isinstance(body, ChatCompletionRequest) else None
    if tool_calls is not None:
        if body.structured_outputs is not None or (fmt is not None and fmt.type != "text"):
            raise invalid_request(
                "tool calls forced by tool_choice, or checked against strict function schemas, are a "
                "grammar, which cannot also follow response_format or structured_outputs: give only one",
                "tool_choice",
            )
        return tool_calls
    asked = [] if fmt is None else [_from_response_format(fmt)]
    if body.structured_outputs is not None:
        asked.append(_from_params(body.structured_outputs))
    found = [a for a in asked if a is not None]
    if len(found) > 1:
        raise invalid_request(
            "response_format and structured_outputs each constrain the output: give only one",
            "structured_outputs",
        )
    if not found:
        return None
    output, param = found[0]
    if len(output.definition) > MAX_DEFINITION_CHARS:
        raise invalid_request(f"{param} must be at most {MAX_DEFINITION_CHARS} characters", param)
    try:
        build_grammar(output)
    except GrammarError as exc:
        raise invalid_request(f"{param} cannot be enforced: {exc}", param) from None
    return output


def _from_response_format(fmt: ResponseFormat) -> tuple[StructuredOutput, str] | None:
    if fmt.type not in ("text", "json_object", "json_schema"):
        raise invalid_request(
            f"response_format.type must be text, json_object or json_schema, got {fmt.type!r}",
            "response_format.type",
        )
    if fmt.type != "json_schema":
        if fmt.json_schema is not None:
            raise invalid_request(
                "response_format.json_schema needs response_format.type json_schema",
                "response_format.json_schema",
            )
        return None if fmt.type == "text" else (StructuredOutput(kind="json_object"), "response_format")
    if fmt.json_schema is None:
        raise invalid_request("response_format.json_schema is required", "response_format.json_schema")
    if not _SCHEMA_NAME.match(fmt.json_schema.name):
        raise invalid_request(
            "response_format.json_schema.name must be 1 to 64 letters, digits, '_' or '-'",
            "response_format.json_schema.name",
        )
    param = "response_format.json_schema.schema"
    if fmt.json_schema.schema_ is None:
        raise invalid_request(f"{param} is required", param)
    return StructuredOutput(kind="json", definition=json.dumps(fmt.json_schema.schema_)), param


def _from_params(params: StructuredOutputsParams) -> tuple[StructuredOutput, str]:
    for name in _UNSUPPORTED_OPTIONS:
        if getattr(params, name) is not None:
            raise invalid_request(
                f"structured_outputs.{name} is not supported by this server",
                f"structured_outputs.{name}",
                "unsupported_parameter",
            )
    constraints = {
        "json": params.json_,
        "regex": params.regex,
        "choice": params.choice,
        "grammar": params.grammar,
        "json_object": params.json_object,
    }
    given = [name for name, value in constraints.items() if value not in (None, False)]
    if len(given) != 1:
        raise invalid_request(
            "structured_outputs must set exactly one of json, regex, choice, grammar, json_object; "
            f"got {', '.join(given) or 'none'}",
            "structured_outputs",
        )
    name = given[0]
    param = f"structured_outputs.{name}"
    if name == "json_object":
        return StructuredOutput(kind="json_object"), param
    if name == "json":
        return StructuredOutput(kind="json", definition=_schema_text(params.json_, param)), param
    if name == "choice":
        if not params.choice:
            raise invalid_request(f"{param} must list at least one string", param)
        return StructuredOutput(kind="choice", definition=json.dumps(params.choice)), param
    text = params.regex if name == "regex" else params.grammar
    if not text:
        raise invalid_request(f"{param} must not be empty", param)
    return StructuredOutput(kind="regex" if name == "regex" else "grammar", definition=text), param


def _schema_text(schema: object, param: str) -> str:
    """A JSON schema given as an object or as JSON text, as JSON text."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as exc:
            raise invalid_request(f"{param} is not valid JSON: {exc}", param) from None
    if not isinstance(schema, dict):
        raise invalid_request(f"{param} must be a JSON schema object", param)
    return json.dumps(schema)
