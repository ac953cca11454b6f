"""A client loses its connection, or the gateway itself dies, mid-stream: the client resumes by id.

Real processes (batcher, worker, gateway under uvicorn) on a private Redis. Every stream here asks for
`"resumable": true` (without it, a client that leaves cancels its request). A resumed client must
get exactly the rest of the stream: what it read before plus what the resume sends equals an
uninterrupted greedy run, token for token and character for character. A request nobody resumes
is aborted once the grace window has passed.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from common import streams
from common.protocol import FIELD, RequestError, decode_event
from harness.gateway.sse_client import SSEEvent, get_sse, post_sse, read_then_hang_up, sse_events
from harness.processes.services import Stack, running_stack, wait_for

GRACE_S = 3.0
MAX_TOKENS = 300
PROMPT = [72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100]


def _body(**extra: Any) -> dict[str, Any]:
    return {
        "prompt": PROMPT,
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "ignore_eos": True,
        "return_token_ids": True,
        "stream": True,
        "resumable": True,  # outlives its connection for the resume window
        **extra,
    }


@pytest.fixture(scope="module")
def stack(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    log_dir = tmp_path_factory.mktemp("resume-stack")
    with running_stack(log_dir, tiny_model_dir, GATEWAY_RESUME_GRACE_S=str(GRACE_S)) as stack:
        yield stack


@pytest.fixture(scope="module")
def uninterrupted(stack: Stack) -> tuple[str, list[int]]:
    """Text and token ids of the same greedy request, read to its end in one go."""
    with httpx.Client(base_url=stack.base_url, timeout=120) as client:
        _, events = _post_sse(client, _body())
    return _text(events), _token_ids(events)


def _post_sse(client: httpx.Client, body: dict[str, Any]) -> tuple[httpx.Response, list[SSEEvent]]:
    return post_sse(client, "/v1/completions", body)


def _chunks(events: list[SSEEvent]) -> list[dict[str, Any]]:
    return [e.json() for e in events if e.data != "[DONE]"]


def _text(events: list[SSEEvent]) -> str:
    return "".join(c["choices"][0]["text"] for c in _chunks(events) if c["choices"])


def _token_ids(events: list[SSEEvent]) -> list[int]:
    return [t for c in _chunks(events) for choice in c["choices"] for t in choice.get("token_ids") or []]


def _last_id(events: list[SSEEvent]) -> str:
    return next(e.id for e in reversed(events) if e.id is not None)


def _errors(events: list[SSEEvent]) -> list[Any]:
    return [c["error"] for c in _chunks(events) if "error" in c]


def _resume(base_url: str, req_id: str, last_id: str) -> list[SSEEvent]:
    with httpx.Client(base_url=base_url, timeout=120) as client:
        response, events = get_sse(client, f"/v1/requests/{req_id}/stream", {"Last-Event-ID": last_id})
    assert response.status_code == 200, response.text
    assert events[-1].data == "[DONE]"
    return events


def _stream(base_url: str, body: dict[str, Any], on_ids: Callable[[int], bool]) -> tuple[str, list[SSEEvent]]:
    """Read a stream until it ends, its connection breaks, or `on_ids` (called with the number of
    events with an id so far, after each) returns True: then the client hangs up."""
    events: list[SSEEvent] = []
    req_id = ""
    try:
        with (
            httpx.Client(base_url=base_url, timeout=120) as client,
            client.stream("POST", "/v1/completions", json=body) as response,
        ):
            req_id = response.headers["x-request-id"]
            for event in sse_events(response):
                events.append(event)
                if event.id is not None and on_ids(sum(e.id is not None for e in events)):
                    break
    except httpx.HTTPError:
        pass  # the gateway died under the client
    return req_id, events


def test_dropped_client_resumes_and_gets_exactly_the_rest(
    stack: Stack, uninterrupted: tuple[str, list[int]]
) -> None:
    text, token_ids = uninterrupted
    aborted_before = stack.stats()["num_aborted"]
    req_id, seen = read_then_hang_up(stack.base_url, "/v1/completions", _body(), 4)
    assert len(_token_ids(seen)) < MAX_TOKENS
    rest = _resume(stack.base_url, req_id, _last_id(seen))
    assert not _errors(rest)
    assert _token_ids(seen) + _token_ids(rest) == token_ids
    assert _text(seen) + _text(rest) == text
    assert _chunks(rest)[-1]["choices"][0]["finish_reason"] == "length"
    # The resumed follower renewed the request's follow deadline, then dropped it when the request ended.
    deadlines = redis.Redis.from_url(stack.redis_url)
    wait_for(
        lambda: deadlines.zscore(streams.FOLLOW_DEADLINES, req_id) is None, 30, "the deadline to be dropped"
    )
    assert stack.stats()["num_aborted"] == aborted_before


def test_finished_request_can_be_fetched_by_id(stack: Stack) -> None:
    with httpx.Client(base_url=stack.base_url, timeout=120) as client:
        body = {"messages": [{"role": "user", "content": "Return"}], "max_tokens": 12, "temperature": 0}
        original = client.post("/v1/chat/completions", json=body)
        assert original.status_code == 200, original.text
        req_id = original.headers["x-request-id"]
        assert original.json()["id"] == f"chatcmpl-{req_id}"
        fetched = client.get(f"/v1/requests/{req_id}")
    assert fetched.status_code == 200, fetched.text
    assert fetched.json() == original.json()


def test_request_nobody_resumes_is_aborted_after_the_grace_window(stack: Stack) -> None:
    worker = stack.procs["worker0"]
    aborted_before = stack.stats()["num_aborted"]

    def pause_worker_and_hang_up(num_ids: int) -> bool:
        # Paused, the worker cannot finish the request by itself within the window.
        if num_ids < 2:
            return False
        os.kill(worker.pid, signal.SIGSTOP)
        return True

    try:
        req_id, seen = _stream(stack.base_url, _body(), pause_worker_and_hang_up)
        assert len(_token_ids(seen)) < MAX_TOKENS
        wait_for(lambda: stack.stats()["num_aborted"] > aborted_before, 30, "the batcher to abort it")
    finally:
        os.kill(worker.pid, signal.SIGCONT)
    assert "client left: aborting in 3 s unless it resumes" in stack.log("gateway")
    assert "no client follows it (deadline passed): aborting" in stack.log("batcher")
    # The token stream says how it ended, so a late resume or fetch answers at once.
    client = redis.Redis.from_url(stack.redis_url)
    entries: Any = client.xrange(streams.token_stream(req_id))
    ends = [decode_event(f[FIELD]) for _, f in entries]
    errors = [e for e in ends if isinstance(e, RequestError)]
    assert len(errors) == 1 and errors[0].code == "request_aborted", ends
    assert client.ttl(streams.token_stream(req_id)) > 0
    rest = _resume(stack.base_url, req_id, _last_id(seen))
    assert [e["code"] for e in _errors(rest)] == ["request_aborted"]
    with httpx.Client(base_url=stack.base_url, timeout=30) as http:
        assert http.get(f"/v1/requests/{req_id}").status_code == 410


def test_killed_gateway_is_replaced_and_the_client_resumes_through_the_new_one(
    make_stack: Callable[[], Stack], tiny_model_dir: Path
) -> None:
    stack = make_stack()
    stack.start_batcher()
    stack.start_worker()
    stack.start_gateway(GATEWAY_RESUME_GRACE_S=str(GRACE_S))
    stack.wait_ready(num_workers=1)
    with httpx.Client(base_url=stack.base_url, timeout=120) as client:
        _, whole = _post_sse(client, _body())
    old = stack.procs["gateway"]
    client_redis = redis.Redis.from_url(stack.redis_url)
    num_at_kill: list[int] = []

    def kill_after_four(num_ids: int) -> bool:
        if num_ids == 4 and not num_at_kill:
            old.send_signal(signal.SIGKILL)
            old.wait(timeout=10)
            num_at_kill.append(-1)
        return False  # read on until the connection breaks

    req_id, seen = _stream(stack.base_url, _body(), kill_after_four)
    assert num_at_kill and req_id
    assert not seen or seen[-1].data != "[DONE]", "the stream ended before the kill"
    key = streams.token_stream(req_id)
    assert client_redis.xlen(key) < MAX_TOKENS, "too late: the request finished before the kill"
    # No gateway is running, yet the request goes on to its end.
    wait_for(lambda: client_redis.xlen(key) == MAX_TOKENS, 60, "the request to finish without a gateway")
    stack.start_gateway(GATEWAY_RESUME_GRACE_S=str(GRACE_S))
    stack.wait_ready(num_workers=1)
    rest = _resume(stack.base_url, req_id, _last_id(seen))
    assert not _errors(rest)
    assert _token_ids(seen) + _token_ids(rest) == _token_ids(whole)
    assert _text(seen) + _text(rest) == _text(whole)
    assert stack.stats()["num_aborted"] == 0
    assert json.loads(rest[-2].data)["choices"][0]["finish_reason"] == "length"


def test_request_of_a_killed_gateway_nobody_resumes_is_aborted_when_its_deadline_passes(
    make_stack: Callable[[], Stack],
) -> None:
    """The gateway that would have timed the resume window is gone: the follow deadline in Redis times it."""
    stack = make_stack()
    stack.start_batcher()
    worker = stack.start_worker()
    stack.start_gateway(GATEWAY_RESUME_GRACE_S=str(GRACE_S))
    stack.wait_ready(num_workers=1)
    gateway = stack.procs["gateway"]

    def pause_worker_and_kill_gateway(num_ids: int) -> bool:
        if num_ids == 2:
            os.kill(worker.pid, signal.SIGSTOP)  # so the request cannot end by itself
            gateway.send_signal(signal.SIGKILL)
            gateway.wait(timeout=10)
        return False  # read on until the connection breaks

    try:
        req_id, seen = _stream(stack.base_url, _body(), pause_worker_and_kill_gateway)
        assert gateway.returncode is not None and len(_token_ids(seen)) < MAX_TOKENS
        client = redis.Redis.from_url(stack.redis_url)
        assert client.zscore(streams.FOLLOW_DEADLINES, req_id) is not None
        wait_for(lambda: stack.stats()["num_aborted"] == 1, 60, "the batcher to abort it")
    finally:
        os.kill(worker.pid, signal.SIGCONT)
    assert "no client follows it (deadline passed): aborting" in stack.log("batcher")
    assert client.zscore(streams.FOLLOW_DEADLINES, req_id) is None
    wait_for(lambda: client.ttl(streams.token_stream(req_id)) > 0, 30, "the request to end")
    ends = [decode_event(f[FIELD]) for _, f in client.xrange(streams.token_stream(req_id))]
    assert [e.code for e in ends if isinstance(e, RequestError)] == ["request_aborted"]
