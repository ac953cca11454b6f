"""The Responses API's function tools as chat's: `tools`, `tool_choice` and `parallel_tool_calls`.

A Responses function tool is chat's flattened (`{"type": "function", "name", "description",
"parameters", "strict"}` for `{"type": "function", "function": {...}}`), and a named tool_choice is
`{"type": "function", "name": ...}`. Mapped onto the chat request, they get chat's checks, template
rendering, parser and forced-call grammar (tools.py); `in_tool_terms` names the flat fields in the
errors that raises. Hosted tools (web_search, file_search, mcp, ...) run on OpenAI's side: refused.
"""

from __future__ import annotations

import re
from typing import Any

from openai_frontend.protocol.errors import OpenAIError, invalid_request

_FUNCTION_FIELDS = ("name", "description", "parameters", "strict")
# Chat's nesting in the parameters of its errors: `tools[i].function.x` is `tools[i].x` here.
_NESTED = re.compile(r"(tools\[\d+\]|tool_choice)\.function\b")


def _unsupported(message: str, param: str) -> OpenAIError:
    return invalid_request(message, param, "unsupported_parameter")


def chat_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Chat's tool objects for `tools`; hosted tools and fields we do not implement are refused."""
    if tools is None:
        return None
    converted = []
    for i, tool in enumerate(tools):
        kind = tool.get("type")
        if kind != "function":
            raise _unsupported(
                f"tools of type {kind!r} are not supported by this server; only function tools are",
                f"tools[{i}].type",
            )
        extra = next(
            (k for k, v in tool.items() if k not in ("type", *_FUNCTION_FIELDS) and v is not None), None
        )
        if extra is not None:
            raise _unsupported(f"tools[{i}].{extra} is not supported by this server", f"tools[{i}].{extra}")
        function = {k: tool[k] for k in _FUNCTION_FIELDS if tool.get(k) is not None}
        if "name" not in function:
            raise invalid_request("a function tool needs a name", f"tools[{i}].name")
        converted.append({"type": "function", "function": function})
    return converted


def chat_tool_choice(tool_choice: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
    """Chat's `tool_choice` for the Responses one: the same strings, a function named as chat names it."""
    if tool_choice is None or isinstance(tool_choice, str):
        return tool_choice  # chat checks the string
    kind = tool_choice.get("type")
    if kind != "function":
        raise _unsupported(
            f"tool_choice of type {kind!r} is not supported by this server; use none, auto, required or "
            '{"type": "function", "name": ...}',
            "tool_choice.type",
        )
    name = tool_choice.get("name")
    if set(tool_choice) != {"type", "name"} or not isinstance(name, str):
        raise invalid_request('tool_choice must be {"type": "function", "name": ...}', "tool_choice")
    return {"type": "function", "function": {"name": name}}


def tool_choice_echo(tool_choice: str | dict[str, Any] | None) -> str | dict[str, Any]:
    """`tool_choice` as the Response echoes it: as asked, OpenAI's default `auto` when not."""
    return "auto" if tool_choice is None else tool_choice


def in_tool_terms(error: OpenAIError) -> None:
    """Names the flat Responses fields where a chat request's error names `tools[i].function.x`."""
    if error.param is not None:
        error.param = _NESTED.sub(r"\1", error.param)
    error.message = _NESTED.sub(r"\1", error.message)
