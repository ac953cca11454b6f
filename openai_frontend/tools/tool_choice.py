"""`tools`, `tool_choice` and `parallel_tool_calls` of a chat body, checked (400s naming the field) and
turned into what the request needs: the tools the chat template lists, the parser that reads calls
back from the output, and for `required` or a named function the grammar that forces them.

As in vLLM: `auto` (the default with tools) parses whatever the model writes; `none` still lists the
tools in the prompt (vLLM's default, without --exclude-tools-when-tool-choice-none) but parses
nothing. Forcing calls is a grammar, and so is `auto` with a strict function (free text, each call
opened follows its schema), so neither combines with response_format or structured_outputs
(refused in structured/constraint.py).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from common.grammar import GrammarError, build_grammar
from common.protocol import StructuredOutput
from openai_frontend.model.served_model import ServedModel
from openai_frontend.protocol.errors import invalid_request
from openai_frontend.protocol.openai_schemas import ChatCompletionRequest
from openai_frontend.protocol.strings import MAX_DESCRIPTION_CHARS, MAX_NAME_CHARS, check_length
from openai_frontend.tools.parsers import chosen_parser, forced_grammar, strict_grammar, string_params
from openai_frontend.tools.parsers.hermes_grammar import arguments_schema

MAX_TOOLS = 128  # as OpenAI allows
MAX_TOOLS_CHARS = 64 * 1024  # all schemas together; each becomes part of the prompt and of a grammar
_FUNCTION_NAME = re.compile(rf"^[A-Za-z0-9_-]{{1,{MAX_NAME_CHARS}}}$")  # as OpenAI requires
_FUNCTION_FIELDS = ("name", "description", "parameters", "strict")
_CHOICES = ("none", "auto", "required")


@dataclass(slots=True, frozen=True)
class ToolUse:
    tools: list[dict[str, Any]] | None = None  # as the chat template receives them (the client's objects)
    parser: str | None = None  # reads calls back from the output; None: the output is content only
    max_calls: int | None = None  # 1 with parallel_tool_calls false; later calls are dropped
    grammar: StructuredOutput | None = None  # forces the calls (required, named) or their schemas (strict)
    strings: dict[str, list[str]] | None = None  # per function, its string parameters (parsers/ uses)


def tool_use(body: ChatCompletionRequest, served: ServedModel) -> ToolUse:
    """What the body's tool fields ask of the prompt, the sampler and the answer; 400s naming the field."""
    if not body.tools:
        if body.tool_choice not in (None, "none"):
            raise invalid_request("tool_choice needs tools", "tool_choice")
        return ToolUse()
    if len(body.tools) > MAX_TOOLS:
        raise invalid_request(f"at most {MAX_TOOLS} tools are allowed, got {len(body.tools)}", "tools")
    if len(json.dumps(body.tools)) > MAX_TOOLS_CHARS:
        raise invalid_request(f"tools must be at most {MAX_TOOLS_CHARS} characters as JSON", "tools")
    functions = [_function(i, tool) for i, tool in enumerate(body.tools)]
    names = [f["name"] for f in functions]
    duplicate = next((n for i, n in enumerate(names) if n in names[:i]), None)
    if duplicate is not None:
        raise invalid_request(f"tool names must be unique; {duplicate!r} is given twice", "tools")
    parser = chosen_parser(served.rules.tool_parser, served.tokenizer.chat_template)
    if parser is None:
        raise invalid_request(
            "this model's chat template does not support tool calling (GATEWAY_TOOL_PARSER names a "
            "format when the template's is not recognised)",
            "tools",
        )
    choice, named = _choice(body.tool_choice, names)
    strict = next((i for i, f in enumerate(functions) if f.get("strict")), None)
    if strict is not None and choice == "none":
        # No call is read back under none: nothing a strict schema could apply to.
        raise invalid_request(
            "strict function schemas need tool_choice auto, required or a function",
            f"tools[{strict}].function.strict",
        )
    one_call = choice == "named" or body.parallel_tool_calls is False
    if choice == "none":
        return ToolUse(tools=body.tools)
    grammar = None
    try:
        if choice != "auto":
            forced = functions if choice == "required" else [f for f in functions if f["name"] == named]
            grammar = StructuredOutput(kind="grammar", definition=forced_grammar(parser, forced, one_call))
        elif strict is not None:  # free text, but each call the model opens follows its schema
            grammar = StructuredOutput(kind="grammar", definition=strict_grammar(parser, functions, one_call))
        if grammar is not None:
            build_grammar(grammar)
    except GrammarError as exc:
        raise invalid_request(f"tools cannot be enforced: {exc}", "tools") from None
    strings = string_params(functions) or None
    return ToolUse(body.tools, parser, 1 if one_call else None, grammar, strings)


def _function(i: int, tool: dict[str, Any]) -> dict[str, Any]:
    param = f"tools[{i}]"
    if tool.get("type") != "function":
        raise invalid_request(f"{param}.type must be 'function', got {tool.get('type')!r}", f"{param}.type")
    extra = next((k for k in tool if k not in ("type", "function")), None)
    if extra is not None:
        raise invalid_request(f"{param}.{extra} is not a tool field", f"{param}.{extra}")
    function = tool.get("function")
    if not isinstance(function, dict):
        raise invalid_request(f"{param}.function must be an object", f"{param}.function")
    extra = next((k for k in function if k not in _FUNCTION_FIELDS), None)
    if extra is not None:
        raise invalid_request(
            f"{param}.function.{extra} is not a function field", f"{param}.function.{extra}"
        )
    name = function.get("name")
    if not isinstance(name, str) or not _FUNCTION_NAME.match(name):
        raise invalid_request(
            f"{param}.function.name must be 1 to 64 letters, digits, '_' or '-'", f"{param}.function.name"
        )
    description = function.get("description")
    if description is not None and not isinstance(description, str):
        raise invalid_request(
            f"{param}.function.description must be a string", f"{param}.function.description"
        )
    if description is not None:
        check_length(description, MAX_DESCRIPTION_CHARS, f"{param}.function.description")
    strict = function.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise invalid_request(f"{param}.function.strict must be a boolean", f"{param}.function.strict")
    _check_parameters(function.get("parameters"), f"{param}.function.parameters")
    return function


def _check_parameters(parameters: object, param: str) -> None:
    if parameters is None:
        return
    if not isinstance(parameters, dict):
        raise invalid_request(f"{param} must be a JSON schema object", param)
    if parameters.get("type", "object") != "object":
        raise invalid_request(f"{param} must describe an object (type 'object')", param)
    try:
        build_grammar(StructuredOutput(kind="json", definition=json.dumps(arguments_schema(parameters))))
    except GrammarError as exc:
        raise invalid_request(f"{param} is not a schema this server can follow: {exc}", param) from None


def _choice(tool_choice: str | dict[str, Any] | None, names: list[str]) -> tuple[str, str | None]:
    """none, auto, required or named; and the name of the function a named choice forces."""
    if tool_choice is None:
        return "auto", None
    if isinstance(tool_choice, str):
        if tool_choice not in _CHOICES:
            raise invalid_request(
                f"tool_choice must be none, auto, required or a function, got {tool_choice!r}", "tool_choice"
            )
        return tool_choice, None
    function = tool_choice.get("function")
    if tool_choice.get("type") != "function" or set(tool_choice) != {"type", "function"}:
        raise invalid_request(
            'tool_choice must be {"type": "function", "function": {"name": ...}}', "tool_choice"
        )
    if not isinstance(function, dict) or set(function) != {"name"} or not isinstance(function["name"], str):
        raise invalid_request('tool_choice.function must be {"name": ...}', "tool_choice.function")
    check_length(function["name"], MAX_NAME_CHARS, "tool_choice.function.name")  # before it is quoted
    if function["name"] not in names:
        raise invalid_request(
            f"tool_choice names {function['name']!r}, which is not among the tools",
            "tool_choice.function.name",
        )
    return "named", str(function["name"])
