"""A stream that pauses longer than the keep-alive interval, before its first token and after it, read
to the end by the real OpenAI and Anthropic SDKs on every streaming route.

openai 3.63's SSE decoder keeps the last event id across events (as the SSE spec says), so a blank line
after a keep-alive comment dispatched an event with empty data, and its `Stream` raised
`JSONDecodeError`: every stream whose next token was more than GATEWAY_SSE_KEEPALIVE_S away (a worker
killed mid-stream, a busy CPU, a long queue) died in the client. The pauses here are real: no token is
written until the client has read two keep-alives.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import anthropic
import httpx2 as httpx  # the HTTP library both SDKs are built on now
import openai
import pytest

from harness.gateway.gateway_server import RunningGateway

KEEPALIVE = b": keep-alive"
TOKENS = [300, 301, 302, 303]
WAIT_S = 30.0


class _Recorded(httpx.SyncByteStream):
    def __init__(self, inner: httpx.SyncByteStream, seen: Callable[[bytes], None]) -> None:
        self._inner = inner
        self._seen = seen

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self._inner:
            self._seen(chunk)
            yield chunk

    def close(self) -> None:
        self._inner.close()


class RecordingTransport(httpx.HTTPTransport):
    """The SDK's own transport, noting every body byte as the SDK reads it: the test knows how many
    keep-alives reached the client without touching what the SDK parses."""

    def __init__(self, keepalive: bytes = KEEPALIVE) -> None:
        super().__init__()
        self._keepalive = keepalive
        self._lock = threading.Lock()
        self._body = b""

    def _seen(self, chunk: bytes) -> None:
        with self._lock:
            self._body += chunk

    def num_keepalives(self) -> int:
        with self._lock:
            return self._body.count(self._keepalive)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        assert isinstance(response.stream, httpx.SyncByteStream)
        return httpx.Response(
            response.status_code,
            headers=response.headers,
            stream=_Recorded(response.stream, self._seen),
            extensions=response.extensions,
        )

    def wait_keepalives(self, num: int) -> None:
        deadline = time.monotonic() + WAIT_S
        while self.num_keepalives() < num:
            assert time.monotonic() < deadline, f"fewer than {num} keep-alives reached the client"
            time.sleep(0.05)


def _pause_then_finish(gateway: RunningGateway, transport: RecordingTransport, req_id: str) -> None:
    """The request's tokens, after two keep-alives have reached the client and two more after the first."""
    transport.wait_keepalives(2)
    gateway.harness.emit_tokens(req_id, TOKENS[:1], finish_reason=None)
    transport.wait_keepalives(4)
    gateway.harness.emit_tokens(req_id, TOKENS[1:], start_index=1)


def _paused(gateway: RunningGateway, transport: RecordingTransport, read: Callable[[], Any]) -> Any:
    """Runs `read` (an SDK stream read to its end) while the request pauses before its first token and
    after it; what `read` returned."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        future: Future[Any] = pool.submit(read)
        try:
            request = gateway.harness.next_request()
        except TimeoutError:
            raise AssertionError(
                f"the request was not queued: {future.exception(timeout=WAIT_S)!r}"
            ) from None
        _pause_then_finish(gateway, transport, request.req_id)
        return future.result(timeout=WAIT_S)


@pytest.fixture()
def paused_gateway(make_gateway: Callable[..., RunningGateway]) -> RunningGateway:
    gateway = make_gateway(sse_keepalive_s=0.3)
    gateway.harness.heartbeat()  # a worker seems alive; the harness answers in its place
    return gateway


def _openai(gateway: RunningGateway, transport: RecordingTransport) -> openai.OpenAI:
    http = httpx.Client(transport=transport, timeout=WAIT_S)
    return openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", http_client=http, max_retries=0)


# An OpenAI SDK stream: (client, served model name) -> its chunks or events.
OpenAIStream = Callable[[openai.OpenAI, str], Iterable[Any]]
ReadPaused = Callable[[OpenAIStream], list[Any]]


@pytest.fixture()
def read_paused(paused_gateway: RunningGateway) -> ReadPaused:
    """Reads an OpenAI SDK stream to its end while its request pauses before its first token and after it."""
    gateway = paused_gateway
    transport = RecordingTransport()
    client = _openai(gateway, transport)

    def read(stream: OpenAIStream) -> list[Any]:
        return _paused(gateway, transport, lambda: list(stream(client, gateway.settings.model_name)))

    return read


def test_chat_completions(read_paused: ReadPaused) -> None:
    chunks = read_paused(
        lambda client, model: client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=4, stream=True
        )
    )
    assert chunks[-1].choices[0].finish_reason == "length", chunks
    assert sum(1 for c in chunks if c.choices and c.choices[0].delta.content) == len(TOKENS), chunks


def test_completions(read_paused: ReadPaused) -> None:
    chunks = read_paused(
        lambda client, model: client.completions.create(
            model=model, prompt=[5, 6, 7], max_tokens=4, stream=True
        )
    )
    assert chunks[-1].choices[0].finish_reason == "length", chunks


def test_responses(read_paused: ReadPaused) -> None:
    events = read_paused(
        lambda client, model: client.responses.create(
            model=model, input="hi", max_output_tokens=4, stream=True
        )
    )
    assert events[-1].type == "response.incomplete", [e.type for e in events]
    assert sum(e.type == "response.output_text.delta" for e in events) >= 1


def test_anthropic_messages(paused_gateway: RunningGateway) -> None:
    gateway = paused_gateway
    transport = RecordingTransport(keepalive=b"event: ping")  # Anthropic's keep-alive is an event
    http = httpx.Client(transport=transport, timeout=WAIT_S)
    client = anthropic.Anthropic(base_url=gateway.url, api_key="unused", http_client=http, max_retries=0)

    def read() -> list[Any]:
        with client.messages.stream(
            model=gateway.settings.model_name, max_tokens=4, messages=[{"role": "user", "content": "hi"}]
        ) as stream:
            return [*stream, stream.get_final_message()]

    events = _paused(gateway, transport, read)
    assert events[-1].stop_reason == "max_tokens", events[-1]


def test_request_resume(paused_gateway: RunningGateway) -> None:
    """GET /v1/requests/{id}/stream, read with the SDK's own Stream class (no SDK method names it)."""
    gateway = paused_gateway
    with ThreadPoolExecutor(max_workers=2) as pool:
        future = pool.submit(gateway.client.post, "/v1/completions", json={"prompt": [5], "max_tokens": 4})
        request = gateway.harness.next_request()
        transport = RecordingTransport()
        client = _openai(gateway, transport)

        def read() -> list[Any]:
            path = f"/requests/{request.req_id}/stream"
            stream = client.get(path, cast_to=object, stream=True, stream_cls=openai.Stream[object])
            return list(stream)

        resumed = pool.submit(read)
        _pause_then_finish(gateway, transport, request.req_id)
        chunks = resumed.result(timeout=WAIT_S)
        assert future.result(timeout=WAIT_S).status_code == 200
    assert chunks[-1]["choices"][0]["finish_reason"] == "length", chunks
