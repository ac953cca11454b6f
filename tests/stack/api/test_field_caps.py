"""The length caps on client strings, over HTTP on every API: one character past a cap is a 400 naming
the field, and a request holding every capped field at its cap is served.

The served model's name is itself as long as a request's `model` may be, so that a client can send
back the name the server gave. tests/unit/openai_frontend/test_field_caps.py checks each schema field;
this checks that the caps hold on the paths clients use and that nothing else refuses what they allow.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from harness.gateway.gateway_server import RunningGateway
from harness.gateway.responder import responding
from openai_frontend.protocol.strings import (
    MAX_DESCRIPTION_CHARS,
    MAX_FILENAME_CHARS,
    MAX_ID_CHARS,
    MAX_NAME_CHARS,
    MAX_WORD_CHARS,
)

MODEL = "m" * MAX_ID_CHARS
USER = [{"role": "user", "content": "hi"}]
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}}
CHAT, COMPLETIONS, RESPONSES, MESSAGES = (
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/responses",
    "/v1/messages",
)


def _call(call_id: str, name: str = "get_weather") -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": '{"city": "Paris"}'}}


def _tool_turns(call_id: str, answer_id: str | None = None) -> list[dict[str, Any]]:
    """A call and its answer, sent back in the next turn."""
    return [
        *USER,
        {"role": "assistant", "content": None, "tool_calls": [_call(call_id)]},
        {"role": "tool", "content": "sunny", "tool_call_id": answer_id or call_id},
    ]


def _function(description: str = "the weather", name: str = "get_weather") -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": SCHEMA}}


def _named(name: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name}}


def _over(cap: int) -> str:
    return "x" * (cap + 1)


# (path, body, the param the 400 names, the cap it states)
REFUSED: list[tuple[str, dict[str, Any], str, int]] = [
    (CHAT, {"messages": [{**USER[0], "name": _over(MAX_NAME_CHARS)}]}, "messages[0].name", MAX_NAME_CHARS),
    (CHAT, {"messages": _tool_turns("c", _over(MAX_ID_CHARS))}, "messages[2].tool_call_id", MAX_ID_CHARS),
    (CHAT, {"messages": _tool_turns(_over(MAX_ID_CHARS), "c")}, "messages[1].tool_calls[0].id", MAX_ID_CHARS),
    (
        CHAT,
        {"messages": USER, "tools": [_function(_over(MAX_DESCRIPTION_CHARS))]},
        "tools[0].function.description",
        MAX_DESCRIPTION_CHARS,
    ),
    (
        CHAT,
        {"messages": USER, "tools": [_function()], "tool_choice": _named(_over(MAX_NAME_CHARS))},
        "tool_choice.function.name",
        MAX_NAME_CHARS,
    ),
    (CHAT, {"messages": USER, "tool_choice": _over(MAX_WORD_CHARS)}, "tool_choice", MAX_WORD_CHARS),
    (CHAT, {"messages": USER, "model": _over(MAX_ID_CHARS)}, "model", MAX_ID_CHARS),
    (CHAT, {"messages": USER, "logit_bias": {_over(MAX_WORD_CHARS): 1}}, "logit_bias", MAX_WORD_CHARS),
    (
        CHAT,
        {
            "messages": USER,
            "response_format": {"type": "json_schema", "json_schema": {"name": _over(MAX_NAME_CHARS)}},
        },
        "response_format.json_schema.name",
        MAX_NAME_CHARS,
    ),
    (
        COMPLETIONS,
        {"prompt": "hi", "prompt_cache_key": _over(MAX_ID_CHARS)},
        "prompt_cache_key",
        MAX_ID_CHARS,
    ),
    (COMPLETIONS, {"prompt": "hi", "model": _over(MAX_ID_CHARS)}, "model", MAX_ID_CHARS),
    (
        RESPONSES,
        {"input": "hi", "previous_response_id": _over(MAX_ID_CHARS)},
        "previous_response_id",
        MAX_ID_CHARS,
    ),
    (
        RESPONSES,
        {
            "input": "hi",
            "text": {"format": {"type": "json_schema", "name": _over(MAX_NAME_CHARS), "schema": SCHEMA}},
        },
        "text.format.name",
        MAX_NAME_CHARS,
    ),
    (
        RESPONSES,
        {
            "input": "hi",
            "tools": [{"type": "function", "name": "f", "description": _over(MAX_DESCRIPTION_CHARS)}],
        },
        "tools[0].description",
        MAX_DESCRIPTION_CHARS,
    ),
    (
        "/v1/batches",
        {"input_file_id": _over(MAX_ID_CHARS), "endpoint": "/v1/completions", "completion_window": "24h"},
        "input_file_id",
        MAX_ID_CHARS,
    ),
    (
        "/v1/batches",
        {"input_file_id": "file-1", "endpoint": _over(MAX_WORD_CHARS), "completion_window": "24h"},
        "endpoint",
        MAX_WORD_CHARS,
    ),
]


# Caps checked where the field is used, in words of their own: (path, body, param, the cap stated).
CHECKED_IN_USE: list[tuple[str, dict[str, Any], str, int]] = [
    (COMPLETIONS, {"prompt": "hi", "user": _over(256)}, "user", 256),
    (COMPLETIONS, {"prompt": "hi", "safety_identifier": _over(256)}, "safety_identifier", 256),
    (COMPLETIONS, {"prompt": "hi", "stop": [_over(256)]}, "stop", 256),
    (CHAT, {"messages": USER, "metadata": {_over(64): "v"}}, "metadata", 64),
    (CHAT, {"messages": USER, "metadata": {"k": _over(512)}}, "metadata", 512),
    (RESPONSES, {"input": "hi", "metadata": {"k": _over(512)}}, "metadata.k", 512),
]


@pytest.fixture()
def served(make_gateway: Callable[..., RunningGateway], redis_url: str) -> Iterator[RunningGateway]:
    """A gateway whose model's name is as long as a `model` may be, with a stand-in worker."""
    with responding(redis_url):
        yield make_gateway(served_model_name=MODEL)


def _assert_too_long(response: httpx.Response, param: str, cap: int) -> None:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["param"], error["code"]) == (param, "string_above_max_length"), error
    assert f"'{param}'" in error["message"] and f"maximum length {cap}," in error["message"], error


def test_one_past_a_cap_is_refused_naming_the_field(served: RunningGateway) -> None:
    gateway = served
    for path, body, param, cap in REFUSED:
        _assert_too_long(gateway.client.post(path, json=body), param, cap)
    for path, body, param, cap in CHECKED_IN_USE:
        response = gateway.client.post(path, json=body)
        assert response.status_code == 400 and response.json()["error"]["param"] == param, response.text
        assert str(cap) in response.json()["error"]["message"], response.text
    # The Messages API answers in Anthropic's shape, which names the field in the message.
    body = {"model": _over(MAX_ID_CHARS), "max_tokens": 4, "messages": USER}
    response = gateway.client.post(MESSAGES, json=body)
    assert response.status_code == 400 and response.json()["type"] == "error", response.text
    assert "'model'" in response.json()["error"]["message"] and f"{MAX_ID_CHARS}," in response.text
    # Files: the form's purpose, and the name the file is stored and listed under.
    files = {"file": ("a.jsonl", b"{}\n")}
    response = gateway.client.post("/v1/files", files=files, data={"purpose": _over(MAX_WORD_CHARS)})
    _assert_too_long(response, "purpose", MAX_WORD_CHARS)
    files = {"file": (_over(MAX_FILENAME_CHARS), b"{}\n")}
    _assert_too_long(
        gateway.client.post("/v1/files", files=files, data={"purpose": "batch"}), "file", MAX_FILENAME_CHARS
    )
    assert gateway.harness.num_requests() == 0


def test_every_capped_field_at_its_cap_is_served(served: RunningGateway) -> None:
    gateway = served
    call_id, name = "c" * MAX_ID_CHARS, "n" * MAX_NAME_CHARS
    chat = {
        "model": MODEL,
        "messages": [{**USER[0], "name": name}, *_tool_turns(call_id)[1:], {**USER[0], "name": name}],
        "tools": [_function()],
        "tool_choice": _named("get_weather"),
        "logit_bias": {"0" * (MAX_WORD_CHARS - 1) + "5": 1.0},  # token 5, spelled with leading zeros
        "prompt_cache_key": "k" * MAX_ID_CHARS,
        "max_tokens": 2,
    }
    for path, body in [
        (CHAT, chat),
        (
            COMPLETIONS,
            {"model": MODEL, "prompt": "hi", "prompt_cache_key": "k" * MAX_ID_CHARS, "max_tokens": 2},
        ),
        (
            RESPONSES,
            {
                "model": MODEL,
                "input": "hi",
                "max_output_tokens": 2,
                "text": {"format": {"type": "json_schema", "name": name, "schema": SCHEMA}},
            },
        ),
        (
            MESSAGES,
            {
                "model": MODEL,
                "max_tokens": 2,
                "messages": [
                    *USER,
                    {
                        "role": "assistant",
                        "content": [{"type": "tool_use", "id": call_id, "name": name, "input": {}}],
                    },
                    {
                        "role": "user",
                        "content": [{"type": "tool_result", "tool_use_id": call_id, "content": "4"}],
                    },
                ],
            },
        ),
    ]:
        response = gateway.client.post(path, json=body)
        assert response.status_code == 200, (path, response.text)
    # The longest file name is stored and given back; the longest file id reaches the lookup.
    filename = "f" * MAX_FILENAME_CHARS
    response = gateway.client.post(
        "/v1/files", files={"file": (filename, b"{}\n")}, data={"purpose": "batch"}
    )
    assert response.status_code == 200 and response.json()["filename"] == filename, response.text
    batch = {"input_file_id": "f" * MAX_ID_CHARS, "endpoint": "/v1/completions", "completion_window": "24h"}
    response = gateway.client.post("/v1/batches", json=batch)
    assert response.status_code == 404 and response.json()["error"]["code"] == "file_not_found", response.text
