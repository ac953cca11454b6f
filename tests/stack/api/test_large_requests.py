"""A large request is parsed, templated and tokenized off the gateway's event loop
(gateway/prepare_pool.py): other requests are answered while it is, and its answer is the one it
would get on the loop."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from harness.gateway.gateway_server import RunningGateway
from harness.gateway.responder import responding
from harness.processes.services import wait_for

JSON = {"content-type": "application/json"}
PROSE = "the value of a function returns its result when the list is sorted by key and"


def _text(num_bytes: int) -> str:
    """Prose-like text of common words in a shifting order: seconds of work for the tokenizer at 3 MB."""
    vocabulary = PROSE.split(" ")
    words = [vocabulary[(i * 7 + i // 13) % len(vocabulary)] for i in range(num_bytes // 4)]
    return " ".join(words)[:num_bytes]


def _large(kind: str, model: str) -> tuple[str, bytes]:
    text = _text(3 * 1024 * 1024)
    if kind == "tokenize":
        return "/tokenize", json.dumps({"model": model, "prompt": text}).encode()
    body = {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": 1}
    return "/v1/chat/completions", json.dumps(body).encode()


@pytest.mark.parametrize("kind", ["tokenize", "chat"])
def test_small_requests_are_answered_while_a_large_one_is_prepared(
    make_gateway: Callable[..., RunningGateway], kind: str
) -> None:
    gateway = make_gateway()
    state = gateway.app.state.gateway
    path, body = _large(kind, state.models.default.rules.name)
    answered: list[httpx.Response] = []
    done = threading.Event()

    def send_large() -> None:
        with httpx.Client(base_url=gateway.url, timeout=300) as client:
            answered.append(client.post(path, content=body, headers=JSON))
        done.set()

    def tokenizing() -> bool:
        # Its second job is running: the body was parsed (the first), now it is tokenized (seconds).
        return done.is_set() or (state.prepare.num_started >= 2 and state.prepare.num_unfinished > 0)

    sender = threading.Thread(target=send_large, name="large-client")
    sender.start()
    try:
        wait_for(tokenizing, 120, "the large request to be tokenized")
        assert not done.is_set(), "the large request was answered before it could be watched"
        for _ in range(3):
            assert gateway.client.get("/v1/models").status_code == 200
        # Answered while the large request is still being tokenized: on the event loop it would be
        # answered only once that was done.
        assert state.prepare.num_unfinished > 0 and not done.is_set()
    finally:
        sender.join(timeout=300)
    [large] = answered
    if kind == "tokenize":
        assert large.status_code == 200, large.text
        tokenized = large.json()
        assert tokenized["count"] == len(tokenized["tokens"]) > 100_000
    else:
        assert large.status_code == 400, large.text
        assert large.json()["error"]["code"] == "context_length_exceeded"


def _requests(model: str) -> list[tuple[str, dict[str, Any]]]:
    """One request of each kind whose prompt the gateway prepares."""
    messages = [{"role": "user", "content": "What is the assert statement?"}]
    return [
        ("/v1/completions", {"model": model, "prompt": "Return the value", "max_tokens": 2}),
        ("/v1/chat/completions", {"model": model, "messages": messages, "max_tokens": 2}),
        ("/v1/messages", {"model": model, "messages": messages, "max_tokens": 2}),
        ("/v1/messages/count_tokens", {"model": model, "messages": messages}),
        ("/v1/responses", {"model": model, "input": "What is a list?", "max_output_tokens": 2}),
        ("/tokenize", {"model": model, "prompt": "Return the value", "return_token_strs": True}),
        ("/tokenize", {"model": model, "messages": messages}),
        ("/detokenize", {"model": model, "tokens": [40, 41, 42]}),
    ]


def test_a_request_prepared_on_a_thread_is_answered_as_on_the_loop(
    make_gateway: Callable[..., RunningGateway], redis_url: str
) -> None:
    on_loop = make_gateway(prepare_inline_bytes=10**9)
    on_thread = make_gateway(prepare_inline_bytes=0)
    model = on_loop.app.state.gateway.models.default.rules.name
    with responding(redis_url) as responder:
        answers = {}
        for gateway in (on_loop, on_thread):
            for path, body in _requests(model):
                response = gateway.client.post(path, json=body)
                assert response.status_code == 200, (path, response.text)
                answers[gateway.url, path, json.dumps(body)] = response.json()
        queued = [r.prompt_token_ids for r in responder.requests]
    assert queued[:4] == queued[4:] and len(queued) == 8  # what each generation queued
    for path, body in _requests(model):
        if not path.startswith("/v1/") or path.endswith("count_tokens"):
            key = (path, json.dumps(body))
            assert answers[(on_loop.url, *key)] == answers[(on_thread.url, *key)]


@pytest.mark.parametrize("size", [10, 40_000], ids=["small", "large"])
def test_a_large_invalid_body_is_refused_as_a_small_one(
    make_gateway: Callable[..., RunningGateway], size: int
) -> None:
    gateway = make_gateway()
    text = "x" * size
    unknown_field = {"messages": [{"role": "user", "content": text, "mood": "calm"}]}
    refused = gateway.client.post("/v1/chat/completions", json=unknown_field)
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert (error["type"], error["param"]) == ("invalid_request_error", "messages[0].mood")
    cut = gateway.client.post("/v1/completions", content=f'{{"prompt": "{text}'.encode(), headers=JSON)
    assert cut.status_code == 400
    assert cut.json()["error"]["type"] == "invalid_request_error" and "JSON" in cut.json()["error"]["message"]
    wrong_type = gateway.client.post("/tokenize", json={"prompt": text, "add_special_tokens": "yes"})
    assert wrong_type.status_code == 400 and wrong_type.json()["error"]["param"] == "add_special_tokens"
    assert gateway.harness.redis.dbsize() == 0  # nothing queued
