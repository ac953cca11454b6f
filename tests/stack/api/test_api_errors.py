"""Every refused request gets an OpenAI error object with the right status, and nothing is queued."""

from __future__ import annotations

import json
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from harness.gateway.gateway_server import RunningGateway

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
USER = [{"role": "user", "content": "hi"}]

# (path, body, status, param, code)
CASES: list[tuple[str, Any, int, str | None, str | None]] = [
    (COMPLETIONS, {"prompt": "hi", "temperature": -0.1}, 400, "temperature", None),
    (COMPLETIONS, {"prompt": "hi", "temperature": 2.5}, 400, "temperature", None),
    (COMPLETIONS, {"prompt": "hi", "top_p": 0}, 400, "top_p", None),
    (COMPLETIONS, {"prompt": "hi", "top_p": 1.5}, 400, "top_p", None),
    (COMPLETIONS, {"prompt": "hi", "top_k": -2}, 400, "top_k", None),
    (COMPLETIONS, {"prompt": "hi", "max_tokens": -1}, 400, "max_tokens", None),
    (CHAT, {"messages": USER, "max_tokens": 0}, 400, "max_tokens", None),
    (COMPLETIONS, {"prompt": "hi", "max_tokens": 10_000}, 400, "max_tokens", "context_length_exceeded"),
    (COMPLETIONS, {"prompt": "hi " * 600}, 400, "prompt", "context_length_exceeded"),
    (COMPLETIONS, {"prompt": ""}, 400, "prompt", None),
    (COMPLETIONS, {"prompt": []}, 400, "prompt", None),
    (COMPLETIONS, {"prompt": [1, 99_999]}, 400, "prompt", None),
    (COMPLETIONS, {"prompt": [-1]}, 400, "prompt", None),
    (COMPLETIONS, {"prompt": ["a", ""]}, 400, "prompt", None),
    (COMPLETIONS, {"prompt": ["a"] * 257}, 400, "prompt", None),
    (COMPLETIONS, {"prompt": ["a"] * 20, "n": 16}, 400, "prompt", None),
    (COMPLETIONS, {"prompt": "hi", "n": 0}, 400, "n", None),
    (COMPLETIONS, {"prompt": "hi", "n": 17}, 400, "n", None),
    (COMPLETIONS, {"prompt": "hi", "n": 2, "best_of": 3}, 400, "best_of", None),
    (COMPLETIONS, {"prompt": "hi", "stop": ""}, 400, "stop", None),
    (COMPLETIONS, {"prompt": "hi", "stop_token_ids": [100_000]}, 400, "stop_token_ids", None),
    (COMPLETIONS, {"prompt": "hi", "seed": 2**70}, 400, "seed", None),
    (COMPLETIONS, {"prompt": "hi", "seed": 2**63 - 1, "n": 2}, 400, "seed", None),
    (COMPLETIONS, {"prompt": "hi", "logprobs": -1}, 400, "logprobs", None),
    (COMPLETIONS, {"prompt": "hi", "logprobs": 21}, 400, "logprobs", None),
    (COMPLETIONS, {"prompt": "hi", "min_p": -0.1}, 400, "min_p", None),
    (COMPLETIONS, {"prompt": "hi", "min_p": 1.5}, 400, "min_p", None),
    (COMPLETIONS, {"prompt": "hi", "presence_penalty": 2.5}, 400, "presence_penalty", None),
    (COMPLETIONS, {"prompt": "hi", "presence_penalty": -2.5}, 400, "presence_penalty", None),
    (COMPLETIONS, {"prompt": "hi", "frequency_penalty": 3}, 400, "frequency_penalty", None),
    (COMPLETIONS, {"prompt": "hi", "frequency_penalty": -3}, 400, "frequency_penalty", None),
    (COMPLETIONS, {"prompt": "hi", "repetition_penalty": 0}, 400, "repetition_penalty", None),
    (COMPLETIONS, {"prompt": "hi", "repetition_penalty": -1}, 400, "repetition_penalty", None),
    (COMPLETIONS, {"prompt": "hi", "logit_bias": {"5": 101}}, 400, "logit_bias", None),
    (COMPLETIONS, {"prompt": "hi", "logit_bias": {"5": -100.5}}, 400, "logit_bias", None),
    (COMPLETIONS, {"prompt": "hi", "logit_bias": {"cat": 1}}, 400, "logit_bias", None),
    (COMPLETIONS, {"prompt": "hi", "logit_bias": {"99999": 1}}, 400, "logit_bias", None),
    (COMPLETIONS, {"prompt": "hi", "min_tokens": -1}, 400, "min_tokens", None),
    (COMPLETIONS, {"prompt": "hi", "max_tokens": 4, "min_tokens": 5}, 400, "min_tokens", None),
    (COMPLETIONS, {"prompt": "hi", "model": "gpt-4"}, 404, "model", "model_not_found"),
    (CHAT, {"messages": USER, "n": 0}, 400, "n", None),
    (CHAT, {"messages": USER, "top_logprobs": 2}, 400, "top_logprobs", None),
    (CHAT, {"messages": USER, "logprobs": True, "top_logprobs": 21}, 400, "top_logprobs", None),
    (CHAT, {"messages": USER, "logprobs": True, "top_logprobs": -1}, 400, "top_logprobs", None),
    (CHAT, {"messages": USER, "max_tokens": 3, "min_tokens": 4}, 400, "min_tokens", None),
    (CHAT, {"messages": USER, "logit_bias": {"1": 200}}, 400, "logit_bias", None),
    (CHAT, {"messages": USER, "presence_penalty": 9}, 400, "presence_penalty", None),
    (CHAT, {"messages": USER, "max_completion_tokens": 0}, 400, "max_completion_tokens", None),
    (CHAT, {"messages": USER, "max_tokens": 600}, 400, "max_tokens", "context_length_exceeded"),
    (CHAT, {"messages": []}, 400, "messages", None),
    (CHAT, {"messages": [{"role": "function", "content": "x"}]}, 400, "messages[0].role", None),
    (CHAT, {"messages": [{"role": "tool", "content": "x"}]}, 400, "messages[0].tool_call_id", None),
    (CHAT, {"messages": [{"role": "user"}]}, 400, "messages[0].content", None),
    (
        CHAT,
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
        400,
        "messages[0].content[0]",
        "image_input_not_supported",
    ),
    (CHAT, {"messages": USER, "model": "nope"}, 404, "model", "model_not_found"),
    # Malformed bodies: wrong types (never coerced) or missing fields, 400 as OpenAI answers.
    (COMPLETIONS, {"prompt": "hi", "max_tokens": "many"}, 400, "max_tokens", None),
    (COMPLETIONS, {"prompt": "hi", "max_tokens": "10"}, 400, "max_tokens", None),
    (COMPLETIONS, {"prompt": "hi", "max_tokens": 10.0}, 400, "max_tokens", None),
    (COMPLETIONS, {"prompt": "hi", "temperature": "0.5"}, 400, "temperature", None),
    (COMPLETIONS, {"prompt": "hi", "echo": 1}, 400, "echo", None),
    (COMPLETIONS, {"prompt": 5}, 400, "prompt", None),
    (COMPLETIONS, {"max_tokens": 5}, 400, "prompt", None),
    (COMPLETIONS, [1, 2], 400, None, None),
    (COMPLETIONS, {"prompt": "hi", "stream": "maybe"}, 400, "stream", None),
    (COMPLETIONS, {"prompt": "hi", "stream": "true"}, 400, "stream", None),
    (COMPLETIONS, {"prompt": "hi", "logit_bias": {"5": "big"}}, 400, "logit_bias.5", None),
    (
        COMPLETIONS,
        {"prompt": "hi", "stream": True, "stream_options": {"include_usage": "yes"}},
        400,
        "stream_options.include_usage",
        None,
    ),
    (CHAT, {"messages": "hi"}, 400, "messages", None),
    (CHAT, {"messages": [{"content": "no role"}]}, 400, "messages[0].role", None),
    # Unknown fields, anywhere in the body.
    (COMPLETIONS, {"prompt": "hi", "max_token": 5}, 400, "max_token", None),
    (CHAT, {"messages": USER, "temprature": 0.5}, 400, "temprature", None),
    (CHAT, {"messages": [{"role": "user", "content": "hi", "mood": "x"}]}, 400, "messages[0].mood", None),
    (CHAT, {"messages": USER, "stream": True, "stream_options": {"x": 1}}, 400, "stream_options.x", None),
    # Fields OpenAI defines that this server does not implement: refused by name, never ignored.
    (CHAT, {"messages": USER, "functions": [{"name": "f"}]}, 400, "functions", "unsupported_parameter"),
    (CHAT, {"messages": USER, "tools": [{"type": "file_search"}]}, 400, "tools[0].type", None),
    (CHAT, {"messages": USER, "tool_choice": "auto"}, 400, "tool_choice", None),
    (
        CHAT,
        {"messages": USER, "structured_outputs": {"regex": "a+", "structural_tag": "{}"}},
        400,
        "structured_outputs.structural_tag",
        "unsupported_parameter",
    ),
    (
        CHAT,
        {"messages": [{"role": "user", "content": "hi", "tool_calls": []}]},
        400,
        "messages[0].tool_calls",
        None,
    ),
    (
        CHAT,
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "a", "image_url": {}}]}]},
        400,
        "messages[0].content[0].image_url",
        None,
    ),
    (COMPLETIONS, {"prompt": "hi", "suffix": "end"}, 400, "suffix", "unsupported_parameter"),
    (COMPLETIONS, {"prompt": "hi", "store": True}, 400, "store", "unsupported_parameter"),
    # Strings that are not valid Unicode (lone UTF-16 surrogates): a 400, never a 500.
    (COMPLETIONS, {"prompt": "\ud83d"}, 400, "prompt", None),
    (COMPLETIONS, {"prompt": ["a\udc00"]}, 400, "prompt", None),
    (COMPLETIONS, {"prompt": "hi", "stop": "\ud83d"}, 400, "stop", None),
    (COMPLETIONS, {"prompt": "hi", "stop": ["ok", "\ud83d"]}, 400, "stop", None),
    (COMPLETIONS, {"prompt": "hi", "user": "\ud83d"}, 400, "user", None),
    (COMPLETIONS, {"prompt": "hi", "model": "\ud83d"}, 400, "model", None),
    (COMPLETIONS, {"prompt": "hi", "logit_bias": {"\ud83d": 1}}, 400, "logit_bias", None),
    # A field name that is not valid Unicode cannot be named back; the message says what is wrong.
    (COMPLETIONS, {"prompt": "hi", "\ud83d": 1}, 400, None, None),
    (CHAT, {"messages": [{"role": "user", "content": "\ud83d"}]}, 400, "messages[0].content", None),
    (
        CHAT,
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "\udfff"}]}]},
        400,
        "messages[0].content",
        None,
    ),
    (
        CHAT,
        {"messages": [{"role": "user", "content": "hi", "name": "\ud83d"}]},
        400,
        "messages[0].name",
        None,
    ),
    (CHAT, {"messages": [{"role": "\ud83d", "content": "hi"}]}, 400, "messages[0].role", None),
]


def _post(client: httpx.Client, path: str, body: Any) -> httpx.Response:
    # json.dumps escapes lone surrogates as \\ud83d, as a client's JSON encoder would send them.
    return client.post(path, content=json.dumps(body), headers={"content-type": "application/json"})


def _assert_error(response: Any, status: int, param: str | None, code: str | None) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert error["code"] == code
    return dict(error)


@pytest.mark.parametrize(("path", "body", "status", "param", "code"), CASES)
def test_refused(
    gateway: RunningGateway, path: str, body: Any, status: int, param: str | None, code: str | None
) -> None:
    _assert_error(_post(gateway.client, path, body), status, param, code)
    assert gateway.harness.num_requests() == 0


def test_context_length_message_names_the_lengths(gateway: RunningGateway) -> None:
    response = gateway.client.post(COMPLETIONS, json={"prompt": "hi", "max_tokens": 10_000})
    message = _assert_error(response, 400, "max_tokens", "context_length_exceeded")["message"]
    assert "512" in message and "10000" in message


def test_invalid_json_is_400(gateway: RunningGateway) -> None:
    response = gateway.client.post(
        COMPLETIONS, content=b'{"prompt": "hi",', headers={"content-type": "application/json"}
    )
    assert "JSON" in _assert_error(response, 400, None, None)["message"]


def test_unknown_route_is_an_openai_error(gateway: RunningGateway) -> None:
    response = gateway.client.get("/v1/engines")
    assert response.status_code == 404
    assert set(response.json()["error"]) == {"message", "type", "param", "code"}


def test_still_serving_after_errors(gateway: RunningGateway) -> None:
    for path, body, status, param, code in CASES:
        _assert_error(_post(gateway.client, path, body), status, param, code)
    with ThreadPoolExecutor(max_workers=1) as pool:
        future = pool.submit(gateway.client.post, COMPLETIONS, json={"prompt": "hi", "max_tokens": 2})
        request = gateway.harness.next_request()
        gateway.harness.emit_tokens(request.req_id, [300, 301], finish_reason="length")
        response = future.result(timeout=30)
    assert response.status_code == 200
    assert response.json()["usage"]["completion_tokens"] == 2


def test_every_refusal_is_logged_with_its_rule(
    gateway: RunningGateway, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="gateway.errors"):
        _post(gateway.client, CHAT, {"messages": USER, "functions": [{"name": "f"}]})
        _post(gateway.client, COMPLETIONS, {"prompt": "hi", "max_tokens": "10"})
        gateway.client.get("/v1/engines")
    refusals = [r.getMessage() for r in caplog.records if r.getMessage().startswith("refused:")]
    assert any(
        "status=400" in m and "param=functions" in m and "unsupported_parameter" in m for m in refusals
    )
    assert any("status=400" in m and "param=max_tokens" in m and "valid integer" in m for m in refusals)
    assert any("status=404" in m for m in refusals)
