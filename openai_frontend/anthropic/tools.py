"""Anthropic's client tools and `tool_choice` as chat's, so they get chat's checks, template rendering,
Hermes parser and forcing grammar (openai_frontend/tools/).

A tool `{"name", "description", "input_schema", "strict"}` is chat's function tool with
`input_schema` as its `parameters`. `tool_choice` auto / any / tool / none is chat's auto / required /
a named function / none, and `disable_parallel_tool_use` is `parallel_tool_calls: false`. Server tools
(web search, bash, text editor, code execution, ...) run on Anthropic's side: refused by type.
"""

from __future__ import annotations

from typing import Any

from openai_frontend.anthropic.schemas import Tool
from openai_frontend.protocol.errors import OpenAIError, invalid_request

# The fields of a client tool that reach chat's, and those that change nothing in the answer.
_FUNCTION_FIELDS = {
    "name": "name",
    "description": "description",
    "input_schema": "parameters",
    "strict": "strict",
}
_NEUTRAL_TOOL_FIELDS = {"type", "cache_control", "eager_input_streaming"}
_CHOICES = {"auto": "auto", "any": "required", "none": "none"}


def _unsupported(message: str) -> OpenAIError:
    return invalid_request(message, code="unsupported_parameter")


def chat_tools(tools: list[Tool] | None) -> list[dict[str, Any]] | None:
    if tools is None:
        return None
    converted = []
    for i, tool in enumerate(tools):
        if tool.type not in (None, "custom"):
            raise _unsupported(
                f"tools[{i}]: server tools of type {tool.type!r} are not supported by this server; "
                "only client tools (name, description, input_schema) are"
            )
        fields = tool.model_dump(exclude_none=True)
        extra = sorted(set(fields) - set(_FUNCTION_FIELDS) - _NEUTRAL_TOOL_FIELDS)
        if extra:
            raise _unsupported(f"tools[{i}].{extra[0]} is not supported by this server")
        if tool.name is None:
            raise invalid_request(f"tools[{i}].name: Field required")
        if tool.input_schema is None:
            raise invalid_request(f"tools[{i}].input_schema: Field required")
        function = {chat: fields[name] for name, chat in _FUNCTION_FIELDS.items() if name in fields}
        converted.append({"type": "function", "function": function})
    return converted


def chat_tool_choice(tool_choice: dict[str, Any] | None) -> tuple[str | dict[str, Any] | None, bool | None]:
    """Chat's `tool_choice` and `parallel_tool_calls` for Anthropic's `tool_choice`."""
    if tool_choice is None:
        return None, None
    kind = tool_choice.get("type")
    allowed = {"type", "disable_parallel_tool_use"} | ({"name"} if kind == "tool" else set())
    extra = sorted(set(tool_choice) - allowed)
    if extra:
        raise invalid_request(f"tool_choice.{extra[0]}: Extra inputs are not permitted")
    parallel = tool_choice.get("disable_parallel_tool_use")
    if parallel is not None and not isinstance(parallel, bool):
        raise invalid_request("tool_choice.disable_parallel_tool_use must be a boolean")
    one_call = False if parallel else None
    if kind == "tool":
        name = tool_choice.get("name")
        if not isinstance(name, str):
            raise invalid_request('tool_choice of type "tool" needs the name of a tool')
        return {"type": "function", "function": {"name": name}}, one_call
    if kind not in _CHOICES:
        raise invalid_request(f"tool_choice.type must be auto, any, tool or none, got {kind!r}")
    return _CHOICES[kind], one_call
