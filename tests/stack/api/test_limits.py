"""Operator limits: body size (413 before parsing), prompt tokens, max_tokens cap, list sizes.
Every refusal is an OpenAI error object and queues nothing."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from harness.gateway.gateway_server import RunningGateway
from harness.gateway.responder import responding
from openai_frontend.generate.validation import (
    MAX_LOGIT_BIAS_ENTRIES,
    MAX_STOP_STRING_CHARS,
    MAX_STOP_STRINGS,
    MAX_STOP_TOKEN_IDS,
    MAX_USER_CHARS,
)

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
MAX_BODY = 2048


@pytest.fixture()
def limited(make_gateway: Callable[..., RunningGateway]) -> RunningGateway:
    return make_gateway(max_body_bytes=MAX_BODY, max_prompt_tokens=32, max_tokens=5)


def _error(response: Any, status: int, param: str | None, code: str | None) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["param"], error["code"]) == (param, code)
    return dict(error)


def test_declared_body_over_the_limit_is_413(limited: RunningGateway) -> None:
    body = json.dumps({"prompt": "x" * MAX_BODY}).encode()
    response = limited.client.post(COMPLETIONS, content=body, headers={"content-type": "application/json"})
    _error(response, 413, None, "body_too_large")
    # Not even valid JSON is looked at: the size decides first.
    garbage = limited.client.post(COMPLETIONS, content=b"{" * (MAX_BODY + 1))
    _error(garbage, 413, None, "body_too_large")
    assert limited.harness.redis.dbsize() == 0


def test_chunked_body_over_the_limit_is_413(limited: RunningGateway) -> None:
    def chunks() -> Iterator[bytes]:  # no Content-Length: the gateway must count
        yield b'{"prompt": "'
        for _ in range(10):
            yield b"x" * 512
        yield b'"}'

    response = limited.client.post(
        COMPLETIONS, content=chunks(), headers={"content-type": "application/json"}
    )
    _error(response, 413, None, "body_too_large")
    assert limited.harness.redis.dbsize() == 0


def test_bodies_under_the_limit_pass(limited: RunningGateway, redis_url: str) -> None:
    def chunks() -> Iterator[bytes]:
        yield b'{"prompt": "hi",'
        yield b' "max_tokens": 2}'

    with responding(redis_url):
        response = limited.client.post(
            COMPLETIONS, content=chunks(), headers={"content-type": "application/json"}
        )
    assert response.status_code == 200, response.text


@pytest.mark.parametrize(
    ("path", "body", "param", "code"),
    [
        (COMPLETIONS, {"prompt": "hi " * 60}, "prompt", "prompt_too_long"),
        (COMPLETIONS, {"prompt": list(range(1, 34))}, "prompt", "prompt_too_long"),
        (CHAT, {"messages": [{"role": "user", "content": "hi " * 60}]}, "messages", "prompt_too_long"),
        (COMPLETIONS, {"prompt": "hi", "max_tokens": 6}, "max_tokens", None),
        (
            CHAT,
            {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 6},
            "max_completion_tokens",
            None,
        ),
    ],
)
def test_operator_caps(
    limited: RunningGateway, path: str, body: dict[str, Any], param: str, code: str | None
) -> None:
    _error(limited.client.post(path, json=body), 400, param, code)
    assert limited.harness.num_requests() == 0


def test_max_tokens_cap_is_the_default(limited: RunningGateway, redis_url: str) -> None:
    with responding(redis_url) as responder:
        assert limited.client.post(COMPLETIONS, json={"prompt": "hi"}).status_code == 200
        assert limited.client.post(COMPLETIONS, json={"prompt": "hi", "max_tokens": 5}).status_code == 200
    assert [r.sampling_params.max_tokens for r in responder.requests] == [5, 5]


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"stop": [f"s{i}" for i in range(MAX_STOP_STRINGS + 1)]}, "stop"),
        ({"stop": "x" * (MAX_STOP_STRING_CHARS + 1)}, "stop"),
        ({"stop_token_ids": [1] * (MAX_STOP_TOKEN_IDS + 1)}, "stop_token_ids"),
        ({"logit_bias": {str(i): 1 for i in range(MAX_LOGIT_BIAS_ENTRIES + 1)}}, "logit_bias"),
        ({"user": "u" * (MAX_USER_CHARS + 1)}, "user"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_p": float("inf")}, "top_p"),
        ({"logit_bias": {"5": float("nan")}}, "logit_bias"),
        ({"repetition_penalty": float("inf")}, "repetition_penalty"),
        ({"min_p": float("nan")}, "min_p"),
    ],
)
def test_list_sizes_and_non_finite_values(gateway: RunningGateway, extra: dict[str, Any], param: str) -> None:
    body = json.dumps({"prompt": "hi", **extra}).encode()  # json.dumps writes NaN / Infinity
    response = gateway.client.post(COMPLETIONS, content=body, headers={"content-type": "application/json"})
    _error(response, 400, param, None)
    assert gateway.harness.num_requests() == 0


def test_limits_at_their_bounds_pass(gateway: RunningGateway, redis_url: str) -> None:
    body = {
        "prompt": "hi",
        "max_tokens": 2,
        "stop": ["x" * MAX_STOP_STRING_CHARS] + [f"s{i}" for i in range(MAX_STOP_STRINGS - 1)],
        "stop_token_ids": [1] * MAX_STOP_TOKEN_IDS,
        "user": "u" * MAX_USER_CHARS,
    }
    with responding(redis_url):
        response = gateway.client.post(COMPLETIONS, json=body)
    assert response.status_code == 200, response.text
