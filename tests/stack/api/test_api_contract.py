"""Every field OpenAI documents for /v1/chat/completions and /v1/completions, sent one at a time: each
is either honoured (200, and the request or the answer differs from the same request without it) or
refused by name (400 naming it). None is accepted and ignored.

The field lists follow the OpenAI API reference; the vLLM extensions we implement are listed too, and
together they must be exactly the fields the request schemas declare, so a field added to a schema
without a row here fails the test.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

import msgspec
import pytest

from harness.gateway.gateway_server import RunningGateway
from harness.gateway.responder import Responder, responding
from openai_frontend.protocol.openai_schemas import ChatCompletionRequest, CompletionRequest

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
BASE: dict[str, dict[str, Any]] = {
    CHAT: {"messages": [{"role": "user", "content": "hi"}]},
    COMPLETIONS: {"prompt": "hi"},
}
HONOURED, REFUSED = "honoured", "refused"
STOP_AT_THE_ANSWER = object()  # replaced by the text of the responder's token, so the stop string hits
FUNCTION = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}

# field -> (value, outcome, fields the baseline needs for the field to make sense)
Row = tuple[Any, str, dict[str, Any]]
SAMPLING: dict[str, Row] = {
    "frequency_penalty": (0.5, HONOURED, {}),
    "presence_penalty": (0.5, HONOURED, {}),
    "logit_bias": ({"5": 1.0}, HONOURED, {}),
    "max_tokens": (3, HONOURED, {}),
    "n": (2, HONOURED, {}),
    "seed": (7, HONOURED, {}),
    "stop": (STOP_AT_THE_ANSWER, HONOURED, {}),
    "stream": (True, HONOURED, {}),
    "stream_options": ({"include_usage": True}, HONOURED, {"stream": True}),
    "temperature": (0.5, HONOURED, {}),
    "top_p": (0.5, HONOURED, {}),
    "user": ("user-1", HONOURED, {}),
    "service_tier": ("flex", REFUSED, {}),
    "safety_identifier": ("s-1", HONOURED, {}),  # the request's end user
    # vLLM's extensions
    "top_k": (5, HONOURED, {}),
    "min_p": (0.1, HONOURED, {}),
    "repetition_penalty": (1.1, HONOURED, {}),
    "min_tokens": (1, HONOURED, {}),
    "stop_token_ids": ([5], HONOURED, {}),
    "ignore_eos": (True, HONOURED, {}),
    "structured_outputs": ({"choice": ["yes", "no"]}, HONOURED, {}),
    "return_token_ids": (True, HONOURED, {}),
    "prompt_logprobs": (1, HONOURED, {}),
    "priority": (1, HONOURED, {}),
}
FIELDS: dict[str, dict[str, Row]] = {
    CHAT: {
        **SAMPLING,
        "logprobs": (True, HONOURED, {}),
        "top_logprobs": (2, HONOURED, {"logprobs": True}),
        "max_completion_tokens": (3, HONOURED, {}),
        "audio": ({"voice": "alloy", "format": "wav"}, REFUSED, {}),
        "function_call": ("auto", REFUSED, {}),
        "functions": ([FUNCTION["function"]], REFUSED, {}),
        "modalities": (["text", "audio"], REFUSED, {}),
        # One call or one or more: a different grammar for forced calls.
        "parallel_tool_calls": (False, HONOURED, {"tools": [FUNCTION], "tool_choice": "required"}),
        "prediction": ({"type": "content", "content": "x"}, REFUSED, {}),
        "add_generation_prompt": (False, HONOURED, {}),
        "truncate_prompt_tokens": (1, HONOURED, {}),
        "continue_final_message": (
            True,
            HONOURED,
            {
                "add_generation_prompt": False,
                "messages": [*BASE[CHAT]["messages"], {"role": "assistant", "content": "The"}],
            },
        ),
        "reasoning_effort": ("low", REFUSED, {}),
        "response_format": ({"type": "json_object"}, HONOURED, {}),
        "tool_choice": ("required", HONOURED, {"tools": [FUNCTION]}),  # a grammar forces a call
        "tools": ([FUNCTION], HONOURED, {}),  # the template lists them in the prompt
        "verbosity": ("low", REFUSED, {}),
        "web_search_options": ({}, REFUSED, {}),
    },
    COMPLETIONS: {
        **SAMPLING,
        "logprobs": (2, HONOURED, {}),
        "echo": (True, HONOURED, {}),
        "truncate_prompt_tokens": (1, HONOURED, {"prompt": "Return the value"}),  # "hi" is one token
        "best_of": (2, REFUSED, {}),  # best_of == n is the same request; more candidates are not ranked
        "suffix": ("end", REFUSED, {}),
        "store": (True, REFUSED, {}),  # OpenAI stores chat completions only
    },
}
# Honoured without a difference this test can see from one request: `model` must name the served
# model; `resumable` changes what happens after a disconnect (tests/stack/streams/test_resume_api.py);
# `metadata` and `prompt_cache_key` are kept and logged, and place the request; the detokenizer and
# stop options change the text only when special tokens or stop strings are in it, and the tiny
# tokenizer adds no special tokens (each of those: tests/stack/api/test_vllm_options.py).
NO_VISIBLE_EFFECT: dict[str, Any] = {
    "model": None,
    "resumable": True,
    "metadata": {"k": "v"},
    "prompt_cache_key": "p-1",
    "skip_special_tokens": False,
    "spaces_between_special_tokens": False,
    "include_stop_str_in_output": True,
    "add_special_tokens": True,
}
# Chat's own: the ChatML template reads no extra variable (one that does: test_vllm_options.py), and
# a stored completion answers as any other.
NO_VISIBLE_EFFECT_BY_PATH: dict[str, dict[str, Any]] = {
    CHAT: {
        **NO_VISIBLE_EFFECT,
        "chat_template_kwargs": {"enable_thinking": True},
        "store": True,  # kept for GET /v1/chat/completions/{id} (test_stored_chat.py)
    },
    COMPLETIONS: NO_VISIBLE_EFFECT,
}
REQUIRED = {CHAT: {"messages"}, COMPLETIONS: {"prompt"}}
SCHEMAS = {CHAT: ChatCompletionRequest, COMPLETIONS: CompletionRequest}

CASES = [(path, name, *row) for path, rows in FIELDS.items() for name, row in rows.items()]


@pytest.fixture()
def served(
    make_gateway: Callable[..., RunningGateway], redis_url: str
) -> Iterator[tuple[RunningGateway, Responder]]:
    gateway = make_gateway(max_tokens=8)
    with responding(redis_url) as responder:
        yield gateway, responder


def _observed(gateway: RunningGateway, responder: Responder, path: str, body: dict[str, Any]) -> Any:
    """What a field could change: the answer (ids and times aside) and the request the worker got."""
    num_before = len(responder.requests)
    response = gateway.client.post(path, json=body)
    assert response.status_code == 200, response.text
    answer = re.sub(r'"(id|created)":\s*("[^"]*"|\d+)|\nid: \S+', "", response.text)
    submitted = [msgspec.to_builtins(r) for r in responder.requests[num_before:]]
    for request in submitted:
        for per_request in ("req_id", "arrival_time", "queue_deadline"):
            request.pop(per_request)
    return answer, submitted


def test_every_declared_field_has_a_row() -> None:
    for path, schema in SCHEMAS.items():
        listed = set(FIELDS[path]) | set(NO_VISIBLE_EFFECT_BY_PATH[path]) | REQUIRED[path]
        assert listed == set(schema.model_fields), path


@pytest.mark.parametrize(("path", "name", "value", "outcome", "base"), CASES)
def test_field_is_honoured_or_refused_by_name(
    served: tuple[RunningGateway, Responder],
    path: str,
    name: str,
    value: Any,
    outcome: str,
    base: dict[str, Any],
) -> None:
    gateway, responder = served
    if value is STOP_AT_THE_ANSWER:
        value = gateway.client.post(COMPLETIONS, json={"prompt": "hi"}).json()["choices"][0]["text"]
        responder.requests.clear()
    baseline = {**BASE[path], **base}
    body = {**baseline, name: value}
    if outcome == REFUSED:
        response = gateway.client.post(path, json=body)
        assert response.status_code == 400, response.text
        assert response.json()["error"]["param"] == name
        assert name in response.json()["error"]["message"]
        assert len(responder.requests) == 0
        return
    assert _observed(gateway, responder, path, body) != _observed(gateway, responder, path, baseline)


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
def test_fields_without_a_visible_effect_are_accepted(
    served: tuple[RunningGateway, Responder], path: str
) -> None:
    gateway, _ = served
    model = gateway.client.get("/v1/models").json()["data"][0]["id"]
    for name, value in {**NO_VISIBLE_EFFECT_BY_PATH[path], "model": model}.items():
        response = gateway.client.post(path, json={**BASE[path], name: value})
        assert response.status_code == 200, (name, response.text)


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
def test_an_unknown_field_is_refused_by_name(served: tuple[RunningGateway, Responder], path: str) -> None:
    gateway, responder = served
    response = gateway.client.post(path, json={**BASE[path], "logit_bias_v2": {"5": 1}})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "logit_bias_v2"
    assert len(responder.requests) == 0


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("tools", []),
        ("tool_choice", "none"),
        ("response_format", {"type": "text"}),
        ("modalities", ["text"]),
        ("store", False),
        ("service_tier", "auto"),
        ("tools", None),
    ],
)
def test_unsupported_fields_at_their_default_are_accepted(
    served: tuple[RunningGateway, Responder], name: str, value: Any
) -> None:
    """Clients that spell out the default (no tools, plain text) ask for exactly what they get."""
    gateway, _ = served
    response = gateway.client.post(CHAT, json={**BASE[CHAT], name: value})
    assert response.status_code == 200, response.text
