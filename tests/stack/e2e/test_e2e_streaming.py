"""Streaming, stop strings, disconnects and bad input through the whole pipeline of real processes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from common import streams
from harness.processes.services import Stack, running_stack, wait_for


@pytest.fixture(scope="module")
def stack(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    # No resume window: a client that leaves is aborted at once (tests/stack/streams/test_resume.py has one).
    with running_stack(
        tmp_path_factory.mktemp("streaming-stack"), tiny_model_dir, GATEWAY_RESUME_GRACE_S="0"
    ) as stack:
        yield stack


@pytest.fixture()
def client(stack: Stack) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=stack.base_url, timeout=120) as c:
        yield c


def sse_events(lines: Iterator[str]) -> Iterator[tuple[str | None, str]]:
    """(id, data) per SSE event."""
    event_id: str | None = None
    for line in lines:
        if line.startswith("id: "):
            event_id = line[4:]
        elif line.startswith("data: "):
            yield event_id, line[6:]
            event_id = None


def pending(stack: Stack) -> int:
    info: Any = redis.Redis.from_url(stack.redis_url).xpending(streams.REQUESTS_STREAM, streams.BATCHER_GROUP)
    return int(info["pending"])


def settled(stack: Stack) -> bool:
    """Nothing running, nothing waiting, nothing unacknowledged."""
    stats = stack.stats()
    return stats["num_running"] == 0 and stats["num_waiting"] == 0 and pending(stack) == 0


def complete(client: httpx.Client, prompt: str, **params: Any) -> dict[str, Any]:
    body = {"prompt": prompt, "temperature": 0, "ignore_eos": True, **params}
    response = client.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    return dict(response.json())


def test_chat_stream_framing_ids_and_usage(stack: Stack, client: httpx.Client) -> None:
    body = {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Return a value"},
        ],
        "max_tokens": 12,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with client.stream("POST", "/v1/chat/completions", json=body) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        events = list(sse_events(resp.iter_lines()))
    assert events[-1] == (None, "[DONE]")
    chunks = [(i, json.loads(d)) for i, d in events[:-1]]
    assert chunks[0][1]["choices"][0]["delta"]["role"] == "assistant"
    *content, (_, usage) = chunks[1:]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 12
    assert content[-1][1]["choices"][0]["finish_reason"] == "length"
    # Each content event's id is an entry of the request's token stream, in order.
    req_id = chunks[0][1]["id"].removeprefix("chatcmpl-")
    entries: Any = redis.Redis.from_url(stack.redis_url).xrange(streams.token_stream(req_id))
    entry_ids = [e[0].decode() for e in entries]
    ids = [i for i, _ in content]
    assert all(i in entry_ids for i in ids) and ids == sorted(ids, key=entry_ids.index)
    assert ids[-1] == entry_ids[-1] and len(entry_ids) == 12
    streamed = "".join(c["choices"][0]["delta"].get("content", "") for _, c in content)
    whole = client.post("/v1/chat/completions", json={**body, "stream": False}).json()
    assert whole["choices"][0]["message"]["content"] == streamed
    assert whole["usage"]["completion_tokens"] == 12
    wait_for(lambda: settled(stack), 30, "both requests to be acknowledged")


@pytest.mark.parametrize("stream", [False, True])
def test_stop_string_ends_the_request_in_the_batcher(
    stack: Stack, client: httpx.Client, stream: bool
) -> None:
    prompt = "The object is used to return a new"
    text = complete(client, prompt, max_tokens=30)["choices"][0]["text"]
    stop = text[12:16]
    expected = text[: text.find(stop)]
    aborted_before = stack.stats()["num_aborted"]
    body = {"prompt": prompt, "temperature": 0, "ignore_eos": True, "max_tokens": 400, "stop": [stop]}
    if stream:
        with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as resp:
            chunks = [json.loads(d) for _, d in sse_events(resp.iter_lines()) if d != "[DONE]"]
        got = "".join(c["choices"][0]["text"] for c in chunks)
        finish = chunks[-1]["choices"][0]["finish_reason"]
    else:
        choice = complete(client, prompt, max_tokens=400, stop=[stop])["choices"][0]
        got, finish = choice["text"], choice["finish_reason"]
    assert (got, finish) == (expected, "stop")
    # The gateway's abort stops the generation long before its 400 tokens.
    wait_for(lambda: stack.stats()["num_aborted"] > aborted_before, 30, "the batcher to drop the request")
    wait_for(lambda: settled(stack), 30, "the request to leave the batch and be acknowledged")


def test_client_disconnect_frees_the_request(stack: Stack, client: httpx.Client) -> None:
    """Without a resume window (GATEWAY_RESUME_GRACE_S=0) a client that leaves is aborted at once."""
    aborted_before = stack.stats()["num_aborted"]
    body = {"prompt": "Return", "max_tokens": 480, "temperature": 0, "ignore_eos": True, "stream": True}
    with client.stream("POST", "/v1/completions", json=body) as resp:
        first = None
        for _, data in sse_events(resp.iter_lines()):
            first = json.loads(data)
            break
    assert first is not None
    req_id = first["id"].removeprefix("cmpl-")
    wait_for(lambda: stack.stats()["num_aborted"] > aborted_before, 30, "the batcher to drop the request")
    wait_for(lambda: settled(stack), 30, "the request to leave the batch and be acknowledged")
    generated = redis.Redis.from_url(stack.redis_url).xlen(streams.token_stream(req_id))
    assert generated < 480, "the request ran to its end instead of being aborted"


def test_bad_input_is_refused_and_service_keeps_serving(client: httpx.Client) -> None:
    for body, status, param in [
        ({"prompt": "hi", "n": 0}, 400, "n"),
        ({"prompt": "hi", "temperature": -1}, 400, "temperature"),
        ({"prompt": "hi", "max_tokens": 100_000}, 400, "max_tokens"),
        ({"prompt": "hi", "model": "no-such-model"}, 404, "model"),
        ({"prompt": 5}, 400, "prompt"),
    ]:
        response = client.post("/v1/completions", json=body)
        assert response.status_code == status, (body, response.text)
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["param"] == param
    response = client.post(
        "/v1/completions", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert response.status_code == 400 and "error" in response.json()
    assert complete(client, "Return", max_tokens=3)["usage"]["completion_tokens"] == 3
