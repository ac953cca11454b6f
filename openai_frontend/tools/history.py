"""Tool turns of a chat history as chat templates read them: an assistant's `tool_calls` with their
arguments parsed when they are JSON (as vLLM passes them: templates write them back with `tojson`),
`tool` messages
with the `tool_call_id` they answer."""

from __future__ import annotations

import json
from typing import Any

from openai_frontend.protocol.errors import invalid_request
from openai_frontend.protocol.openai_schemas import ChatMessage
from openai_frontend.protocol.strings import MAX_ID_CHARS, check_length


def tool_fields(i: int, message: ChatMessage) -> dict[str, Any]:
    """The message's tool fields for the template; 400 when a role carries one it cannot have."""
    param = f"messages[{i}]"
    if message.tool_calls is not None and message.role != "assistant":
        raise invalid_request("only assistant messages carry tool_calls", f"{param}.tool_calls")
    if message.role == "tool":
        if message.tool_call_id is None:
            raise invalid_request("a tool message needs tool_call_id", f"{param}.tool_call_id")
        return {"tool_call_id": message.tool_call_id}
    if message.tool_call_id is not None:
        raise invalid_request("only tool messages carry tool_call_id", f"{param}.tool_call_id")
    if not message.tool_calls:
        return {}
    return {"tool_calls": [_call(c, f"{param}.tool_calls[{j}]") for j, c in enumerate(message.tool_calls)]}


def _call(call: dict[str, Any], param: str) -> dict[str, Any]:
    if call.get("type", "function") != "function":
        raise invalid_request(f"{param}.type must be 'function'", f"{param}.type")
    if not isinstance(call.get("id"), str):
        raise invalid_request(f"{param}.id must be a string", f"{param}.id")
    check_length(call["id"], MAX_ID_CHARS, f"{param}.id")
    function = call.get("function")
    if not isinstance(function, dict):
        raise invalid_request(f"{param}.function must be an object", f"{param}.function")
    if not isinstance(function.get("name"), str):
        raise invalid_request(f"{param}.function.name must be a string", f"{param}.function.name")
    arguments = function.get("arguments")
    if not isinstance(arguments, str):
        raise invalid_request(
            f"{param}.function.arguments must be a JSON string", f"{param}.function.arguments"
        )
    return {
        "id": call["id"],
        "type": "function",
        "function": {"name": function["name"], "arguments": _parsed(arguments)},
    }


def _parsed(arguments: str) -> Any:
    """The arguments parsed, or the string as sent when it is not JSON: a call the model was cut off
    in (max_tokens) is still the server's own output, and an agent sends it back as it came (vLLM
    renders it raw too)."""
    try:
        return json.loads(arguments)
    except (json.JSONDecodeError, RecursionError):
        return arguments


def client_tool_texts(
    chat: list[dict[str, Any]], tools: list[dict[str, Any]] | None
) -> list[tuple[str, str]]:
    """(param, text) of every client string the template may write that is not a message's own field:
    the tools and the calls in the history (a special-token string in them is refused)."""
    texts = [(f"tools[{i}]", json.dumps(tool, ensure_ascii=False)) for i, tool in enumerate(tools or [])]
    for i, message in enumerate(chat):
        for j, call in enumerate(message.get("tool_calls", [])):
            texts.append((f"messages[{i}].tool_calls[{j}]", json.dumps(call, ensure_ascii=False)))
    return texts
