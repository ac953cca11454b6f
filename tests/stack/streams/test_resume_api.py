"""Resume and fetch by id through the gateway's API, with the test harness playing the worker.

A resumed stream must be the original's events after Last-Event-ID, byte for byte (same ids, chunks,
usage and [DONE]); a fetch must be the original non-streaming body; another key's request is 404.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer

from common.protocol import GenerateRequest
from common.streams import FOLLOW_DEADLINES, request_meta
from gateway.security.api_keys import hash_key
from harness.gateway.gateway_server import RunningGateway
from harness.gateway.sse_client import SSEEvent, get_sse, post_raw, post_sse, read_then_hang_up
from harness.processes.services import wait_for
from openai_frontend.follow.deadlines import MIN_DEADLINE_S

STREAM_BODY = {"prompt": "hi", "max_tokens": 50, "stream": True}
RESUMABLE_BODY = {**STREAM_BODY, "resumable": True}  # outlives its connection for the resume window
OUTPUT_TEXT = " Return the value of the object. It is used to return a new"


@pytest.fixture(scope="module")
def tok(tiny_model_dir: Path) -> Tokenizer:
    return Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))


def _ids(tok: Tokenizer, text: str) -> list[int]:
    return list(tok.encode(text, add_special_tokens=False).ids)


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (
            "/v1/chat/completions",
            {
                "messages": [{"role": "user", "content": "hi"}],
                "stop": ["a new"],
                "stream_options": {"include_usage": True},
            },
        ),
        ("/v1/completions", {"prompt": "Return the", "echo": True, "return_token_ids": True}),
    ],
    ids=["chat", "completion"],
)
def test_resume_replays_exactly_the_events_after_last_event_id(
    gateway: RunningGateway, tok: Tokenizer, path: str, body: dict[str, Any]
) -> None:
    with ThreadPoolExecutor(max_workers=1) as pool:
        future = pool.submit(post_sse, gateway.client, path, {**body, "max_tokens": 50, "stream": True})
        request = gateway.harness.next_request()
        gateway.harness.emit_tokens(request.req_id, _ids(tok, OUTPUT_TEXT), finish_reason="length")
        response, events = future.result(timeout=30)
    assert response.headers["x-request-id"] == request.req_id
    assert events[-1].data == "[DONE]"
    response_id = events[0].json()["id"]
    assert response_id.endswith(request.req_id)

    # From the start (no Last-Event-ID): the whole stream, opening chunks included.
    _, whole = get_sse(gateway.client, f"/v1/requests/{request.req_id}/stream")
    assert whole == events
    with_ids = [i for i, e in enumerate(events) if e.id is not None]
    assert len(with_ids) >= 3
    for i in with_ids:
        header = {"Last-Event-ID": events[i].id or ""}
        resumed, rest = get_sse(gateway.client, f"/v1/requests/{response_id}/stream", header)
        assert resumed.status_code == 200 and resumed.headers["x-request-id"] == request.req_id
        assert rest == events[i + 1 :], f"resumed after event {i}"
    # The query parameter works as the header does (for clients that cannot set headers).
    i = with_ids[1]
    _, rest = get_sse(gateway.client, f"/v1/requests/{request.req_id}/stream?last_event_id={events[i].id}")
    assert rest == events[i + 1 :]


def test_fetch_returns_the_non_streaming_body(gateway: RunningGateway, tok: Tokenizer) -> None:
    body = {"prompt": "Return the", "max_tokens": 50, "echo": True, "stop": ["It is"]}
    with ThreadPoolExecutor(max_workers=1) as pool:
        future = pool.submit(gateway.client.post, "/v1/completions", json=body)
        request = gateway.harness.next_request()
        fetched = gateway.client.get(f"/v1/requests/{request.req_id}")
        assert fetched.status_code == 409, fetched.text  # still running
        assert fetched.json()["error"]["code"] == "request_running"
        gateway.harness.emit_tokens(request.req_id, _ids(tok, OUTPUT_TEXT), finish_reason=None)
        original = future.result(timeout=30)
    assert original.status_code == 200
    assert original.headers["x-request-id"] == request.req_id
    assert original.json()["choices"][0]["text"] == "Return the Return the value of the object. "
    for any_id in (request.req_id, original.json()["id"]):
        fetched = gateway.client.get(f"/v1/requests/{any_id}")
        assert fetched.status_code == 200, fetched.text
        assert fetched.json() == original.json()


def test_unknown_or_malformed_ids(gateway: RunningGateway) -> None:
    assert gateway.client.get("/v1/requests/0123abcd").status_code == 404
    assert gateway.client.get("/v1/requests/0123abcd/stream").status_code == 404
    with ThreadPoolExecutor(max_workers=1) as pool:
        future = pool.submit(gateway.client.post, "/v1/completions", json={"prompt": "hi", "max_tokens": 2})
        request = gateway.harness.next_request()
        gateway.harness.emit_tokens(request.req_id, [300, 301], finish_reason="length")
        assert future.result(timeout=30).status_code == 200
    _, events = get_sse(gateway.client, f"/v1/requests/{request.req_id}/stream")
    last_ms, last_seq = (int(part) for part in (events[-2].id or "").split("-"))
    # int() alone took these as event ids and replayed the whole stream; an id past the end (or one
    # never sent) would replay nothing, which looks like a finished stream.
    bad_ids = ["x", "1_0-0", "+1-0", " 1-0", "1-0 ", "1", "-1-0", "\u0661-0", f"{last_ms}-{last_seq + 1}"]
    bad_ids += [f"{last_ms + 1}-0", "99999999999999-0"]
    for bad_id in bad_ids:
        path = f"/v1/requests/{request.req_id}/stream"
        bad = gateway.client.get(path, params={"last_event_id": bad_id})
        assert bad.status_code == 400, (bad_id, bad.text)
        assert bad.json()["error"]["param"] == "last_event_id"
    bad = gateway.client.get(path, headers={"Last-Event-ID": "1_0-0"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "last_event_id"
    # The stream's own last event is a valid id: nothing after it but the end.
    _, rest = get_sse(
        gateway.client, f"/v1/requests/{request.req_id}/stream", {"Last-Event-ID": events[-2].id or ""}
    )
    assert [e.data for e in rest] == ["[DONE]"]


def test_only_the_creating_key_can_read_a_request(
    make_gateway: Callable[..., RunningGateway], tok: Tokenizer
) -> None:
    alice, bob = "sk-alice-secret", "sk-bob-secret"
    gw = make_gateway(api_key_hashes=f"alice:{hash_key(alice)},bob:{hash_key(bob)}")
    as_alice = {"Authorization": f"Bearer {alice}"}
    as_bob = {"Authorization": f"Bearer {bob}"}
    with ThreadPoolExecutor(max_workers=1) as pool:
        future = pool.submit(
            gw.client.post, "/v1/completions", json={"prompt": "hi", "max_tokens": 5}, headers=as_alice
        )
        request = gw.harness.next_request()
        assert request.owner == "alice"
        gw.harness.emit_tokens(request.req_id, _ids(tok, " Return"), finish_reason="length")
        assert future.result(timeout=30).status_code == 200
    for path in (f"/v1/requests/{request.req_id}", f"/v1/requests/{request.req_id}/stream"):
        assert gw.client.get(path, headers=as_alice).status_code == 200
        refused = gw.client.get(path, headers=as_bob)
        # The same answer as for an id that does not exist: nothing to learn by probing.
        assert refused.status_code == 404 and refused.json()["error"]["code"] == "not_found"
        assert gw.client.get(path).status_code == 401


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "non-streaming"])
def test_a_request_not_asked_resumable_is_aborted_when_its_client_leaves(
    make_gateway: Callable[..., RunningGateway], tok: Tokenizer, stream: bool
) -> None:
    """The default, whatever the resume window: a client that goes away cancels its request at once
    (no deadline left to pass), and resuming it finds the abort."""
    gw = make_gateway(resume_grace_s=30)
    if stream:
        with ThreadPoolExecutor(max_workers=1) as pool:
            future = pool.submit(read_then_hang_up, gw.url, "/v1/completions", STREAM_BODY, 1)
            request = gw.harness.next_request()
            gw.harness.emit_tokens(request.req_id, _ids(tok, " Return"), finish_reason=None)
            future.result(timeout=30)
    else:
        with post_raw(gw.url, "/v1/completions", {**STREAM_BODY, "stream": False}):
            request = gw.harness.next_request()
            wait_for(lambda: _deadline(gw, request.req_id) is not None, 15, "the client to wait for it")
        # The socket is closed: the client left without reading an answer.
    assert gw.harness.wait_abort(request.req_id, timeout_s=15).reason == "abort"
    wait_for(lambda: _deadline(gw, request.req_id) is None, 15, "the deadline to be dropped")


def test_without_a_window_even_a_resumable_request_is_aborted_at_once(
    make_gateway: Callable[..., RunningGateway], tok: Tokenizer
) -> None:
    gw = make_gateway(resume_grace_s=0)
    with ThreadPoolExecutor(max_workers=1) as pool:
        future = pool.submit(read_then_hang_up, gw.url, "/v1/completions", RESUMABLE_BODY, 1)
        request = gw.harness.next_request()
        gw.harness.emit_tokens(request.req_id, _ids(tok, " Return"), finish_reason=None)
        assert future.result(timeout=30)[0] == request.req_id
    assert gw.harness.wait_abort(request.req_id, timeout_s=15).reason == "abort"


def test_stream_disconnect_starts_the_grace_window_in_the_follow_deadline(
    make_gateway: Callable[..., RunningGateway], tok: Tokenizer
) -> None:
    """Followed, the request's follow deadline is renewed; the hang-up cuts it to now + the window, which the
    batcher enforces (tests/stack/streams/test_resume.py), so the window outlives this gateway."""
    grace_s = 2.0
    gw = make_gateway(resume_grace_s=grace_s)
    with ThreadPoolExecutor(max_workers=1) as pool:
        future = pool.submit(read_then_hang_up, gw.url, "/v1/completions", RESUMABLE_BODY, 1)
        request = gw.harness.next_request()
        wait_for(lambda: _deadline(gw, request.req_id) is not None, 15, "the deadline")
        assert _deadline(gw, request.req_id) >= time.time() + MIN_DEADLINE_S - 2  # renewed while followed
        gw.harness.emit_tokens(request.req_id, _ids(tok, " Return"), finish_reason=None)
        future.result(timeout=30)
    wait_for(lambda: _deadline(gw, request.req_id) < time.time() + grace_s + 0.5, 15, "the window to start")
    left_at = time.time()
    assert _deadline(gw, request.req_id) > left_at + grace_s - 2.0
    assert gw.harness.aborts() == []  # not at once: the batcher aborts when the deadline passes


def _deadline(gw: RunningGateway, req_id: str) -> float | None:
    score = gw.harness.redis.zscore(FOLLOW_DEADLINES, req_id)
    return None if score is None else float(score)


def _leave(
    pool: ThreadPoolExecutor, gw: RunningGateway, first: list[int], num_events: int
) -> tuple[GenerateRequest, list[SSEEvent]]:
    """A resumable completion whose client reads `num_events` SSE events of `first` and hangs up:
    the request as the gateway queued it, and the events the client saw."""
    future = pool.submit(read_then_hang_up, gw.url, "/v1/completions", RESUMABLE_BODY, num_events)
    request = gw.harness.next_request()
    gw.harness.emit_tokens(request.req_id, first, finish_reason=None)
    _, seen = future.result(timeout=30)
    return request, seen


def _wait_attached(gw: RunningGateway, req_id: str) -> None:
    """The resumed follower is attached once its read is in place."""
    meta_key = request_meta(req_id)
    wait_for(lambda: int(gw.harness.redis.hget(meta_key, "attach")) == 1, 15, "the resume to attach")


def test_resume_within_the_grace_window_keeps_the_request(
    make_gateway: Callable[..., RunningGateway], tok: Tokenizer
) -> None:
    """A client that asked for `resumable` leaves and resumes: the request runs on to its end.
    The window is long (no race with a loaded machine); what keeps the request is asserted on
    conditions: no abort, and the deadline renewed by the resumed follower, then dropped."""
    grace_s = 30.0
    gw = make_gateway(resume_grace_s=grace_s)
    first, rest = _ids(tok, " Return"), _ids(tok, " the value")
    with ThreadPoolExecutor(max_workers=1) as pool:
        request, seen = _leave(pool, gw, first, 1)
        # The hang-up cut the deadline to the window...
        wait_for(
            lambda: _deadline(gw, request.req_id) < time.time() + grace_s + 0.5, 15, "the window to start"
        )
        resumed = pool.submit(
            get_sse, gw.client, f"/v1/requests/{request.req_id}/stream", {"Last-Event-ID": seen[-1].id or ""}
        )
        _wait_attached(gw, request.req_id)  # only then end the request
        gw.harness.emit_tokens(request.req_id, rest, start_index=len(first), finish_reason="length")
        _, events = resumed.result(timeout=30)
    text = "".join(e.json()["choices"][0]["text"] for e in events if e.data != "[DONE]")
    assert seen[-1].json()["choices"][0]["text"] + text == " Return the value"
    # The resumed follower dropped the deadline at the end; nothing ever aborted the request.
    wait_for(lambda: _deadline(gw, request.req_id) is None, 15, "the deadline to be dropped")
    assert gw.harness.aborts() == []


def test_a_resume_through_another_gateway_gets_exactly_the_rest(
    make_gateway: Callable[..., RunningGateway], tok: Tokenizer
) -> None:
    """The first gateway follows its request through its token stream; the client leaves and
    resumes through a second gateway, which reads the token stream after Last-Event-ID: the same
    events, ids included, as a replay from the start, after that id."""
    first_gw = make_gateway(resume_grace_s=30.0)
    other_gw = make_gateway(resume_grace_s=30.0)
    first, rest = _ids(tok, " Return the"), _ids(tok, " value of the object")
    with ThreadPoolExecutor(max_workers=1) as pool:
        request, seen = _leave(pool, first_gw, first, 2)
        last_id = seen[-1].id or ""
        resumed = pool.submit(
            get_sse, other_gw.client, f"/v1/requests/{request.req_id}/stream", {"Last-Event-ID": last_id}
        )
        _wait_attached(other_gw, request.req_id)
        first_gw.harness.emit_tokens(request.req_id, rest, start_index=len(first), finish_reason="length")
        _, events = resumed.result(timeout=30)
    # A replay from the start on the first gateway.
    _, whole = get_sse(first_gw.client, f"/v1/requests/{request.req_id}/stream")
    ids = [e.id for e in whole]
    assert whole[: len(seen)] == seen
    assert events == whole[ids.index(last_id) + 1 :]
    text = "".join(e.json()["choices"][0]["text"] for e in whole if e.data != "[DONE]")
    assert text == " Return the value of the object"
