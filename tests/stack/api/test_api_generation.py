"""The gateway over real HTTP and a real Redis, with the test harness playing the worker."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from tokenizers import Tokenizer

from common.protocol import GenerateRequest
from gateway.settings import GatewaySettings
from harness.gateway.gateway_server import RunningGateway, start_server
from harness.gateway.sse_client import SSEEvent, post_sse
from harness.processes.redis_server import free_port

OUTPUT_TEXT = " Return the value of the object."


@pytest.fixture(scope="module")
def tok(tiny_model_dir: Path) -> Tokenizer:
    return Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))


@pytest.fixture()
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(max_workers=4) as executor:
        yield executor


def _token(tok: Tokenizer, text: str) -> int:
    token_id = tok.token_to_id(text)
    assert token_id is not None
    return int(token_id)


def _ids(tok: Tokenizer, text: str) -> list[int]:
    return list(tok.encode(text, add_special_tokens=False).ids)


def _content(events: list[SSEEvent]) -> list[dict[str, Any]]:
    return [e.json() for e in events if e.data != "[DONE]"]


def _post(
    gw: RunningGateway, pool: ThreadPoolExecutor, path: str, body: dict[str, Any]
) -> Future[httpx.Response]:
    return pool.submit(gw.client.post, path, json=body)


def test_health_503_until_a_fresh_heartbeat(gateway: RunningGateway) -> None:
    response = gateway.client.get("/health")
    assert response.status_code == 503
    assert "heartbeat" in response.json()["message"]
    gateway.harness.heartbeat("old-worker", at=time.time() - 60)
    assert gateway.client.get("/health").status_code == 503
    gateway.harness.heartbeat("worker-0")
    response = gateway.client.get("/health")
    assert response.status_code == 200
    assert response.json()["status"] == "ok"


def test_health_503_when_redis_unreachable(tiny_model_dir: Path) -> None:
    settings = GatewaySettings(model=tiny_model_dir, redis_url=f"redis://127.0.0.1:{free_port()}/0")
    server, thread, url = start_server(settings)
    try:
        response = httpx.get(f"{url}/health", timeout=30)
        assert response.status_code == 503
        assert response.json()["status"] == "degraded"
        assert response.json()["message"].startswith("degraded: redis unreachable")
        # Generation needs the queue: 503 with an OpenAI error object and Retry-After, not a crash.
        response = httpx.post(f"{url}/v1/completions", json={"prompt": "hi"}, timeout=30)
        assert response.status_code == 503
        assert response.json()["error"]["type"] == "server_error"
        assert response.json()["error"]["code"] == "redis_unavailable"
        assert int(response.headers["Retry-After"]) > 0
    finally:
        server.should_exit = True
        thread.join(timeout=15)


def test_models(gateway: RunningGateway, tiny_model_dir: Path) -> None:
    body = gateway.client.get("/v1/models").json()
    assert body["object"] == "list"
    [card] = body["data"]
    assert card["id"] == tiny_model_dir.name
    assert card["object"] == "model"
    assert card["max_model_len"] == 512
    assert isinstance(card["created"], int)
    # The server's filesystem is nobody's business: `root` names the model, as `id` does.
    assert card["root"] == tiny_model_dir.name
    assert str(tiny_model_dir.parent) not in gateway.client.get("/v1/models").text


def test_head_health_answers_like_get(gateway: RunningGateway) -> None:
    """Load balancers probe with HEAD: the same status, no body."""
    head = gateway.client.head("/health")
    assert head.status_code == gateway.client.get("/health").status_code == 503
    assert head.content == b""
    gateway.harness.heartbeat("worker-0")
    head = gateway.client.head("/health")
    assert head.status_code == 200 and head.content == b""


def test_completion_non_streaming(gateway: RunningGateway, pool: ThreadPoolExecutor, tok: Tokenizer) -> None:
    body = {
        "model": gateway.settings.model_name,
        "prompt": "Return the",
        "max_tokens": 20,
        "temperature": 0.5,
        "top_p": 0.9,
        "top_k": -1,
        "seed": 7,
        "stop_token_ids": [5],
        "ignore_eos": True,
        "presence_penalty": 0.0,  # unknown to us: ignored, as OpenAI ignores unknown fields
    }
    future = _post(gateway, pool, "/v1/completions", body)
    request = gateway.harness.next_request()
    assert request.prompt_token_ids == list(tok.encode("Return the").ids)
    params = request.sampling_params
    assert (params.max_tokens, params.temperature, params.top_p, params.top_k) == (20, 0.5, 0.9, 0)
    assert (params.seed, params.stop_token_ids, params.ignore_eos) == (7, [5], True)
    assert request.arrival_time == pytest.approx(time.time(), abs=30)
    output_ids = _ids(tok, OUTPUT_TEXT)
    gateway.harness.emit_tokens(request.req_id, output_ids, finish_reason="length")

    response = future.result(timeout=30)
    assert response.status_code == 200, response.text
    data = response.json()
    assert data["id"] == f"cmpl-{request.req_id}"
    assert data["object"] == "text_completion"
    assert data["model"] == gateway.settings.model_name
    assert isinstance(data["created"], int)
    assert data["choices"] == [{"index": 0, "text": OUTPUT_TEXT, "logprobs": None, "finish_reason": "length"}]
    n = len(request.prompt_token_ids)
    assert data["usage"] == {
        "prompt_tokens": n,
        "completion_tokens": len(output_ids),
        "total_tokens": n + len(output_ids),
        "prompt_tokens_details": {"cached_tokens": 0},
    }


def test_chat_non_streaming(gateway: RunningGateway, pool: ThreadPoolExecutor, tok: Tokenizer) -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "What is"}, {"type": "text", "text": "json?"}]},
    ]
    future = _post(gateway, pool, "/v1/chat/completions", {"messages": messages, "max_completion_tokens": 9})
    request = gateway.harness.next_request()
    expected_prompt = (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nWhat is\njson?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert request.prompt_token_ids == _ids(tok, expected_prompt)
    assert request.sampling_params.max_tokens == 9
    eos = _token(tok, "<|im_end|>")
    output_ids = [*_ids(tok, "It is a format."), eos]
    gateway.harness.emit_tokens(request.req_id, output_ids, finish_reason="stop")

    data = future.result(timeout=30).json()
    assert data["id"] == f"chatcmpl-{request.req_id}"
    assert data["object"] == "chat.completion"
    # The EOS token counts as generated but is not shown.
    assert data["choices"] == [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "It is a format."},
            "logprobs": None,
            "finish_reason": "stop",
        }
    ]
    assert data["usage"]["completion_tokens"] == len(output_ids)
    assert data["usage"]["prompt_tokens"] == len(request.prompt_token_ids)


def test_prompt_as_token_ids_and_default_max_tokens(
    gateway: RunningGateway, pool: ThreadPoolExecutor, tok: Tokenizer
) -> None:
    prompt_ids = _ids(tok, "Open the file and")
    future = _post(gateway, pool, "/v1/completions", {"prompt": prompt_ids})
    request = gateway.harness.next_request()
    assert request.prompt_token_ids == prompt_ids
    # Without max_tokens the output may fill the rest of the context, as in vLLM.
    assert request.sampling_params.max_tokens == 512 - len(prompt_ids)
    gateway.harness.emit_tokens(request.req_id, _ids(tok, " read it"), finish_reason="length")
    data = future.result(timeout=30).json()
    assert data["choices"][0]["text"] == " read it"
    assert data["usage"]["prompt_tokens"] == len(prompt_ids)


def test_completion_stream_framing(gateway: RunningGateway, pool: ThreadPoolExecutor, tok: Tokenizer) -> None:
    body = {
        "prompt": "Return the",
        "max_tokens": 50,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    future = pool.submit(post_sse, gateway.client, "/v1/completions", body)
    request = gateway.harness.next_request()
    output_ids = _ids(tok, OUTPUT_TEXT)
    entry_ids = gateway.harness.emit_tokens(request.req_id, output_ids, finish_reason="length")

    response, events = future.result(timeout=30)
    assert response.headers["content-type"].startswith("text/event-stream")
    assert events[-1] == SSEEvent(None, "[DONE]")
    *token_events, usage_event, _ = events
    # One event per token here (ASCII, no stop strings), each tagged with its token event's entry id.
    assert [e.id for e in token_events] == entry_ids
    chunks = [e.json() for e in token_events]
    assert "".join(c["choices"][0]["text"] for c in chunks) == OUTPUT_TEXT
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * (len(chunks) - 1) + ["length"]
    for chunk in chunks:
        assert chunk["object"] == "text_completion"
        assert chunk["id"] == f"cmpl-{request.req_id}"
        assert chunk["usage"] is None
        assert chunk["choices"][0]["logprobs"] is None
    usage = usage_event.json()
    assert usage["choices"] == []
    assert usage["usage"]["completion_tokens"] == len(output_ids)


def test_chat_stream_role_first_and_no_usage_by_default(
    gateway: RunningGateway, pool: ThreadPoolExecutor, tok: Tokenizer
) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "stream": True}
    future = pool.submit(post_sse, gateway.client, "/v1/chat/completions", body)
    request = gateway.harness.next_request()
    output_ids = _ids(tok, "Hello there")
    entry_ids = gateway.harness.emit_tokens(request.req_id, output_ids, finish_reason=None)
    eos_entry = gateway.harness.emit(request.req_id, 0, len(output_ids), finish_reason="stop")

    _, events = future.result(timeout=30)
    assert events[-1].data == "[DONE]"
    chunks = _content(events)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert [e.id for e in events[1:-1]] == [*entry_ids, eos_entry]
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == "Hello there"
    assert chunks[-1]["choices"][0] == {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}
    for chunk in chunks:
        assert chunk["object"] == "chat.completion.chunk"
        assert "usage" not in chunk


def test_duplicate_and_stale_attempt_events_are_dropped(
    gateway: RunningGateway, pool: ThreadPoolExecutor, tok: Tokenizer
) -> None:
    future = _post(gateway, pool, "/v1/completions", {"prompt": "Return the", "max_tokens": 50})
    request = gateway.harness.next_request()
    good = _ids(tok, " one two three four five")
    junk = _token(tok, "x")
    h, rid = gateway.harness, request.req_id
    h.emit_tokens(rid, good[:2], attempt=0, finish_reason=None)
    h.emit(rid, junk, 1, attempt=0)  # duplicate index
    # Failover: attempt 1 replays indexes 0-1 (differently, to prove they are dropped), then continues.
    h.emit_tokens(rid, [junk, junk, *good[2:4]], attempt=1, finish_reason=None)
    h.emit(rid, junk, 4, attempt=0)  # the old attempt's writer, too late
    h.emit_tokens(rid, good[4:], start_index=4, attempt=1, finish_reason="length")

    data = future.result(timeout=30).json()
    assert data["choices"][0]["text"] == " one two three four five"
    assert data["usage"]["completion_tokens"] == len(good)


@pytest.mark.parametrize("stream", [False, True])
def test_stop_string(gateway: RunningGateway, pool: ThreadPoolExecutor, tok: Tokenizer, stream: bool) -> None:
    body = {"prompt": "Return the", "max_tokens": 50, "stop": ["never", "STOP"], "stream": stream}
    if stream:
        future: Future[Any] = pool.submit(post_sse, gateway.client, "/v1/completions", body)
    else:
        future = _post(gateway, pool, "/v1/completions", body)
    request = gateway.harness.next_request()
    full = " the value. STOP and then more text"
    # The worker keeps generating: only the gateway knows about stop strings.
    gateway.harness.emit_tokens(request.req_id, _ids(tok, full), finish_reason=None)

    if stream:
        _, events = future.result(timeout=30)
        chunks = _content(events)
        # Never a partial "STOP" on the wire: the concatenation is exactly the text before it.
        assert "".join(c["choices"][0]["text"] for c in chunks) == " the value. "
        assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
        assert events[-1].data == "[DONE]"
    else:
        choice = future.result(timeout=30).json()["choices"][0]
        assert choice["text"] == " the value. "
        assert choice["finish_reason"] == "stop"
    abort = gateway.harness.wait_abort(request.req_id)
    assert abort.reason == "stop"


# Streaming disconnects (abort at once unless the request asked for `resumable`): test_resume_api.py.


def test_non_streaming_client_disconnect_aborts(
    gateway: RunningGateway, pool: ThreadPoolExecutor, tok: Tokenizer
) -> None:
    def give_up_early() -> type[Exception]:
        try:
            httpx.post(f"{gateway.url}/v1/completions", json={"prompt": "hi", "max_tokens": 5}, timeout=0.5)
        except httpx.ReadTimeout as exc:
            return type(exc)
        raise AssertionError("the request should not have finished")

    future = pool.submit(give_up_early)
    request = gateway.harness.next_request()
    assert future.result(timeout=30) is httpx.ReadTimeout
    assert gateway.harness.wait_abort(request.req_id, timeout_s=15).reason == "abort"
    _assert_still_serving(gateway, pool, tok)


@pytest.mark.parametrize(("code", "status"), [("server_error", 500), ("invalid_request_error", 400)])
def test_request_error_non_streaming(
    gateway: RunningGateway, pool: ThreadPoolExecutor, code: str, status: int
) -> None:
    future = _post(gateway, pool, "/v1/completions", {"prompt": "hi", "max_tokens": 5})
    request = gateway.harness.next_request()
    gateway.harness.emit_error(request.req_id, "the worker fell over", code=code)
    response = future.result(timeout=30)
    assert response.status_code == status
    error = response.json()["error"]
    assert error["message"] == "the worker fell over"
    assert error["code"] == code
    assert set(error) == {"message", "type", "param", "code"}


def test_request_error_streaming(gateway: RunningGateway, pool: ThreadPoolExecutor, tok: Tokenizer) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "stream": True}
    future = pool.submit(post_sse, gateway.client, "/v1/chat/completions", body)
    request = gateway.harness.next_request()
    gateway.harness.emit_tokens(request.req_id, _ids(tok, "Hel"), finish_reason=None)
    error_entry = gateway.harness.emit_error(request.req_id, "out of memory")
    _, events = future.result(timeout=30)
    assert events[-1].data == "[DONE]"
    assert events[-2].id == error_entry
    assert events[-2].json() == {
        "error": {"message": "out of memory", "type": "server_error", "param": None, "code": "server_error"}
    }
    assert gateway.harness.aborts() == []  # a failed request is already over


def _assert_still_serving(gateway: RunningGateway, pool: ThreadPoolExecutor, tok: Tokenizer) -> None:
    future = _post(gateway, pool, "/v1/completions", {"prompt": "hi", "max_tokens": 3})
    request: GenerateRequest = gateway.harness.next_request()
    gateway.harness.emit_tokens(request.req_id, _ids(tok, " ok"), finish_reason="length")
    response = future.result(timeout=30)
    assert response.status_code == 200
    assert response.json()["choices"][0]["text"] == " ok"


@pytest.mark.parametrize("stream", [False, True])
def test_return_token_ids(
    gateway: RunningGateway, pool: ThreadPoolExecutor, tok: Tokenizer, stream: bool
) -> None:
    body = {"prompt": "Return the", "max_tokens": 50, "stream": stream, "return_token_ids": True}
    if stream:
        future: Future[Any] = pool.submit(post_sse, gateway.client, "/v1/completions", body)
    else:
        future = _post(gateway, pool, "/v1/completions", body)
    request = gateway.harness.next_request()
    output_ids = _ids(tok, OUTPUT_TEXT)
    gateway.harness.emit_tokens(request.req_id, output_ids, finish_reason="length")
    if stream:
        _, events = future.result(timeout=30)
        choices = [c for chunk in _content(events) for c in chunk["choices"]]
        assert [t for c in choices for t in c["token_ids"]] == output_ids
    else:
        [choice] = future.result(timeout=30).json()["choices"]
        assert choice["token_ids"] == output_ids and choice["text"] == OUTPUT_TEXT
