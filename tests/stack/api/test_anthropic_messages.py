"""The Anthropic Messages API through the whole stack, with the official `anthropic` SDK.

A message runs as the chat request of the same conversation, so its greedy text, prompt tokens and
forced tool calls must be the chat endpoint's. The SDK's own parsing must accept every answer and
event: sync and async `create`, the `messages.stream` helper, a tool-use round trip, count_tokens,
and errors in Anthropic's shape. The tiny model's weights are random: a tool call whose input
validates does so because the worker's grammar forced it.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import anthropic
import httpx
import jsonschema
import openai
import pytest

from common.protocol import FIELD, decode_request
from common.streams import REQUESTS_STREAM
from gateway.security.api_keys import hash_key
from harness.gateway.gateway_server import RunningGateway
from harness.processes.services import Stack, module_stack
from openai_frontend.anthropic.input import ERROR_PREFIX
from tests.stack.tools_reasoning.test_e2e_tool_calls import SCHEMAS

MODEL = "tiny-llama"
GREEDY: dict[str, Any] = {"extra_body": {"temperature": 0.0}}
SYSTEM = [{"type": "text", "text": "You answer briefly."}, {"type": "text", "text": "In English."}]
CONVERSATION: list[dict[str, Any]] = [
    {"role": "user", "content": "What is a list?"},
    {"role": "assistant", "content": [{"type": "text", "text": "A sequence."}]},
    {"role": "user", "content": [{"type": "text", "text": "And a tuple?"}]},
]
# The same conversation as chat messages: system blocks and text blocks joined with "\n".
CHAT_CONVERSATION: list[dict[str, Any]] = [
    {"role": "system", "content": "You answer briefly.\nIn English."},
    {"role": "user", "content": "What is a list?"},
    {"role": "assistant", "content": "A sequence."},
    {"role": "user", "content": "And a tuple?"},
]
TOOLS: list[dict[str, Any]] = [
    {"name": name, "description": f"{name} tool", "input_schema": schema} for name, schema in SCHEMAS.items()
]
CHAT_TOOLS = [
    {
        "type": "function",
        "function": {"name": t["name"], "description": t["description"], "parameters": t["input_schema"]},
    }
    for t in TOOLS
]
FINISH_TO_STOP = {"length": "max_tokens", "stop": "end_turn", "tool_calls": "tool_use"}
EVENT_TYPES = {
    "message_start",
    "content_block_start",
    "ping",
    "content_block_delta",
    "content_block_stop",
    "message_delta",
    "message_stop",
}

stack = module_stack("anthropic-stack", "tool_model_dir")


@pytest.fixture(scope="module")
def claude(stack: Stack) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=stack.base_url, api_key="unused", timeout=120, max_retries=0) as c:
        yield c


def _text(message: Any) -> str:
    return "".join(block.text for block in message.content if block.type == "text")


def _create(claude: anthropic.Anthropic, **params: Any) -> Any:
    body: dict[str, Any] = {"model": MODEL, "max_tokens": 16, "system": SYSTEM, "messages": CONVERSATION}
    return claude.messages.create(**{**body, **GREEDY, **params})


def _events(stack: Stack, body: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The raw SSE events of a streamed message: (event name, data)."""
    events: list[tuple[str, dict[str, Any]]] = []
    name = None
    with httpx.stream(
        "POST", f"{stack.base_url}/v1/messages", json={**body, "stream": True}, timeout=120
    ) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("event: "):
                name = line.removeprefix("event: ")
            elif line.startswith("data: "):
                assert name is not None, line
                events.append((name, json.loads(line.removeprefix("data: "))))
                name = None
    return events


def test_create_is_the_chat_answer(claude: anthropic.Anthropic, client: openai.OpenAI) -> None:
    message = _create(claude, metadata={"user_id": "user-anthropic-1"})
    chat = client.chat.completions.create(
        model=MODEL,
        messages=CHAT_CONVERSATION,
        max_tokens=16,
        temperature=0.0,  # type: ignore[arg-type]
    )
    choice = chat.choices[0]
    assert message.type == "message" and message.role == "assistant" and message.model == MODEL
    assert message.id.startswith("msg_")
    assert [block.type for block in message.content] == ["text"]
    assert _text(message) == choice.message.content
    assert message.stop_reason == FINISH_TO_STOP[choice.finish_reason] and message.stop_sequence is None
    assert chat.usage is not None
    assert message.usage.input_tokens == chat.usage.prompt_tokens
    assert message.usage.output_tokens == chat.usage.completion_tokens
    count = claude.messages.count_tokens(model=MODEL, system=SYSTEM, messages=CONVERSATION)  # type: ignore[arg-type]
    assert count.input_tokens == message.usage.input_tokens


def test_a_final_assistant_message_is_continued(claude: anthropic.Anthropic, client: openai.OpenAI) -> None:
    """A prefill: the answer continues the assistant's text (chat's continue_final_message), and holds
    only what follows it, as Anthropic's does."""
    prefill = {"role": "assistant", "content": "A tuple is"}
    message = _create(claude, messages=[*CONVERSATION, prefill], max_tokens=12)
    chat = client.chat.completions.create(
        model=MODEL,
        messages=[*CHAT_CONVERSATION, prefill],  # type: ignore[list-item]
        max_tokens=12,
        temperature=0.0,
        extra_body={"continue_final_message": True, "add_generation_prompt": False},
    )
    assert _text(message) == chat.choices[0].message.content
    assert chat.usage is not None and message.usage.input_tokens == chat.usage.prompt_tokens
    assert _text(message) != _text(_create(claude, max_tokens=12))  # not a new turn
    count = claude.messages.count_tokens(model=MODEL, system=SYSTEM, messages=[*CONVERSATION, prefill])  # type: ignore[arg-type, list-item]
    assert count.input_tokens == message.usage.input_tokens


def test_metadata_user_id_is_kept_with_the_request(stack: Stack, claude: anthropic.Anthropic) -> None:
    _create(claude, max_tokens=2, metadata={"user_id": "user-anthropic-2"})
    with stack.redis() as r:
        users = {decode_request(fields[FIELD]).user for _, fields in r.xrange(REQUESTS_STREAM)}
    assert "user-anthropic-2" in users


def test_sampling_parameters_take_effect(claude: anthropic.Anthropic) -> None:
    greedy = _text(_create(claude, max_tokens=24))
    # top_k 1 and a tiny top_p leave only the most likely token: greedy at any temperature.
    assert _text(_create(claude, max_tokens=24, extra_body={"temperature": 1.0, "top_k": 1})) == greedy
    assert _text(_create(claude, max_tokens=24, extra_body={"temperature": 1.0, "top_p": 1e-6})) == greedy
    sampled = {_text(_create(claude, max_tokens=24, extra_body={"temperature": 1.0})) for _ in range(4)}
    assert sampled != {greedy}


def test_async_create_is_the_sync_one(stack: Stack, claude: anthropic.Anthropic) -> None:
    async def both() -> list[Any]:
        async with anthropic.AsyncAnthropic(base_url=stack.base_url, api_key="unused", max_retries=0) as c:
            body: dict[str, Any] = {
                "model": MODEL,
                "max_tokens": 12,
                "system": SYSTEM,
                "messages": CONVERSATION,
            }
            return list(await asyncio.gather(*(c.messages.create(**body, **GREEDY) for _ in range(2))))

    expected = _text(_create(claude, max_tokens=12))
    for message in asyncio.run(both()):
        assert _text(message) == expected and message.usage.output_tokens >= 1


def test_stream_helper_joins_to_the_message(claude: anthropic.Anthropic) -> None:
    expected = _create(claude, max_tokens=20)
    body: dict[str, Any] = {"model": MODEL, "max_tokens": 20, "system": SYSTEM, "messages": CONVERSATION}
    with claude.messages.stream(**body, **GREEDY) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == _text(final) == _text(expected)
    assert final.stop_reason == expected.stop_reason and final.usage == expected.usage


def test_stream_events_are_anthropics_sequence(stack: Stack) -> None:
    body = {"model": MODEL, "max_tokens": 8, "messages": CONVERSATION, "temperature": 0.0}
    events = _events(stack, body)
    names = [name for name, _ in events]
    assert all(data["type"] == name for name, data in events)
    assert names[:3] == ["message_start", "content_block_start", "ping"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(names[3:-3]) <= {"content_block_delta"} and set(names) <= EVENT_TYPES
    start = events[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None and start["usage"]["input_tokens"] > 0
    assert events[1][1] == {
        "type": "content_block_start",
        "index": 0,
        "content_block": {"type": "text", "text": ""},
    }
    assert all(d["delta"]["type"] == "text_delta" and d["index"] == 0 for _, d in events[3:-3])
    delta = events[-2][1]
    assert delta["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None} or delta["delta"] == {
        "stop_reason": "end_turn",
        "stop_sequence": None,
    }
    assert delta["usage"] == {"input_tokens": start["usage"]["input_tokens"], "output_tokens": 8} or (
        delta["delta"]["stop_reason"] == "end_turn"
    )


@pytest.mark.parametrize("stream", [False, True], ids=["create", "stream"])
def test_stop_sequences_end_the_message(claude: anthropic.Anthropic, stream: bool) -> None:
    full = _text(_create(claude, max_tokens=24))
    stop = full[4:6]
    assert len(stop) == 2, full
    params: dict[str, Any] = {"max_tokens": 24, "stop_sequences": ["never-written", stop]}
    if stream:
        body: dict[str, Any] = {"model": MODEL, "system": SYSTEM, "messages": CONVERSATION, **params}
        with claude.messages.stream(**body, **GREEDY) as s:
            message = s.get_final_message()
    else:
        message = _create(claude, **params)
    assert message.stop_reason == "stop_sequence" and message.stop_sequence == stop
    assert _text(message) == full[: full.index(stop)]


def _validate(block: Any) -> None:
    assert block.type == "tool_use" and block.id.startswith("toolu_")
    jsonschema.validate(block.input, SCHEMAS[block.name])


def test_tool_use_round_trip(claude: anthropic.Anthropic, client: openai.OpenAI) -> None:
    """A forced call, then its result sent back: each turn's prompt and answer are chat's."""
    user = [{"role": "user", "content": "What is the weather in Paris?"}]
    forced = {"type": "tool", "name": "get_weather"}
    first = _create(
        claude, system=anthropic.NOT_GIVEN, messages=user, tools=TOOLS, tool_choice=forced, max_tokens=200
    )
    assert first.stop_reason == "tool_use"
    [call] = first.content
    _validate(call)
    assert call.name == "get_weather"
    chat_first = client.chat.completions.create(
        model=MODEL,
        messages=user,  # type: ignore[arg-type]
        tools=CHAT_TOOLS,  # type: ignore[arg-type]
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=200,
        temperature=0.0,
    )
    [chat_call] = chat_first.choices[0].message.tool_calls or []
    assert json.loads(chat_call.function.arguments) == call.input
    assert chat_first.usage is not None and first.usage.input_tokens == chat_first.usage.prompt_tokens

    result = "18 degrees, sunny"
    turn = [
        *user,
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": result}]},
    ]
    second = _create(claude, system=anthropic.NOT_GIVEN, messages=turn, tools=TOOLS, max_tokens=24)
    chat_turn = [
        *user,
        {"role": "assistant", "content": None, "tool_calls": [chat_call.model_dump()]},
        {"role": "tool", "tool_call_id": chat_call.id, "content": result},
    ]
    chat_second = client.chat.completions.create(
        model=MODEL,
        messages=chat_turn,
        tools=CHAT_TOOLS,
        max_tokens=24,
        temperature=0.0,  # type: ignore[arg-type]
    )
    assert chat_second.usage is not None and second.usage.input_tokens == chat_second.usage.prompt_tokens
    assert _text(second) == (chat_second.choices[0].message.content or "")
    count = claude.messages.count_tokens(model=MODEL, messages=turn, tools=TOOLS)  # type: ignore[arg-type]
    assert count.input_tokens == second.usage.input_tokens

    # An error result reads as one: the tool's text after ERROR_PREFIX.
    failed = [*turn[:2], {"role": "user", "content": [{**turn[2]["content"][0], "is_error": True}]}]
    failed_count = claude.messages.count_tokens(model=MODEL, messages=failed, tools=TOOLS)  # type: ignore[arg-type]
    errored = [*chat_turn[:2], {**chat_turn[2], "content": ERROR_PREFIX + result}]
    chat_failed = client.chat.completions.create(
        model=MODEL,
        messages=errored,
        tools=CHAT_TOOLS,
        max_tokens=1,  # type: ignore[arg-type]
    )
    assert chat_failed.usage is not None and failed_count.input_tokens == chat_failed.usage.prompt_tokens


def test_streamed_tool_use_is_the_created_one(stack: Stack, claude: anthropic.Anthropic) -> None:
    user = [{"role": "user", "content": "Plan a trip."}]
    body: dict[str, Any] = {
        "model": MODEL,
        "max_tokens": 300,
        "messages": user,
        "tools": TOOLS,
        "tool_choice": {"type": "tool", "name": "book_trip"},
    }
    created = claude.messages.create(**body, **GREEDY)
    with claude.messages.stream(**body, **GREEDY) as stream:
        final = stream.get_final_message()
    assert [b.type for b in final.content] == ["tool_use"] == [b.type for b in created.content]
    assert final.content[0].input == created.content[0].input and final.content[0].name == "book_trip"
    _validate(final.content[0])
    assert final.stop_reason == created.stop_reason == "tool_use"
    events = _events(stack, {**body, "temperature": 0.0})
    names = [name for name, _ in events]
    assert names[:3] == ["message_start", "content_block_start", "ping"]
    opened = events[1][1]["content_block"]
    assert opened["type"] == "tool_use" and opened["name"] == "book_trip" and opened["input"] == {}
    pieces = [d["delta"]["partial_json"] for n, d in events if n == "content_block_delta"]
    assert json.loads("".join(pieces)) == created.content[0].input


@pytest.mark.parametrize("disable_parallel", [False, True])
def test_any_forces_calls(claude: anthropic.Anthropic, disable_parallel: bool) -> None:
    choice: dict[str, Any] = {"type": "any", "disable_parallel_tool_use": disable_parallel}
    for seed_temperature in (0.0, 1.0):
        message = claude.messages.create(
            model=MODEL,
            max_tokens=400,
            messages=[{"role": "user", "content": "Plan a trip."}],
            tools=TOOLS,  # type: ignore[arg-type]
            tool_choice=choice,  # type: ignore[arg-type]
            extra_body={"temperature": seed_temperature},
        )
        calls = [b for b in message.content if b.type == "tool_use"]
        assert calls, message
        for call in calls[:-1] if message.stop_reason == "max_tokens" else calls:
            _validate(call)
        if disable_parallel:
            assert len(calls) == 1 and message.stop_reason == "tool_use"


def test_tool_choice_none_calls_nothing(claude: anthropic.Anthropic) -> None:
    message = _create(claude, tools=TOOLS, tool_choice={"type": "none"}, max_tokens=24)
    assert [b.type for b in message.content] == ["text"] and message.stop_reason != "tool_use"


def _refused(
    claude: anthropic.Anthropic, error: type[anthropic.APIStatusError], kind: str, **params: Any
) -> str:
    with pytest.raises(error) as caught:
        _create(claude, **params)
    body = caught.value.body
    assert isinstance(body, dict) and body["type"] == "error" and set(body["error"]) == {"type", "message"}
    assert body["error"]["type"] == kind
    return str(body["error"]["message"])


@pytest.mark.parametrize(
    ("params", "needle"),
    [
        (
            {
                "messages": [
                    {"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "x"}}]}
                ]
            },
            "'image'",
        ),
        ({"messages": [*CONVERSATION, {"role": "assistant", "content": "Well, "}]}, "trailing whitespace"),
        ({"extra_body": {"thinking": {"type": "enabled", "budget_tokens": 1024}}}, "thinking"),
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "web_search_20250305"),
        ({"tools": TOOLS, "tool_choice": {"type": "tool", "name": "nope"}}, "'nope'"),
        ({"stop_sequences": [""]}, "stop_sequences"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"extra_body": {"frequency_penalty": 1.0}}, "frequency_penalty"),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "tool_result", "tool_use_id": "toolu_x", "content": "1"}],
                    }
                ]
            },
            "toolu_x",
        ),
    ],
    ids=[
        "image",
        "prefill-space",
        "thinking",
        "server-tool",
        "unknown-tool",
        "empty-stop",
        "max-tokens",
        "unknown",
        "orphan-result",
    ],
)
def test_refusals_name_what_is_refused(
    claude: anthropic.Anthropic, params: dict[str, Any], needle: str
) -> None:
    assert needle in _refused(claude, anthropic.BadRequestError, "invalid_request_error", **params)


def test_errors_are_in_anthropics_shape(stack: Stack, claude: anthropic.Anthropic) -> None:
    assert "tiny-llama" in _refused(claude, anthropic.NotFoundError, "not_found_error", model="claude-x")
    response = httpx.post(f"{stack.base_url}/v1/messages", json={"model": MODEL, "messages": CONVERSATION})
    assert response.status_code == 400
    assert response.json() == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "max_tokens: Field required"},
    }
    # The other endpoints keep OpenAI's shape.
    chat = httpx.post(f"{stack.base_url}/v1/chat/completions", json={"model": "claude-x", "messages": []})
    assert chat.status_code == 404 and set(chat.json()) == {"error"}


def test_x_api_key_is_the_bearer_key(make_gateway: Callable[..., RunningGateway], tmp_path: Path) -> None:
    key = "sk-anthropic-client"
    gateway = make_gateway(api_key_hashes=f"claude:{hash_key(key)}")
    body = {"model": "tiny-llama", "messages": [{"role": "user", "content": "Hi"}]}
    with anthropic.Anthropic(base_url=gateway.url, api_key=key, max_retries=0) as good:
        assert good.messages.count_tokens(**body).input_tokens > 0  # type: ignore[arg-type]
    bad = anthropic.Anthropic(base_url=gateway.url, api_key="sk-wrong", max_retries=0)
    with bad, pytest.raises(anthropic.AuthenticationError) as caught:
        bad.messages.count_tokens(**body)  # type: ignore[arg-type]
    assert caught.value.body == {
        "type": "error",
        "error": {"type": "authentication_error", "message": "Incorrect API key provided."},
    }
    # As the Bearer token, on every path.
    assert gateway.client.get("/v1/models", headers={"x-api-key": key}).status_code == 200
    assert gateway.client.get("/v1/models").status_code == 401


def test_a_waiting_stream_sends_pings(make_gateway: Callable[..., RunningGateway]) -> None:
    """While the message waits (queued here: no batcher answers), Anthropic's `ping` event keeps the
    stream alive, after the opening events."""
    gateway = make_gateway(sse_keepalive_s=1.0)
    gateway.harness.heartbeat()  # a worker seems alive; nothing answers the request
    body = {
        "model": "tiny-llama",
        "max_tokens": 4,
        "stream": True,
        "messages": [{"role": "user", "content": "Hi"}],
    }
    names: list[str] = []
    started = time.monotonic()
    with httpx.stream("POST", f"{gateway.url}/v1/messages", json=body, timeout=30) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("event: "):
                names.append(line.removeprefix("event: "))
            if names.count("ping") >= 3:
                break
    assert names == ["message_start", "content_block_start", "ping", "ping", "ping"], names
    assert time.monotonic() - started < 10
    gateway.harness.next_request()  # the request was queued as usual


def test_a_failed_request_is_an_error_event_or_answer(make_gateway: Callable[..., RunningGateway]) -> None:
    """After the stream began, a failure is Anthropic's `error` event (the SDK raises it); before, an
    error answer in Anthropic's shape with the failure's status."""
    gateway = make_gateway()
    gateway.harness.heartbeat()
    body: dict[str, Any] = {
        "model": "tiny-llama",
        "max_tokens": 4,
        "messages": [{"role": "user", "content": "Hi"}],
    }
    expected = {"type": "error", "error": {"type": "api_error", "message": "the worker broke"}}
    with anthropic.Anthropic(base_url=gateway.url, api_key="unused", max_retries=0) as claude:
        with claude.messages.stream(**body) as stream:
            req_id = gateway.harness.next_request().req_id
            gateway.harness.emit_tokens(req_id, [5, 6], finish_reason=None)
            gateway.harness.emit_error(req_id, "the worker broke")
            with pytest.raises(anthropic.APIStatusError) as caught:
                stream.get_final_message()
        assert caught.value.body == expected
        with ThreadPoolExecutor(1) as pool:
            future = pool.submit(claude.messages.create, **body)
            req_id = gateway.harness.next_request().req_id
            gateway.harness.emit_error(req_id, "the worker broke")
            with pytest.raises(anthropic.InternalServerError) as raised:
                future.result(timeout=30)
    assert raised.value.status_code == 500 and raised.value.body == expected
