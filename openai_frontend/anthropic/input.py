"""An Anthropic Messages request as the chat request it runs as: its conversation, checks and refusals.

`system` (a string or text blocks) is a leading system message. A user message's text blocks are its
content and each `tool_result` block a `tool` message answering the call it names (an error result's
text starts with "Error: ", so the model reads that the tool failed); an assistant message's text
blocks are its content and its `tool_use` blocks chat's `tool_calls`. Text blocks are joined with
"\n", as chat joins text parts, and consecutive messages of one role are one turn, as Anthropic reads
them; a final assistant message is continued (chat's `continue_final_message`). `max_tokens`,
`stop_sequences`, temperature, top_p and top_k carry over, `metadata.user_id` is chat's `user`,
`output_config.format` chat's `response_format`, tools and tool_choice chat's (tools.py). From there
it is exactly a chat request: same template, tokenization, checks, grammar and text (the tests compare
the two endpoints' greedy text).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from openai_frontend.anthropic.schemas import ContentBlock, CountTokensRequest, MessagesRequest
from openai_frontend.anthropic.tools import chat_tool_choice, chat_tools
from openai_frontend.protocol.errors import OpenAIError, invalid_request
from openai_frontend.protocol.openai_schemas import (
    ChatCompletionRequest,
    ChatMessage,
    ContentPart,
    ResponseFormat,
)

# The fields each kind of block may carry besides `type` and `cache_control` (a caching hint).
_BLOCK_FIELDS = {
    "text": {"text", "citations"},
    "image": {"source"},
    "tool_use": {"id", "name", "input", "caller"},
    "tool_result": {"tool_use_id", "content", "is_error"},
    "thinking": {"thinking", "signature"},
    "redacted_thinking": {"data"},
}
_ROLE_BLOCKS = {
    "user": ("text", "image", "tool_result"),
    "assistant": ("text", "tool_use", "thinking", "redacted_thinking"),
}
# An earlier answer's thoughts, sent back with it: left out of the prompt, as Anthropic leaves out
# earlier turns' thinking and chat templates of thinking models drop earlier thoughts.
_DROPPED_BLOCKS = ("thinking", "redacted_thinking")
ERROR_PREFIX = "Error: "  # starts the text of a tool_result with is_error
# The image types Anthropic accepts in a base64 source.
IMAGE_MEDIA_TYPES = ("image/jpeg", "image/png", "image/gif", "image/webp")


def _unsupported(message: str) -> OpenAIError:
    return invalid_request(message, code="unsupported_parameter")


def _check_block(block: ContentBlock, kinds: tuple[str, ...], param: str) -> None:
    if block.type not in kinds:
        served = " and ".join(kinds)
        raise _unsupported(
            f"{param}: content blocks of type {block.type!r} are not supported here by this server "
            f"(the model reads text only); send {served} blocks"
        )
    fields = set(block.model_dump(exclude_none=True)) - {"type", "cache_control"}
    extra = sorted(fields - _BLOCK_FIELDS[block.type])
    if extra:
        raise _unsupported(f"{param}.{extra[0]} is not supported by this server")
    if block.model_extra and block.model_extra.get("citations"):
        raise _unsupported(f"{param}.citations is not supported by this server")
    if block.model_extra and block.model_extra.get("caller") not in (None, {"type": "direct"}):
        raise _unsupported(f"{param}.caller is not supported by this server")


def _texts(content: str | list[ContentBlock], param: str) -> str:
    """A string, or text blocks joined as chat joins text parts."""
    if isinstance(content, str):
        return content
    texts = []
    for j, block in enumerate(content):
        _check_block(block, ("text",), f"{param}[{j}]")
        if block.text is None:
            raise invalid_request(f"{param}[{j}].text: Field required")
        texts.append(block.text)
    return "\n".join(texts)


def _image_part(block: ContentBlock, param: str) -> ContentPart:
    """An image block as chat's image_url part: a base64 source as a data: URL, a url source as is."""
    source = block.source or {}
    kind = source.get("type")
    if kind == "base64":
        media_type, data = source.get("media_type"), source.get("data")
        if media_type not in IMAGE_MEDIA_TYPES:
            raise invalid_request(
                f"{param}.source.media_type must be one of {', '.join(IMAGE_MEDIA_TYPES)}, got {media_type!r}"
            )
        if not isinstance(data, str):
            raise invalid_request(f"{param}.source.data: Field required")
        url = f"data:{media_type};base64,{data}"
    elif kind == "url":
        if not isinstance(source.get("url"), str):
            raise invalid_request(f"{param}.source.url: Field required")
        url = source["url"]
    else:
        raise _unsupported(
            f"{param}.source: image sources of type {kind!r} are not supported; send base64 or url"
        )
    return ContentPart(type="image_url", image_url={"url": url})


def _content(texts: list[str | ContentPart]) -> str | list[ContentPart]:
    """Text blocks joined as chat joins text parts; with images among them, chat's parts in order."""
    if all(isinstance(t, str) for t in texts):
        return "\n".join(t for t in texts if isinstance(t, str))
    return [ContentPart(type="text", text=t) if isinstance(t, str) else t for t in texts]


def _blocks(content: str | list[ContentBlock]) -> list[ContentBlock]:
    return [ContentBlock(type="text", text=content)] if isinstance(content, str) else content


def _tool_message(block: ContentBlock, call_ids: set[str], param: str) -> ChatMessage:
    if block.tool_use_id is None:
        raise invalid_request(f"{param}.tool_use_id: Field required")
    if block.tool_use_id not in call_ids:
        raise invalid_request(
            f"{param}: no tool_use block with id {block.tool_use_id!r} before this tool_result"
        )
    output = _texts(block.content or "", f"{param}.content")
    if block.is_error:
        output = ERROR_PREFIX + output
    return ChatMessage(role="tool", content=output, tool_call_id=block.tool_use_id)


def _tool_call(block: ContentBlock, param: str) -> dict[str, Any]:
    for name in ("id", "name", "input"):
        if getattr(block, name) is None:
            raise invalid_request(f"{param}.{name}: Field required")
    arguments = json.dumps(block.input, ensure_ascii=False)
    return {"id": block.id, "type": "function", "function": {"name": block.name, "arguments": arguments}}


def _turn(
    messages: list[ChatMessage], role: str, text: str | list[ContentPart] | None, calls: list[dict[str, Any]]
) -> None:
    """Adds a user or assistant turn, joined to the one before when that has the same role."""
    last = messages[-1] if messages else None
    if last is not None and last.role == role:
        if isinstance(text, list) or isinstance(last.content, list):
            last.content = [*_as_parts(last.content), *_as_parts(text)]
        elif text:
            last.content = f"{last.content}\n{text}" if last.content else text
        if calls:
            last.tool_calls = [*(last.tool_calls or []), *calls]
        return
    messages.append(ChatMessage(role=role, content=text, tool_calls=calls or None))


def _as_parts(content: str | list[ContentPart] | None) -> list[ContentPart]:
    if isinstance(content, list):
        return content
    return [ContentPart(type="text", text=content)] if content else []


def chat_messages(body: CountTokensRequest) -> list[ChatMessage]:
    """The system prompt and conversation as chat messages."""
    messages: list[ChatMessage] = []
    if body.system is not None:
        messages.append(ChatMessage(role="system", content=_texts(body.system, "system")))
    if not body.messages:
        raise invalid_request("messages: at least one message is required")
    call_ids: set[str] = set()
    for i, message in enumerate(body.messages):
        kinds = _ROLE_BLOCKS.get(message.role)
        if kinds is None:
            raise invalid_request(f"messages[{i}].role must be user or assistant, got {message.role!r}")
        texts: list[str | ContentPart] = []  # text blocks, and image blocks as chat's image parts
        calls: list[dict[str, Any]] = []
        for j, block in enumerate(_blocks(message.content)):
            param = f"messages[{i}].content[{j}]"
            _check_block(block, kinds, param)
            if block.type in _DROPPED_BLOCKS:
                continue
            if block.type == "text":
                if block.text is None:
                    raise invalid_request(f"{param}.text: Field required")
                texts.append(block.text)
            elif block.type == "image":
                texts.append(_image_part(block, param))
            elif block.type == "tool_use":
                calls.append(_tool_call(block, param))
                call_ids.add(str(block.id))
            else:  # a tool_result: the text before it is a turn of its own, then the tool's answer
                if texts:
                    _turn(messages, "user", _content(texts), [])
                    texts = []
                messages.append(_tool_message(block, call_ids, param))
        if texts or calls or message.role == "assistant":
            _turn(messages, message.role, _content(texts) if texts else None, calls)
    return messages


def _check_prefill(final: ChatMessage) -> None:
    """A final assistant message is continued (chat's continue_final_message): text only, and, as
    Anthropic requires, without trailing whitespace."""
    if final.tool_calls:
        raise invalid_request("a final assistant message with tool_use blocks cannot be continued")
    text = final.content if isinstance(final.content, str) else ""
    if not text:
        raise invalid_request("a final assistant message must have text content to continue")
    if text != text.rstrip():
        raise invalid_request("final assistant content cannot end with trailing whitespace")


def _check_unsupported(body: CountTokensRequest) -> None:
    for name in ("mcp_servers", "context_management", "container"):
        if getattr(body, name) is not None:
            raise _unsupported(f"{name} is not supported by this server")
    if body.thinking is not None and body.thinking.get("type") != "disabled":
        raise _unsupported(
            'thinking is not supported by this server; leave it out or send {"type": "disabled"}'
        )
    extra = sorted(set(body.output_config or {}) - {"format"})
    if extra:
        raise _unsupported(f"output_config.{extra[0]} is not supported by this server")
    if isinstance(body, MessagesRequest):
        for name in ("inference_geo", "speed", "diagnostics"):
            if getattr(body, name) is not None:
                raise _unsupported(f"{name} is not supported by this server")
        if body.service_tier not in (None, "auto", "standard_only"):
            raise invalid_request("service_tier must be auto or standard_only")


def _response_format(output_config: dict[str, Any] | None) -> ResponseFormat | None:
    """`output_config.format` ({"type": "json_schema", "schema": ...}) as chat's `response_format`."""
    output_format = (output_config or {}).get("format")
    if output_format is None:
        return None
    if not isinstance(output_format, dict) or output_format.get("type") != "json_schema":
        raise invalid_request('output_config.format must be {"type": "json_schema", "schema": {...}}')
    extra = sorted(set(output_format) - {"type", "schema"})
    if extra:
        raise _unsupported(f"output_config.format.{extra[0]} is not supported by this server")
    schema = output_format.get("schema")
    if not isinstance(schema, dict):
        raise invalid_request("output_config.format.schema must be a JSON schema object")
    return ResponseFormat.model_validate(
        {"type": "json_schema", "json_schema": {"name": "output", "schema": schema, "strict": True}}
    )


def _user(metadata: dict[str, Any] | None) -> str | None:
    extra = sorted(set(metadata or {}) - {"user_id"})
    if extra:
        raise invalid_request(f"metadata.{extra[0]}: Extra inputs are not permitted")
    user = (metadata or {}).get("user_id")
    if user is not None and not isinstance(user, str):
        raise invalid_request("metadata.user_id must be a string")
    return user


def chat_request(body: CountTokensRequest) -> ChatCompletionRequest:
    """The chat request that runs `body` (for count_tokens, one whose prompt is the same)."""
    _check_unsupported(body)
    tool_choice, parallel = chat_tool_choice(body.tool_choice)
    fields: dict[str, Any] = {}
    if isinstance(body, MessagesRequest):
        fields = body.model_dump(include={"max_tokens", "temperature", "top_p", "top_k"}, exclude_none=True)
        fields.update(stop=body.stop_sequences, stream=bool(body.stream), user=_user(body.metadata))
    messages = chat_messages(body)
    # A final assistant turn is a prefill: the answer continues it rather than opening a new turn.
    prefill = body.messages[-1].role == "assistant"
    if prefill:
        _check_prefill(messages[-1])
    return ChatCompletionRequest(
        model=body.model,
        messages=messages,
        add_generation_prompt=not prefill,
        continue_final_message=prefill,
        tools=chat_tools(body.tools),
        tool_choice=tool_choice,
        parallel_tool_calls=parallel,
        response_format=_response_format(body.output_config),
        **fields,
    )


# Chat's names in the messages of the errors a chat request raises, and Anthropic's for them.
_CHAT_TERMS = [
    (re.compile(r"tools\[(\d+)\]\.function\.parameters"), r"tools[\1].input_schema"),
    (re.compile(r"(tools\[\d+\]|tool_choice)\.function\b"), r"\1"),
    (re.compile(r"\bmax_completion_tokens\b"), "max_tokens"),
    (re.compile(r"\bresponse_format\b"), "output_config.format"),
    (re.compile(r"^stop strings\b"), "stop_sequences"),
    (re.compile(r"\bstop strings\b"), "stop sequences"),
    (re.compile(r"\btool_choice must be none, auto, required or a function\b"), "tool_choice is invalid"),
    (re.compile(r"\buser must be\b"), "metadata.user_id must be"),
    (re.compile(r"'image_url'"), "'image'"),
]


@contextmanager
def anthropic_terms() -> Iterator[None]:
    """Errors raised inside name the Messages API's fields, not the chat request's."""
    try:
        yield
    except OpenAIError as exc:
        for pattern, replacement in _CHAT_TERMS:
            exc.message = pattern.sub(replacement, exc.message)
        exc.param = None  # Anthropic's errors carry only a type and a message
        raise
