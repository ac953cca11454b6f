"""Function tools in the Responses API through the whole stack, with the official `openai` SDK.

The tiny model's weights are random: every forced call whose arguments validate does so because the
worker's grammar forced it. A response with tools runs as the chat request with the same tools, so
its calls and its answer after a tool result must be the chat endpoint's; streamed events rebuild
the response's output; the agent loop works through `previous_response_id` and by sending the
items back; a background response with a call resumes its stream with the same events.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import jsonschema
import openai
import pytest

from harness.processes.services import Stack, module_stack
from tests.stack.api.test_responses_api import leave_and_resume
from tests.stack.tools_reasoning.test_e2e_tool_calls import SCHEMAS, TOOLS

MODEL = "tiny-llama"
PROMPT = "Plan a trip."
# The same tools in the Responses API's flat shape.
FLAT_TOOLS: list[dict[str, Any]] = [{"type": "function", **t["function"]} for t in TOOLS]
GREEDY: dict[str, Any] = {"temperature": 0.0}
# Greedy text of a fixed length: the tiny model's answers never end early.
LONG_GREEDY: dict[str, Any] = {"temperature": 0.0, "extra_body": {"ignore_eos": True}}
SEEDS = range(3)
CALL_EVENTS = [
    "response.output_item.added",
    "response.function_call_arguments.delta",
    "response.function_call_arguments.done",
    "response.output_item.done",
]


stack = module_stack("responses-tools-stack", "tool_model_dir")


def _calls(response: Any) -> list[Any]:
    return [item for item in response.output if item.type == "function_call"]


def _validate(call: Any) -> None:
    schema = SCHEMAS.get(call.name, {"type": "object", "additionalProperties": False})
    jsonschema.validate(json.loads(call.arguments), schema)
    assert call.call_id.startswith("call_") and call.id == "fc_" + call.call_id.removeprefix("call_")
    assert call.status == "completed"


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "name": "book_trip"}])
def test_forced_call_validates_at_temperature_one(client: openai.OpenAI, tool_choice: Any) -> None:
    for seed in SEEDS:
        response = client.responses.create(
            model=MODEL,
            input=PROMPT,
            tools=FLAT_TOOLS,  # type: ignore[arg-type]
            tool_choice=tool_choice,
            parallel_tool_calls=False,
            temperature=1.0,
            max_output_tokens=200,
            extra_body={"seed": seed},
        )
        assert response.status == "completed", response
        [call] = response.output  # forced calls only: no message item
        assert call.type == "function_call"
        _validate(call)
        if tool_choice != "required":
            assert call.name == "book_trip"
        assert response.output_text == ""
        echoed = response.tool_choice if isinstance(tool_choice, str) else response.tool_choice.model_dump()  # type: ignore[union-attr]
        assert echoed == tool_choice
        assert response.parallel_tool_calls is False
        assert [t.name for t in response.tools] == [t["name"] for t in FLAT_TOOLS]  # type: ignore[union-attr]


def test_named_call_is_the_chat_answer(client: openai.OpenAI) -> None:
    response = client.responses.create(
        model=MODEL,
        input=PROMPT,
        tools=FLAT_TOOLS,  # type: ignore[arg-type]
        tool_choice={"type": "function", "name": "get_weather"},
        max_output_tokens=100,
        **GREEDY,
    )
    chat = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": PROMPT}],
        tools=TOOLS,  # type: ignore[arg-type]
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=100,
        **GREEDY,
    )
    [call] = _calls(response)
    [chat_call] = chat.choices[0].message.tool_calls or []
    assert (call.name, call.arguments) == (chat_call.function.name, chat_call.function.arguments)  # type: ignore[union-attr]
    assert response.tool_choice.type == "function" and response.tool_choice.name == "get_weather"  # type: ignore[union-attr]
    assert response.parallel_tool_calls is True
    assert response.usage is not None and response.usage.input_tokens == chat.usage.prompt_tokens  # type: ignore[union-attr]


def _reassembled(events: list[Any]) -> dict[int, dict[str, Any]]:
    """Each output item as the stream's events build it, by output index."""
    items: dict[int, dict[str, Any]] = {}
    for event in events:
        if event.type == "response.output_item.added":
            assert event.output_index not in items and event.item.status == "in_progress"
            items[event.output_index] = event.item.model_dump()
        elif event.type == "response.function_call_arguments.delta":
            item = items[event.output_index]
            assert item["id"] == event.item_id
            item["arguments"] += event.delta
        elif event.type == "response.function_call_arguments.done":
            assert items[event.output_index]["arguments"] == event.arguments
        elif event.type == "response.output_item.done":
            items[event.output_index]["status"] = event.item.status
            assert {**items[event.output_index]} == event.item.model_dump()
    return items


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "name": "get_weather"}])
def test_streamed_events_rebuild_the_output(client: openai.OpenAI, tool_choice: Any) -> None:
    body: dict[str, Any] = {
        "model": MODEL,
        "input": PROMPT,
        "tools": FLAT_TOOLS,
        "tool_choice": tool_choice,
        "max_output_tokens": 300,
        **GREEDY,
    }
    response = client.responses.create(**body)
    with client.responses.create(**body, stream=True) as stream:
        events = list(stream)
    assert [e.sequence_number for e in events] == list(range(len(events)))
    types = [e.type for e in events]
    assert types[:2] == ["response.created", "response.in_progress"]
    items = _reassembled(events)
    # Each call's events are together: added, argument deltas, done.
    body_types = [t for t in types[2:-1] if t != "response.function_call_arguments.delta"]
    assert body_types == [t for t in CALL_EVENTS if not t.endswith(".delta")] * len(items)
    final = events[-1].response
    # Greedy, the tiny model repeats calls while `required` lets it, until max_output_tokens cuts one.
    assert types[-1] == ("response.incomplete" if tool_choice == "required" else "response.completed")
    assert [i.model_dump() for i in final.output] == [items[k] for k in sorted(items)]
    # A second request names its calls otherwise (ids derive from the request); the calls are the same.
    assert [(i.name, i.arguments, i.status) for i in final.output] == [  # type: ignore[union-attr]
        (i.name, i.arguments, i.status)  # type: ignore[union-attr]
        for i in response.output
    ]
    assert client.responses.retrieve(final.id).model_dump() == final.model_dump()
    if final.status != "completed":
        return
    # The SDK's own stream helper builds the same output from the events (it needs response.completed).
    with client.responses.stream(**body) as helper:
        built = helper.get_final_response()
    assert [(i.name, i.arguments) for i in built.output] == [(i.name, i.arguments) for i in final.output]  # type: ignore[union-attr]


def _chat_answer(client: openai.OpenAI, call: Any, output: str, said: str | None = None) -> tuple[str, int]:
    """The chat endpoint's greedy answer after `call` (made after saying `said`) and its `output`,
    and the number of prompt tokens it took."""
    messages: Any = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": said,
            "tool_calls": [
                {
                    "id": call.call_id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call.call_id, "content": output},
    ]
    answer = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        tools=TOOLS,
        tool_choice="none",
        max_tokens=8,
        **LONG_GREEDY,  # type: ignore[arg-type]
    )
    assert answer.usage is not None
    return answer.choices[0].message.content or "", answer.usage.prompt_tokens


def _answer(response: Any) -> tuple[str, int]:
    return response.output_text, response.usage.input_tokens


def test_agent_loop(client: openai.OpenAI) -> None:
    """Call, tool result, final answer: through previous_response_id, and with the items sent back."""
    tools: Any = FLAT_TOOLS
    first = client.responses.create(
        model=MODEL,
        input="Weather in Paris?",
        tools=tools,
        tool_choice={"type": "function", "name": "get_weather"},
        max_output_tokens=100,
        **GREEDY,
    )
    [call] = _calls(first)
    output = json.dumps({"temp": 21})
    result: Any = {"type": "function_call_output", "call_id": call.call_id, "output": output}
    rest: dict[str, Any] = {"tools": tools, "tool_choice": "none", "max_output_tokens": 8, **LONG_GREEDY}
    expected = _chat_answer(client, call, output)
    assert expected[0]
    second = client.responses.create(model=MODEL, previous_response_id=first.id, input=[result], **rest)
    assert _answer(second) == expected and second.previous_response_id == first.id
    # The Agents SDK's way: the previous output items sent back as they came, then the result.
    items: Any = [
        {"role": "user", "content": "Weather in Paris?"},
        *(i.model_dump(exclude_unset=True) for i in first.output),
        result,
    ]
    assert _answer(client.responses.create(model=MODEL, input=items, **rest)) == expected
    # Or written by hand, the output as content parts.
    by_hand: Any = [
        {"role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]},
        {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
        {**result, "output": [{"type": "input_text", "text": output}]},
    ]
    assert _answer(client.responses.create(model=MODEL, input=by_hand, **rest)) == expected
    # An assistant message and the calls after it are one assistant turn.
    said: Any = [by_hand[0], {"role": "assistant", "content": "Let me check."}, *by_hand[1:]]
    answer = _answer(client.responses.create(model=MODEL, input=said, **rest))
    assert answer == _chat_answer(client, call, output, "Let me check.") != expected
    # The conversation goes on from the second response: its history keeps the call and its result.
    third = client.responses.create(model=MODEL, previous_response_id=second.id, input="Thanks.", **rest)
    assert third.status == "incomplete" and third.usage is not None and second.usage is not None
    assert third.usage.input_tokens > second.usage.input_tokens


def test_a_response_cut_inside_a_call_cannot_be_continued(client: openai.OpenAI) -> None:
    body: Any = {"model": MODEL, "input": PROMPT, "tools": FLAT_TOOLS, **GREEDY}
    body["tool_choice"] = {"type": "function", "name": "book_trip"}
    whole = client.responses.create(**body, max_output_tokens=200)
    assert whole.status == "completed" and whole.usage is not None
    # Greedy, the same call cut halfway: its arguments so far, not yet JSON.
    cut = client.responses.create(**body, max_output_tokens=whole.usage.output_tokens // 2)
    [call] = _calls(cut)
    assert cut.status == "incomplete" and call.status == "incomplete"
    result: Any = {"type": "function_call_output", "call_id": call.call_id, "output": "1"}
    with pytest.raises(openai.BadRequestError) as exc:
        client.responses.create(model=MODEL, previous_response_id=cut.id, input=[result])
    assert exc.value.param == "previous_response_id"  # type: ignore[attr-defined]
    # Its items sent back as they came (an agent's own history) are taken: the arguments as text.
    items: Any = [
        {"role": "user", "content": PROMPT},
        *(i.model_dump(exclude_unset=True) for i in cut.output),
    ]
    again = client.responses.create(
        model=MODEL, input=[*items, result], tools=FLAT_TOOLS, max_output_tokens=4
    )
    assert again.status == "incomplete"


def test_background_call_resumes_with_the_same_events(client: openai.OpenAI) -> None:
    body: dict[str, Any] = {
        "model": MODEL,
        "input": PROMPT,
        "tools": FLAT_TOOLS,
        "tool_choice": "required",
        "max_output_tokens": 300,
        **GREEDY,
    }
    seen, rest = leave_and_resume(client, body, "response.function_call_arguments.delta")
    response_id = seen[0].response.id
    with client.responses.retrieve(response_id, stream=True) as replayed:
        everything = list(replayed)
    events = seen + rest
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert [e.model_dump() for e in events[2:]] == [e.model_dump() for e in everything[2:]]
    final = client.responses.retrieve(response_id)
    assert final.status == "incomplete" and len(_calls(final)) > 1
    items = _reassembled(events)
    assert [i.model_dump() for i in final.output] == [items[k] for k in sorted(items)]


BAD_REQUESTS: list[tuple[dict[str, Any], str, str | None]] = [
    (
        {"tools": [{"type": "file_search", "vector_store_ids": ["vs_1"]}]},
        "tools[0].type",
        "unsupported_parameter",
    ),
    ({"tools": [{"type": "mcp", "server_label": "x"}]}, "tools[0].type", "unsupported_parameter"),
    (
        {"tools": [{"type": "function", "name": "f", "defer_loading": True}]},
        "tools[0].defer_loading",
        "unsupported_parameter",
    ),
    ({"tools": FLAT_TOOLS, "max_tool_calls": 2}, "max_tool_calls", "unsupported_parameter"),
    ({"tools": [{"type": "function", "name": "a b"}]}, "tools[0].name", None),
    ({"tools": [{"type": "function", "parameters": {}}]}, "tools[0].name", None),
    (
        {"tools": [{"type": "function", "name": "f", "parameters": {"type": "string"}}]},
        "tools[0].parameters",
        None,
    ),
    ({"tools": FLAT_TOOLS[:1] + FLAT_TOOLS[:1]}, "tools", None),
    (
        {"tools": [{"type": "function", "name": "f", "strict": True}], "tool_choice": "none"},
        "tools[0].strict",
        None,
    ),
    ({"tools": FLAT_TOOLS, "tool_choice": "sometimes"}, "tool_choice", None),
    (
        {"tools": FLAT_TOOLS, "tool_choice": {"type": "function", "name": "fly"}},
        "tool_choice.name",
        None,
    ),
    (
        {"tools": FLAT_TOOLS, "tool_choice": {"type": "function", "function": {"name": "now"}}},
        "tool_choice",
        None,
    ),
    (
        {"tools": FLAT_TOOLS, "tool_choice": {"type": "file_search"}},
        "tool_choice.type",
        "unsupported_parameter",
    ),
    ({"tool_choice": "required"}, "tool_choice", None),
    (
        {"tools": FLAT_TOOLS, "tool_choice": "required", "text": {"format": {"type": "json_object"}}},
        "tool_choice",
        None,
    ),
    (
        {"input": [{"type": "function_call_output", "call_id": "call_x", "output": "1"}]},
        "input[0].call_id",
        None,
    ),
    (
        {"input": [{"type": "function_call", "call_id": "c", "arguments": "{}"}]},
        "input[0].name",
        None,
    ),
    (
        {
            "input": [
                {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}", "role": "user"}
            ]
        },
        "input[0].role",
        "unsupported_parameter",
    ),
]


@pytest.mark.parametrize(("fields", "param", "code"), BAD_REQUESTS, ids=[p for _, p, _ in BAD_REQUESTS])
def test_bad_tools_are_a_400_naming_the_field(
    stack: Stack, fields: dict[str, Any], param: str, code: str
) -> None:
    body = {"model": MODEL, "input": PROMPT, "max_output_tokens": 4, **fields}
    answer = httpx.post(f"{stack.base_url}/v1/responses", json=body, timeout=30)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert (error["param"], error["code"]) == (param, code), error
