"""The Messages API as chat requests (openai_frontend/anthropic/): the conversation each body becomes,
what is refused by name, and the stream's events, which rebuild the non-streamed Message however the
text arrives."""

from __future__ import annotations

import itertools
import json
import random
from typing import Any

import pytest

from openai_frontend.anthropic.errors import error_body, speaks_anthropic
from openai_frontend.anthropic.events import MessageEvents
from openai_frontend.anthropic.input import ERROR_PREFIX, anthropic_terms, chat_request
from openai_frontend.anthropic.message import block, message_object, stop_reason, tool_input
from openai_frontend.anthropic.schemas import CountTokensRequest, MessagesRequest
from openai_frontend.follow.stream_out import StreamEvent
from openai_frontend.protocol.errors import OpenAIError, invalid_request
from openai_frontend.responses.items import CallItem, output_items
from tests.unit.openai_frontend.responses.test_responses_items import _meta

CALL = '<tool_call>\n{"name": "%s", "arguments": %s}\n</tool_call>'
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}}
TOOL = {"name": "get_weather", "description": "the weather", "input_schema": SCHEMA}


def _body(**fields: Any) -> MessagesRequest:
    return MessagesRequest.model_validate(
        {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}], **fields}
    )


def _messages(**fields: Any) -> list[dict[str, Any]]:
    chat = chat_request(_body(**fields))
    return [m.model_dump(exclude_none=True) for m in chat.messages]


def test_system_blocks_turns_and_sampling_carry_over() -> None:
    chat = chat_request(
        _body(
            system=[
                {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}},
                {"type": "text", "text": "Be kind."},
            ],
            messages=[
                {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                {"role": "user", "content": "c"},
                {"role": "assistant", "content": "d"},
                {"role": "user", "content": "e"},
            ],
            max_tokens=12,
            temperature=0.5,
            top_p=0.9,
            top_k=4,
            stop_sequences=["\n\n"],
            metadata={"user_id": "u-1"},
            stream=True,
        )
    )
    assert [m.model_dump(exclude_none=True) for m in chat.messages] == [
        {"role": "system", "content": "Be brief.\nBe kind."},
        {"role": "user", "content": "a\nb\nc"},  # consecutive user messages are one turn
        {"role": "assistant", "content": "d"},
        {"role": "user", "content": "e"},
    ]
    assert (chat.max_tokens, chat.temperature, chat.top_p, chat.top_k) == (12, 0.5, 0.9, 4)
    assert (chat.stop, chat.user, chat.stream, chat.model) == (["\n\n"], "u-1", True, "m")


def test_tool_turns_become_chats() -> None:
    messages = _messages(
        tools=[TOOL],
        messages=[
            {"role": "user", "content": "Weather?"},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Let me look."},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Oslo"}},
                    {"type": "tool_use", "id": "toolu_2", "name": "get_weather", "input": {}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_1",
                        "content": [{"type": "text", "text": "5 C"}],
                    },
                    {"type": "tool_result", "tool_use_id": "toolu_2", "content": "no city", "is_error": True},
                    {"type": "text", "text": "Thanks."},
                ],
            },
        ],
    )
    assert messages == [
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "content": "Let me look.",
            "tool_calls": [
                {
                    "id": "toolu_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
                },
                {"id": "toolu_2", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}},
            ],
        },
        {"role": "tool", "content": "5 C", "tool_call_id": "toolu_1"},
        {"role": "tool", "content": ERROR_PREFIX + "no city", "tool_call_id": "toolu_2"},
        {"role": "user", "content": "Thanks."},
    ]


@pytest.mark.parametrize(
    ("tool_choice", "chat_choice", "parallel"),
    [
        (None, None, None),
        ({"type": "auto"}, "auto", None),
        ({"type": "any", "disable_parallel_tool_use": True}, "required", False),
        ({"type": "none"}, "none", None),
        (
            {"type": "tool", "name": "get_weather"},
            {"type": "function", "function": {"name": "get_weather"}},
            None,
        ),
    ],
)
def test_tools_and_tool_choice_are_chats(tool_choice: Any, chat_choice: Any, parallel: bool | None) -> None:
    tool = {**TOOL, "strict": True, "cache_control": {"type": "ephemeral"}}
    chat = chat_request(_body(tools=[tool], tool_choice=tool_choice))
    function = {"name": "get_weather", "description": "the weather", "parameters": SCHEMA, "strict": True}
    assert chat.tools == [{"type": "function", "function": function}]
    assert (chat.tool_choice, chat.parallel_tool_calls) == (chat_choice, parallel)


def test_earlier_thoughts_sent_back_are_left_out() -> None:
    thought = {"type": "thinking", "thinking": "Hm.", "signature": ""}
    answer = {
        "role": "assistant",
        "content": [thought, {"type": "redacted_thinking", "data": "x"}, {"type": "text", "text": "A list."}],
    }
    messages = _messages(
        messages=[{"role": "user", "content": "Hi"}, answer, {"role": "user", "content": "And?"}]
    )
    assert messages[1] == {"role": "assistant", "content": "A list."}
    with pytest.raises(OpenAIError, match="'thinking'"):
        _messages(messages=[{"role": "user", "content": [thought]}])


def test_a_final_assistant_message_is_continued() -> None:
    chat = chat_request(
        _body(messages=[{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Well,"}])
    )
    assert chat.messages[-1].model_dump(exclude_none=True) == {"role": "assistant", "content": "Well,"}
    assert (chat.continue_final_message, chat.add_generation_prompt) == (True, False)
    plain = chat_request(_body())
    assert (plain.continue_final_message, plain.add_generation_prompt) == (False, True)


def test_output_config_format_is_a_json_schema() -> None:
    chat = chat_request(_body(output_config={"format": {"type": "json_schema", "schema": SCHEMA}}))
    assert chat.response_format is not None and chat.response_format.type == "json_schema"
    assert chat.response_format.json_schema is not None and chat.response_format.json_schema.schema_ == SCHEMA


def test_count_tokens_body_is_the_same_prompt() -> None:
    fields = {"model": "m", "system": "s", "messages": [{"role": "user", "content": "Hi"}], "tools": [TOOL]}
    counted = chat_request(CountTokensRequest.model_validate(fields))
    created = chat_request(_body(**fields))
    assert counted.messages == created.messages and counted.tools == created.tools


@pytest.mark.parametrize(
    ("fields", "needle"),
    [
        (
            {"messages": [{"role": "user", "content": [{"type": "document", "source": {}, "title": "t"}]}]},
            "'document'",
        ),
        (
            {
                "messages": [
                    {"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "n", "input": {}}]}
                ]
            },
            "'tool_use'",
        ),
        ({"messages": [{"role": "system", "content": "x"}]}, "role"),
        (
            {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Well "}]},
            "trailing",
        ),
        (
            {
                "tools": [TOOL],
                "messages": [
                    {"role": "user", "content": "Hi"},
                    {
                        "role": "assistant",
                        "content": [{"type": "tool_use", "id": "t", "name": "get_weather", "input": {}}],
                    },
                ],
            },
            "cannot be continued",
        ),
        (
            {
                "messages": [
                    {"role": "user", "content": [{"type": "text", "text": "x", "citations": [{"a": 1}]}]}
                ]
            },
            "citations",
        ),
        ({"messages": []}, "at least one"),
        ({"tools": [{"type": "bash_20250124", "name": "bash"}]}, "bash_20250124"),
        ({"tools": [{**TOOL, "defer_loading": True}]}, "defer_loading"),
        ({"tools": [{"name": "x"}]}, "input_schema"),
        ({"tools": [TOOL], "tool_choice": {"type": "sometimes"}}, "auto, any, tool or none"),
        ({"thinking": {"type": "enabled", "budget_tokens": 1024}}, "thinking"),
        ({"output_config": {"effort": "low"}}, "output_config.effort"),
        ({"mcp_servers": []}, "mcp_servers"),
        ({"metadata": {"session": "x"}}, "metadata.session"),
        ({"service_tier": "priority"}, "service_tier"),
    ],
)
def test_refused_by_name(fields: dict[str, Any], needle: str) -> None:
    with pytest.raises(OpenAIError) as caught:
        chat_request(_body(**fields))
    assert caught.value.status == 400 and needle in caught.value.message


def test_chat_errors_speak_of_anthropic_fields() -> None:
    with pytest.raises(OpenAIError) as caught, anthropic_terms():
        raise invalid_request(
            "tools[0].function.parameters must describe an object", "tools[0].function.parameters"
        )
    assert (
        caught.value.message == "tools[0].input_schema must describe an object" and caught.value.param is None
    )
    with pytest.raises(OpenAIError) as caught, anthropic_terms():
        raise invalid_request("stop strings must not be empty", "stop")
    assert caught.value.message == "stop_sequences must not be empty"


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, "invalid_request_error"),
        (401, "authentication_error"),
        (404, "not_found_error"),
        (413, "request_too_large"),
        (429, "rate_limit_error"),
        (503, "overloaded_error"),
        (504, "timeout_error"),
        (500, "api_error"),
        (410, "invalid_request_error"),
    ],
)
def test_error_body_is_anthropics(status: int, kind: str) -> None:
    assert error_body(OpenAIError(status, "why")) == {
        "type": "error",
        "error": {"type": kind, "message": "why"},
    }


def test_only_the_messages_paths_speak_anthropic() -> None:
    assert speaks_anthropic("/v1/messages") and speaks_anthropic("/v1/messages/count_tokens")
    assert not speaks_anthropic("/v1/messagesx") and not speaks_anthropic("/v1/chat/completions")


def _replay(events: list[StreamEvent]) -> dict[str, Any]:
    """The Message as a client builds it from the events, checking their order as it goes."""
    names = [event.type for event in events]
    assert (
        names.count("ping") == 1
        and names[0] == "message_start"
        and names[-2:] == ["message_delta", "message_stop"]
    )
    first_start = names.index("content_block_start") if "content_block_start" in names else len(names) - 2
    assert names[first_start + 1] == "ping" or first_start == len(names) - 2
    message: dict[str, Any] = {}
    arguments: dict[int, str] = {}
    open_block: int | None = None
    for event in events:
        name, fields = event.type, json.loads(event.data)
        assert fields["type"] == name
        if name == "message_start":
            message = fields["message"]
        elif name == "content_block_start":
            assert open_block is None and fields["index"] == len(message["content"])
            open_block = fields["index"]
            message["content"].append(fields["content_block"])
        elif name == "content_block_delta":
            assert fields["index"] == open_block
            delta = fields["delta"]
            if delta["type"] == "text_delta":
                message["content"][open_block]["text"] += delta["text"]
            else:
                arguments[open_block] = arguments.get(open_block, "") + delta["partial_json"]
        elif name == "content_block_stop":
            assert fields["index"] == open_block
            if open_block in arguments:
                message["content"][open_block]["input"] = json.loads(arguments[open_block])
            open_block = None
        elif name == "message_delta":
            assert open_block is None
            message.update(fields["delta"])
            message["usage"].update(fields["usage"])
    return message


@pytest.mark.parametrize(
    ("text", "tool_parser"),
    [
        ("Plain text.", None),
        ("", None),
        ("Sure.\n" + CALL % ("get_weather", '{"city": "Paris"}'), "hermes"),
        (CALL % ("a", "{}") + "\nAnd then\n" + CALL % ("b", '{"x": [1, 2]}'), "hermes"),
        ("No call at all.", "hermes"),
    ],
)
def test_events_rebuild_the_message_however_the_text_is_cut(text: str, tool_parser: str | None) -> None:
    request = _meta(tool_parser)
    items = output_items(request, text)
    made_calls = any(isinstance(i, CallItem) for i in items)
    reason = stop_reason("stop", None, made_calls)
    expected = message_object(request, [block(i) for i in items], (reason, None), 9)
    rng = random.Random(len(text))
    for _ in range(20):
        events = MessageEvents(request)
        # The text cut at random points, as token deltas would cut it.
        cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(0, 16)))) if text else []
        stream = events.opening()
        for a, b in itertools.pairwise([0, *cuts, len(text)]):
            stream += events.delta(text[a:b])
        stream += events.closing("stop", None, 9)
        assert _replay(stream) == expected


def test_stop_reasons_and_cut_inputs() -> None:
    assert stop_reason("length", None, True) == "max_tokens"
    assert stop_reason("stop", "\n", True) == "stop_sequence"
    assert stop_reason("stop", None, True) == "tool_use"
    assert stop_reason("stop", None, False) == "end_turn"
    # Arguments cut by max_tokens: parsed as far as they go, as the SDK's accumulator does.
    assert tool_input('{"city": "Par') == {}
    assert tool_input('{"n": 3, "xs": [1, 2') == {"n": 3, "xs": [1, 2]}
    assert tool_input("") == {}
