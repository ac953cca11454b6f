"""A Responses API request as the chat request it runs as: its conversation, checks and refusals.

The input (a string, or items) plus the previous response's conversation becomes chat messages, with
`instructions` as a leading system message: message items as they are, `function_call` items as an
assistant's `tool_calls` (joined with the assistant message before them: one turn), and
`function_call_output` items as `tool` messages. The sampling fields carry over by name,
`max_output_tokens` becomes `max_completion_tokens`, `text.format` becomes `response_format` and
function tools become chat's (responses/tools.py). From there it is exactly a chat request: same
template, tokenization, checks, grammar and answer text (tests compare the two endpoints' greedy text).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from openai_frontend.generate.validation import _refuse_unsupported
from openai_frontend.protocol.errors import OpenAIError, invalid_request
from openai_frontend.protocol.openai_schemas import ChatCompletionRequest, ChatMessage, ContentPart
from openai_frontend.responses.schemas import InputItem, InputPart, ResponsesRequest
from openai_frontend.responses.store import StoredCall, Turn
from openai_frontend.responses.text import check_text, in_responses_terms, response_format
from openai_frontend.responses.tools import chat_tool_choice, chat_tools, in_tool_terms

ROLES = {"user": "user", "system": "system", "developer": "system", "assistant": "assistant"}
_TEXT_PARTS = ("input_text", "output_text")
# Fields an item or part may carry that change nothing in the prompt (an earlier output sent back).
_ITEM_EXTRAS = {"id", "status", "phase"}
# The fields of each kind of input item (besides `type` and the extras above).
_ITEM_FIELDS = {
    "message": {"role", "content"},
    "function_call": {"call_id", "name", "arguments"},
    "function_call_output": {"call_id", "output"},
}
_PART_EXTRAS = {"annotations", "logprobs"}
MAX_METADATA_PAIRS, MAX_METADATA_KEY, MAX_METADATA_VALUE = 16, 64, 512

# The chat request's own fields, taken over by name.
_CHAT_FIELDS = (
    "model",
    "temperature",
    "top_p",
    "seed",
    "top_k",
    "min_p",
    "stop",
    "stop_token_ids",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "logit_bias",
    "min_tokens",
    "ignore_eos",
    "user",
)
# Fields we do not implement, with the values that ask for what we do anyway (null always does).
_UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    "max_tool_calls": (),
    "reasoning": (),
    "include": ([],),
    "truncation": ("disabled",),
    "top_logprobs": (0,),
    "stream_options": ({}, {"include_obfuscation": False}),
    "background_options": (),
    "conversation": (),
    "context_management": ([],),
    "prompt": (),
    "prompt_cache_key": (),
    "prompt_cache_retention": (),
    "prompt_cache_options": (),
    "safety_identifier": (),
    "service_tier": ("auto", "default"),
    "moderation": (),
    "image": (),
    "access_programs": (),
}


def _unsupported(param: str) -> OpenAIError:
    return invalid_request(f"{param} is not supported by this server", param, "unsupported_parameter")


def check_unsupported(body: ResponsesRequest) -> None:
    _refuse_unsupported(body, _UNSUPPORTED, "")
    check_text(body.text)
    if body.background and body.store is False:
        raise invalid_request("background responses must be stored: set store to true", "background")
    metadata = body.metadata or {}
    if len(metadata) > MAX_METADATA_PAIRS:
        raise invalid_request(f"metadata may hold at most {MAX_METADATA_PAIRS} pairs", "metadata")
    for key, value in metadata.items():
        if len(key) > MAX_METADATA_KEY or len(value) > MAX_METADATA_VALUE:
            raise invalid_request(
                f"metadata keys are at most {MAX_METADATA_KEY} characters and values at most "
                f"{MAX_METADATA_VALUE}",
                f"metadata.{key[:MAX_METADATA_KEY]}",
            )


def input_messages(body: ResponsesRequest, history: list[ChatMessage]) -> list[ChatMessage]:
    """The request's own input as chat messages (text parts joined as chat joins them). A
    function_call_output must answer a call made before it, in `history` or in the input."""
    if isinstance(body.input, str):
        return [ChatMessage(role="user", content=body.input)]
    if not body.input:
        raise invalid_request("input must not be empty", "input")
    call_ids = {c["id"] for m in history for c in m.tool_calls or []}
    messages: list[ChatMessage] = []
    for i, item in enumerate(body.input):
        kind = _item_kind(i, item)
        if kind == "function_call":
            call = _function_call(i, item)
            call_ids.add(call["id"])
            last = messages[-1] if messages else None
            if last is not None and last.role == "assistant":  # the same turn: text, then calls
                last.tool_calls = [*(last.tool_calls or []), call]
            else:
                messages.append(ChatMessage(role="assistant", content=None, tool_calls=[call]))
        elif kind == "function_call_output":
            if item.call_id not in call_ids:
                raise invalid_request(
                    f"no function call with call_id {item.call_id!r} before this output",
                    f"input[{i}].call_id",
                )
            output = _text(item.output, f"input[{i}].output")
            messages.append(ChatMessage(role="tool", content=output, tool_call_id=item.call_id))
        else:
            messages.append(_message(i, item))
    return messages


def _item_kind(i: int, item: InputItem) -> str:
    kind = item.type or "message"
    fields = _ITEM_FIELDS.get(kind)
    if fields is None:
        raise _unsupported(f"input[{i}].type")
    extra = set(item.model_dump(exclude_none=True)) - fields - _ITEM_EXTRAS - {"type"}
    if extra:
        raise _unsupported(f"input[{i}].{sorted(extra)[0]}")
    for name in sorted(fields - {"content"}):  # a message's content is checked with its role
        if getattr(item, name) is None:
            raise invalid_request(f"a {kind} item needs {name}", f"input[{i}].{name}")
    return kind


def _function_call(i: int, item: InputItem) -> dict[str, Any]:
    """A function_call item as a chat tool call, its arguments as sent: JSON or not (a call cut off
    at max_output_tokens is still what this server answered), the chat history reads them."""
    assert item.arguments is not None
    return {
        "id": item.call_id,
        "type": "function",
        "function": {"name": item.name, "arguments": item.arguments},
    }


def _text(content: str | list[InputPart] | None, param: str) -> str:
    """A message's content or a call's output: a string, or text parts joined as chat joins them."""
    if not isinstance(content, list):
        assert content is not None
        return content
    return "\n".join(_part_text(part, f"{param}[{j}]") for j, part in enumerate(content))


def _part_text(part: InputPart, param: str) -> str:
    if part.type not in _TEXT_PARTS:
        raise _unsupported(f"{param}.type")
    extra = set(part.model_extra or {}) - _PART_EXTRAS
    if extra:
        raise _unsupported(f"{param}.{sorted(extra)[0]}")
    if part.text is None:
        raise invalid_request("a text part needs text", f"{param}.text")
    return part.text


def _image_part(part: InputPart, param: str) -> ContentPart:
    """An input_image part as chat's image_url part (a data: URL, or a URL the server may fetch)."""
    fields = dict(part.model_extra or {})
    if fields.get("file_id") is not None:
        raise _unsupported(f"{param}.file_id")
    extra = set(fields) - {"image_url", "detail", "file_id"} - _PART_EXTRAS
    if extra or part.text is not None:
        raise _unsupported(f"{param}.{sorted(extra)[0] if extra else 'text'}")
    url = fields.get("image_url")
    if not isinstance(url, str):
        raise invalid_request(
            "an input_image part needs image_url (a data: or http(s) URL)", f"{param}.image_url"
        )
    detail = fields.get("detail")
    return ContentPart(
        type="image_url", image_url={"url": url, **({"detail": detail} if detail is not None else {})}
    )


def _content(content: str | list[InputPart], param: str) -> str | list[ContentPart]:
    """A message's content: text parts joined as chat joins them, or, with input_image parts among
    them, chat's content parts in their order."""
    if isinstance(content, str) or not any(p.type == "input_image" for p in content):
        return _text(content, param)
    return [
        _image_part(part, f"{param}[{j}]")
        if part.type == "input_image"
        else ContentPart(type="text", text=_part_text(part, f"{param}[{j}]"))
        for j, part in enumerate(content)
    ]


def _message(i: int, item: InputItem) -> ChatMessage:
    role = ROLES.get(item.role or "")
    if role is None:
        raise invalid_request(
            f"role {item.role!r} is not supported; use one of {', '.join(ROLES)}", f"input[{i}].role"
        )
    if item.content is None:
        raise invalid_request("a message item needs content", f"input[{i}].content")
    return ChatMessage(role=role, content=_content(item.content, f"input[{i}].content"))


def turn_of(message: ChatMessage) -> Turn:
    """A conversation message as stored for the next turn."""
    calls = [
        StoredCall(c["id"], c["function"]["name"], c["function"]["arguments"])
        for c in message.tool_calls or []
    ]
    content = message.content
    if isinstance(content, list):  # with images: kept as parts, for the next turn's prompt
        parts = [p.model_dump(exclude_none=True) for p in content]
        text = "\n".join(p.text for p in content if p.text is not None)
        return Turn(message.role, text, calls or None, message.tool_call_id, parts)
    return Turn(message.role, str(content or ""), calls or None, message.tool_call_id)


def message_of(turn: Turn) -> ChatMessage:
    calls = [
        {"id": c.call_id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
        for c in turn.tool_calls or []
    ]
    content = [ContentPart.model_validate(p) for p in turn.parts] if turn.parts else turn.content
    return ChatMessage(
        role=turn.role, content=content, tool_calls=calls or None, tool_call_id=turn.tool_call_id
    )


def chat_request(body: ResponsesRequest, conversation: list[ChatMessage]) -> ChatCompletionRequest:
    """The chat request that runs `conversation` (history plus this input) with the body's settings."""
    system = [] if body.instructions is None else [ChatMessage(role="system", content=body.instructions)]
    fields = body.model_dump(include=set(_CHAT_FIELDS), exclude_none=True)
    return ChatCompletionRequest(
        messages=system + conversation,
        max_completion_tokens=body.max_output_tokens,
        response_format=response_format(body.text),
        tools=chat_tools(body.tools),
        tool_choice=chat_tool_choice(body.tool_choice),
        parallel_tool_calls=body.parallel_tool_calls,
        **fields,
    )


# Chat's names for what the Responses API calls otherwise, in the errors a chat request raises.
_PARAM_NAMES = {"max_completion_tokens": "max_output_tokens", "messages": "input"}


@contextmanager
def responses_names() -> Iterator[None]:
    """Errors raised inside name the Responses API's parameters, not the chat request's."""
    try:
        yield
    except OpenAIError as exc:
        if exc.param is not None:
            head = exc.param.split("[")[0].split(".")[0]
            if head in _PARAM_NAMES:
                exc.param = _PARAM_NAMES[head]
        exc.message = exc.message.replace("max_completion_tokens", "max_output_tokens")
        in_responses_terms(exc)
        in_tool_terms(exc)
        raise
