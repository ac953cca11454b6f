"""Every string a client names or identifies something with is capped: one character past the cap is a
400 naming the field (OpenAI's `string_above_max_length`), the cap itself passes.

Before, a chat message `name` of 100,000 characters was accepted, stored with the request and quoted
back; so were ids, enumerated values quoted in the errors that refused them, and descriptions.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from openai_frontend.anthropic.schemas import MessagesRequest
from openai_frontend.batch.input import parse_input
from openai_frontend.model.served_model import ModelRules, ServedModel
from openai_frontend.model.tokenizer import ModelTokenizer
from openai_frontend.protocol.errors import OpenAIError, validation_error
from openai_frontend.protocol.openai_schemas import ChatCompletionRequest, ChatMessage, CompletionRequest
from openai_frontend.protocol.strings import (
    MAX_DESCRIPTION_CHARS,
    MAX_ID_CHARS,
    MAX_NAME_CHARS,
    MAX_WORD_CHARS,
)
from openai_frontend.protocol.tokenizer_schemas import TokenizeCompletionRequest
from openai_frontend.responses.schemas import ResponsesRequest
from openai_frontend.tools.history import tool_fields
from openai_frontend.tools.tool_choice import tool_use

USER = [{"role": "user", "content": "hi"}]
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}}
Body = Callable[[str], dict[str, Any]]


def _with(base: dict[str, Any], **fields: Any) -> Body:
    """`base` with its field at `fields`' one key holding the value (a callable of it, for nesting)."""
    [(name, make)] = fields.items()
    return lambda v: {**base, name: make(v)}


# The smallest valid body of each API, which a case's field is set in.
CHAT: dict[str, Any] = {"messages": USER}
PROMPT: dict[str, Any] = {"prompt": "hi"}
INPUT: dict[str, Any] = {"input": "hi"}
MESSAGES: dict[str, Any] = {"model": "m", "max_tokens": 8, "messages": USER}
TOOL_USE = {"type": "tool_use", "id": "t", "name": "f", "input": {}}
TOOL_RESULT = {"type": "tool_result", "tool_use_id": "t", "content": "4"}


def _chat(**fields: Any) -> Body:
    return _with(CHAT, **fields)


# (schema, body holding the value, the param the refusal names, the cap)
Case = tuple[type[BaseModel], Body, str, int]


def _top_level(schema: type[BaseModel], base: dict[str, Any], name: str, cap: int) -> Case:
    """A case of a top-level string field `name` of `base`, which the refusal names as it is."""
    return schema, _with(base, **{name: str}), name, cap


SCHEMA_CASES: dict[str, Case] = {
    "chat message name": (
        ChatCompletionRequest,
        lambda v: {"messages": [{"role": "user", "content": "hi", "name": v}]},
        "messages[0].name",
        MAX_NAME_CHARS,
    ),
    "chat message role": (
        ChatCompletionRequest,
        lambda v: {"messages": [{"role": v, "content": "hi"}]},
        "messages[0].role",
        MAX_WORD_CHARS,
    ),
    "chat tool_call_id": (
        ChatCompletionRequest,
        lambda v: {"messages": [{"role": "tool", "content": "4", "tool_call_id": v}]},
        "messages[0].tool_call_id",
        MAX_ID_CHARS,
    ),
    "chat content part type": (
        ChatCompletionRequest,
        lambda v: {"messages": [{"role": "user", "content": [{"type": v, "text": "hi"}]}]},
        "messages[0].content[0].type",
        MAX_WORD_CHARS,
    ),
    "chat model": _top_level(ChatCompletionRequest, CHAT, "model", MAX_ID_CHARS),
    "chat prompt_cache_key": _top_level(ChatCompletionRequest, CHAT, "prompt_cache_key", MAX_ID_CHARS),
    "chat service_tier": _top_level(ChatCompletionRequest, CHAT, "service_tier", MAX_WORD_CHARS),
    "chat tool_choice": _top_level(ChatCompletionRequest, CHAT, "tool_choice", MAX_WORD_CHARS),
    "chat reasoning_effort": _top_level(ChatCompletionRequest, CHAT, "reasoning_effort", MAX_WORD_CHARS),
    "chat verbosity": _top_level(ChatCompletionRequest, CHAT, "verbosity", MAX_WORD_CHARS),
    "chat modalities": (
        ChatCompletionRequest,
        _chat(modalities=lambda v: [v]),
        "modalities[0]",
        MAX_WORD_CHARS,
    ),
    "chat logit_bias key": (
        ChatCompletionRequest,
        _chat(logit_bias=lambda v: {v: 1.0}),
        "logit_bias",
        MAX_WORD_CHARS,
    ),
    "chat response_format type": (
        ChatCompletionRequest,
        _chat(response_format=lambda v: {"type": v}),
        "response_format.type",
        MAX_WORD_CHARS,
    ),
    "chat json_schema name": (
        ChatCompletionRequest,
        _chat(
            response_format=lambda v: {"type": "json_schema", "json_schema": {"name": v, "schema": SCHEMA}}
        ),
        "response_format.json_schema.name",
        MAX_NAME_CHARS,
    ),
    "chat json_schema description": (
        ChatCompletionRequest,
        _chat(
            response_format=lambda v: {
                "type": "json_schema",
                "json_schema": {"name": "n", "description": v, "schema": SCHEMA},
            }
        ),
        "response_format.json_schema.description",
        MAX_DESCRIPTION_CHARS,
    ),
    "completion model": _top_level(CompletionRequest, PROMPT, "model", MAX_ID_CHARS),
    "tokenize model": _top_level(TokenizeCompletionRequest, PROMPT, "model", MAX_ID_CHARS),
    "responses model": _top_level(ResponsesRequest, INPUT, "model", MAX_ID_CHARS),
    "responses previous_response_id": _top_level(
        ResponsesRequest, INPUT, "previous_response_id", MAX_ID_CHARS
    ),
    "responses call_id": (
        ResponsesRequest,
        lambda v: {"input": [{"type": "function_call_output", "call_id": v, "output": "4"}]},
        "input[0].call_id",
        MAX_ID_CHARS,
    ),
    "responses item role": (
        ResponsesRequest,
        lambda v: {"input": [{"role": v, "content": "hi"}]},
        "input[0].role",
        MAX_WORD_CHARS,
    ),
    "responses text.format name": (
        ResponsesRequest,
        _with(INPUT, text=lambda v: {"format": {"type": "json_schema", "name": v, "schema": SCHEMA}}),
        "text.format.name",
        MAX_NAME_CHARS,
    ),
    "responses text.format description": (
        ResponsesRequest,
        _with(INPUT, text=lambda v: {"format": {"type": "json_schema", "name": "n", "description": v}}),
        "text.format.description",
        MAX_DESCRIPTION_CHARS,
    ),
    "responses tool_choice": _top_level(ResponsesRequest, INPUT, "tool_choice", 64),
    "responses prompt_cache_key": _top_level(ResponsesRequest, INPUT, "prompt_cache_key", MAX_ID_CHARS),
    "anthropic model": _top_level(MessagesRequest, MESSAGES, "model", MAX_ID_CHARS),
    "anthropic tool name": (
        MessagesRequest,
        _with(MESSAGES, tools=lambda v: [{"name": v, "input_schema": SCHEMA}]),
        "tools[0].name",
        MAX_NAME_CHARS,
    ),
    "anthropic tool description": (
        MessagesRequest,
        _with(MESSAGES, tools=lambda v: [{"name": "f", "description": v, "input_schema": SCHEMA}]),
        "tools[0].description",
        MAX_DESCRIPTION_CHARS,
    ),
    "anthropic tool_use id": (
        MessagesRequest,
        _with(MESSAGES, messages=lambda v: [{"role": "assistant", "content": [TOOL_USE | {"id": v}]}]),
        "messages[0].content[0].id",
        MAX_ID_CHARS,
    ),
    "anthropic tool_result tool_use_id": (
        MessagesRequest,
        _with(MESSAGES, messages=lambda v: [{"role": "user", "content": [TOOL_RESULT | {"tool_use_id": v}]}]),
        "messages[0].content[0].tool_use_id",
        MAX_ID_CHARS,
    ),
}


def _refusal(schema: type[BaseModel], body: dict[str, Any]) -> OpenAIError:
    with pytest.raises(ValidationError) as refused:
        schema.model_validate(body)
    return validation_error(refused.value.errors())


def assert_too_long(error: OpenAIError, param: str, cap: int) -> None:
    assert (error.status, error.param, error.code) == (400, param, "string_above_max_length"), error.body()
    assert f"'{param}'" in error.message and f"maximum length {cap}," in error.message, error.message


@pytest.mark.parametrize("case", list(SCHEMA_CASES))
def test_one_past_the_cap_is_refused_naming_the_field(case: str) -> None:
    schema, body, param, cap = SCHEMA_CASES[case]
    assert_too_long(_refusal(schema, body("x" * (cap + 1))), param, cap)


@pytest.mark.parametrize("case", list(SCHEMA_CASES))
def test_the_cap_itself_passes(case: str) -> None:
    schema, body, _, cap = SCHEMA_CASES[case]
    schema.model_validate(body("x" * cap))


def test_a_lone_surrogate_in_a_capped_field_is_named_as_the_value() -> None:
    error = _refusal(
        ChatCompletionRequest, {"messages": [{"role": "user", "content": "hi", "name": "\ud83d"}]}
    )
    assert error.param == "messages[0].name" and "not valid Unicode" in error.message
    assert "field name" not in error.message


def test_what_the_model_wrote_is_not_capped() -> None:
    # A tool call's name comes back as the model wrote it (the parsers take any name): only the prompt
    # bounds it, as it bounds the call's arguments.
    long_name = "f" * 1000
    chat = {
        "role": "assistant",
        "tool_calls": [{"id": "call_1", "function": {"name": long_name, "arguments": "{}"}}],
    }
    message = ChatCompletionRequest.model_validate({"messages": [chat]}).messages[0]
    assert tool_fields(0, message)["tool_calls"][0]["function"]["name"] == long_name
    ResponsesRequest.model_validate(
        {"input": [{"type": "function_call", "call_id": "c", "name": long_name, "arguments": "{}"}]}
    )


@pytest.mark.parametrize("length", [MAX_ID_CHARS, MAX_ID_CHARS + 1])
def test_a_tool_call_id_sent_back_is_capped(length: int) -> None:
    call = {"id": "c" * length, "type": "function", "function": {"name": "f", "arguments": "{}"}}
    message = ChatMessage(role="assistant", tool_calls=[call])
    if length == MAX_ID_CHARS:
        assert tool_fields(2, message)["tool_calls"][0]["id"] == call["id"]
        return
    with pytest.raises(OpenAIError) as refused:
        tool_fields(2, message)
    assert_too_long(refused.value, "messages[2].tool_calls[0].id", MAX_ID_CHARS)


@pytest.fixture(scope="module")
def served(tiny_model_dir: Path) -> ServedModel:
    rules = ModelRules(name="tiny", max_model_len=512)
    return ServedModel(rules=rules, root=str(tiny_model_dir), tokenizer=ModelTokenizer(tiny_model_dir))


def _tools(description: str, choice: Any = None) -> ChatCompletionRequest:
    function = {"name": "get_weather", "description": description, "parameters": SCHEMA}
    return ChatCompletionRequest.model_validate(
        {"messages": USER, "tools": [{"type": "function", "function": function}], "tool_choice": choice}
    )


def test_a_tool_description_is_capped(served: ServedModel) -> None:
    assert tool_use(_tools("d" * MAX_DESCRIPTION_CHARS), served).parser is not None
    with pytest.raises(OpenAIError) as refused:
        tool_use(_tools("d" * (MAX_DESCRIPTION_CHARS + 1)), served)
    assert_too_long(refused.value, "tools[0].function.description", MAX_DESCRIPTION_CHARS)


def test_a_named_tool_choice_is_capped_before_it_is_quoted(served: ServedModel) -> None:
    def named(name: str) -> Any:
        return {"type": "function", "function": {"name": name}}

    assert tool_use(_tools("d", named("get_weather")), served).grammar is not None
    with pytest.raises(OpenAIError) as refused:
        tool_use(_tools("d", named("g" * (MAX_NAME_CHARS + 1))), served)
    assert_too_long(refused.value, "tool_choice.function.name", MAX_NAME_CHARS)
    with pytest.raises(OpenAIError, match="not among the tools"):  # at the cap: an unknown tool
        tool_use(_tools("d", named("g" * MAX_NAME_CHARS)), served)


@pytest.mark.parametrize("length", [MAX_ID_CHARS, MAX_ID_CHARS + 1])
def test_a_batch_lines_custom_id_is_capped(length: int) -> None:
    line = {"custom_id": "c" * length, "method": "POST", "url": "/v1/completions", "body": {"prompt": "hi"}}
    lines, errors = parse_input(json.dumps(line).encode(), "/v1/completions")
    if length == MAX_ID_CHARS:
        assert [x.custom_id for x in lines] == [line["custom_id"]] and errors == []
    else:
        [error] = errors
        assert error["code"] == "string_above_max_length" and error["param"] == "custom_id", error
        assert str(MAX_ID_CHARS) in error["message"]
