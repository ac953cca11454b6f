"""Output items of a response read from its text (openai_frontend/responses/items.py): the same items
however the text arrives, so a stream's events always rebuild the Response object's output; and
stored records written before function tools still read."""

from __future__ import annotations

import json
import random
from typing import Any

import msgspec
import pytest

from common.protocol import GenerateRequest, SamplingParams
from openai_frontend.generate.request import PreparedRequest
from openai_frontend.responses.items import CallItem, MessageItem, OutputItems, answer_turn, output_items
from openai_frontend.responses.objects import ResponseEvents, response_object
from openai_frontend.responses.schemas import ResponseStatus
from openai_frontend.responses.store import ResponseParams, ResponseResult, StoredCall, StoredResponse, Turn

CALL = '<tool_call>\n{"name": "%s", "arguments": %s}\n</tool_call>'
TEXTS = [
    "Sure.\n" + CALL % ("get_weather", '{"city": "Paris"}'),
    CALL % ("a", "{}") + "\nAnd then\n" + CALL % ("b", '{"x": [1, 2]}') + "\ntail",
    CALL % ("a", '{"q": 1'),  # cut by max_output_tokens: the arguments so far
    "<tool_call>not a call</tool_call> text < tool",
    "",
]


def _meta(tool_parser: str | None = "hermes", max_tool_calls: int | None = None) -> PreparedRequest:
    return PreparedRequest(
        message=GenerateRequest(
            req_id="req1", prompt_token_ids=[], sampling_params=SamplingParams(), arrival_time=0.0
        ),
        kind="chat",
        model="m",
        num_prompt_tokens=0,
        stop=[],
        stream=True,
        include_usage=False,
        return_token_ids=False,
        logprobs=False,
        tool_parser=tool_parser,
        max_tool_calls=max_tool_calls,
    )


@pytest.mark.parametrize("text", TEXTS)
def test_items_do_not_depend_on_how_the_text_is_cut(text: str) -> None:
    whole = output_items(_meta(), text)
    rng = random.Random(0)
    for _ in range(100):
        items = OutputItems(_meta())
        changes = items.opening()
        at = 0
        while at < len(text):
            cut = rng.randint(1, 8)
            changes += items.feed(text[at : at + cut])
            at += cut
        changes += items.finish() + items.close()
        assert items.items == whole
        # Each item is added, grows, and is done before the next is added.
        opened = [index for kind, index, _ in changes if kind == "added"]
        assert opened == list(range(len(whole)))
        assert [index for kind, index, _ in changes if kind == "done"] == opened


def test_items_in_the_order_written() -> None:
    items = output_items(_meta(), TEXTS[1])
    assert [type(i) for i in items] == [CallItem, MessageItem, CallItem, MessageItem]
    first, text, second, _ = items
    assert isinstance(first, CallItem) and isinstance(second, CallItem) and isinstance(text, MessageItem)
    assert (first.name, first.arguments, second.name, second.arguments) == ("a", "{}", "b", '{"x": [1, 2]}')
    assert text.text == "And then" and text.id == "msg_req1"
    assert first.call_id.startswith("call_") and first.id == "fc_" + first.call_id[len("call_") :]
    # The same request names its calls the same (a replay); another request otherwise.
    assert output_items(_meta(), TEXTS[1]) == items
    turn = answer_turn(items)
    assert turn.content == "And then\ntail" and [c.name for c in turn.tool_calls or []] == ["a", "b"]


def test_without_tools_the_text_is_one_message() -> None:
    call = CALL % ("a", "{}")
    assert output_items(_meta(None), call) == [MessageItem("msg_req1", call)]
    assert output_items(_meta(None), "") == [MessageItem("msg_req1", "")]
    assert output_items(_meta(), "") == []
    # parallel_tool_calls false: a second call is dropped, as on the chat endpoint.
    assert [i.name for i in output_items(_meta(max_tool_calls=1), call + "\n" + call)] == ["a"]  # type: ignore[union-attr]


# The fields (all defaulted) that a ResponseParams stored before function tools may lack.
ADDED_WITH_TOOLS = ("text_format", "tools", "tool_choice", "parallel_tool_calls")


def test_records_stored_before_tools_still_read() -> None:
    fields = msgspec.to_builtins(_params(_meta(None)))
    old = {name: value for name, value in fields.items() if name not in ADDED_WITH_TOOLS}
    old["conversation"] = [{"role": "user", "content": "hi"}]  # a Turn without tool_calls, tool_call_id
    params = msgspec.msgpack.decode(msgspec.msgpack.encode(old), type=ResponseParams)
    assert params.conversation == [Turn("user", "hi")]
    assert (params.tools, params.tool_choice, params.parallel_tool_calls) == (None, None, None)
    call = StoredCall("call_1", "f", "{}")
    again = msgspec.msgpack.decode(msgspec.msgpack.encode(Turn("assistant", "", [call])), type=Turn)
    assert again.tool_calls == [call] and again.tool_call_id is None


def _params(meta: PreparedRequest) -> ResponseParams:
    return ResponseParams(
        request=meta,
        background=False,
        instructions=None,
        previous_response_id=None,
        max_output_tokens=None,
        temperature=None,
        top_p=None,
        metadata={},
        user=None,
        conversation=[],
    )


@pytest.mark.parametrize("status", ["completed", "incomplete"])
def test_events_rebuild_the_response_output(status: ResponseStatus) -> None:
    """Text, a call, text again, a call: the events say each item in turn, and rebuild the output."""
    text, params = TEXTS[1], _params(_meta())
    events = ResponseEvents(StoredResponse(params, "in_progress", None))
    made = events.opening()
    for at in range(0, len(text), 3):
        made += events.delta(text[at : at + 3])
    ended = StoredResponse(params, status, ResponseResult(completed_at=1, text=text))
    made += events.finish() + events.closing(ended)
    data = [json.loads(event.data) for event in made]
    assert [d["sequence_number"] for d in data] == list(range(len(data)))
    call = [
        "response.output_item.added",
        "response.function_call_arguments.done",
        "response.output_item.done",
    ]
    message = [
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
    ]
    final = "response.incomplete" if status == "incomplete" else "response.completed"
    types = [event.type for event in made if not str(event.type).endswith(".delta")]
    assert types == ["response.created", "response.in_progress", *call, *message, *call, *message, final]
    items: dict[int, dict[str, Any]] = {}
    grown: dict[int, str] = {}  # each item's text or arguments, as the deltas build them
    for d in data:
        index = d.get("output_index")
        if d["type"] == "response.output_item.added":
            items[index], grown[index] = d["item"], ""
        elif d["type"].endswith(".delta"):
            assert d["item_id"] == items[index]["id"]
            grown[index] += d["delta"]
        elif d["type"] == "response.output_item.done":
            done = d["item"]
            assert done["id"] == items[index]["id"] and done["type"] == items[index]["type"]
            assert grown[index] == (
                done["arguments"] if done["type"] == "function_call" else done["content"][0]["text"]
            )
            items[index] = done
    output = response_object(ended).output
    assert (
        [items[k] for k in sorted(items)]
        == [i.model_dump() for i in output]
        == data[-1]["response"]["output"]
    )
    assert [i.status for i in output] == ["completed"] * 3 + [
        "incomplete" if status == "incomplete" else "completed"
    ]
