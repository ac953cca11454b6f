"""A Responses API request as the chat request it runs as: its conversation, checks and refusals.

The input (a string, or message items) plus the previous response's conversation becomes chat
messages, with `instructions` as a leading system message; the sampling fields carry over by name,
`max_output_tokens` becomes `max_completion_tokens` and `text.format` becomes `response_format`. From
there it is exactly a chat request: same template, tokenization, checks, grammar and answer text
(tests compare the two endpoints' greedy text).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from openai_frontend.errors import OpenAIError, invalid_request
from openai_frontend.openai_schemas import ChatCompletionRequest, ChatMessage
from openai_frontend.responses_schemas import InputItem, ResponsesRequest
from openai_frontend.responses_text import check_text, in_responses_terms, response_format
from openai_frontend.validation import _refuse_unsupported

ROLES = {"user": "user", "system": "system", "developer": "system", "assistant": "assistant"}
_TEXT_PARTS = ("input_text", "output_text")
# Fields an item or part may carry that change nothing in the prompt (an earlier output sent back).
_ITEM_EXTRAS = {"id", "status", "phase"}
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
    "tools": ([],),
    "tool_choice": ("none", "auto"),  # with no tools, both mean plain text
    "parallel_tool_calls": (),
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


def input_messages(body: ResponsesRequest) -> list[ChatMessage]:
    """The request's own input as chat messages (text only; content parts joined as chat joins them)."""
    if isinstance(body.input, str):
        return [ChatMessage(role="user", content=body.input)]
    if not body.input:
        raise invalid_request("input must not be empty", "input")
    return [_message(i, item) for i, item in enumerate(body.input)]


def _message(i: int, item: InputItem) -> ChatMessage:
    if item.type not in (None, "message"):
        raise _unsupported(f"input[{i}].type")
    extra = set(item.model_extra or {}) - _ITEM_EXTRAS
    if extra:
        raise _unsupported(f"input[{i}].{sorted(extra)[0]}")
    role = ROLES.get(item.role or "")
    if role is None:
        raise invalid_request(
            f"role {item.role!r} is not supported; use one of {', '.join(ROLES)}", f"input[{i}].role"
        )
    content = item.content
    if content is None:
        raise invalid_request("a message item needs content", f"input[{i}].content")
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            param = f"input[{i}].content[{j}]"
            if part.type not in _TEXT_PARTS:
                raise _unsupported(f"{param}.type")
            extra = set(part.model_extra or {}) - _PART_EXTRAS
            if extra:
                raise _unsupported(f"{param}.{sorted(extra)[0]}")
            if part.text is None:
                raise invalid_request("a text part needs text", f"{param}.text")
            texts.append(part.text)
        content = "\n".join(texts)  # as the chat endpoint joins text parts
    return ChatMessage(role=role, content=content)


def chat_request(body: ResponsesRequest, conversation: list[ChatMessage]) -> ChatCompletionRequest:
    """The chat request that runs `conversation` (history plus this input) with the body's settings."""
    system = [] if body.instructions is None else [ChatMessage(role="system", content=body.instructions)]
    fields = body.model_dump(include=set(_CHAT_FIELDS), exclude_none=True)
    return ChatCompletionRequest(
        messages=system + conversation,
        max_completion_tokens=body.max_output_tokens,
        response_format=response_format(body.text),
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
        raise
