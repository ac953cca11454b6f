"""The dashboard over HTTP: its files need no key, its data does; the events endpoint replays the
trace, follows it live, sends the batcher's stats, stops reading Redis when its client leaves, and
rides out a Redis restart."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
import redis

from common import streams
from common.protocol import FIELD
from common.trace_schema import StepTrace, TracedRequest, encode_trace
from gateway.security.api_keys import hash_key
from gateway.settings import GatewaySettings
from harness.gateway.gateway_server import RunningGateway, start_server
from harness.processes.redis_process import RedisProcess
from harness.processes.services import wait_for

KEY = "sk-dashboard-viewer"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture()
def secured(make_gateway: Callable[..., RunningGateway]) -> RunningGateway:
    return make_gateway(api_key_hashes=f"viewer:{hash_key(KEY)}")


def _trace(step_id: int) -> StepTrace:
    return StepTrace(
        worker_id="w0",
        step_id=step_id,
        time=time.time(),
        reqs=[TracedRequest("aaaa0001", "d", 1), TracedRequest("bbbb0002", "p", 7)],
        num_sampled=1,
        num_blocks_used=3,
        num_blocks=64,
        num_waiting=2,
    )


def _events(response: httpx.Response) -> Iterator[tuple[str, str]]:
    """(event, data) pairs of a named-event SSE stream, as they arrive."""
    event = data = None
    for line in response.iter_lines():
        if line.startswith("event: "):
            event = line.removeprefix("event: ")
        elif line.startswith("data: "):
            data = line.removeprefix("data: ")
        elif line == "":
            assert event is not None and data is not None, "an event without a name or data"
            yield event, data
            event = data = None


def _next(events: Iterator[tuple[str, str]], name: str) -> str:
    for event, data in events:
        if event == name:
            return data
    raise AssertionError(f"the stream ended before a {name} event")


def _blocked_readers(gateway: RunningGateway) -> set[str]:
    """Ids of the Redis connections blocked in a read now."""
    clients: Any = gateway.harness.redis.client_list()
    return {c["id"] for c in clients if "b" in c["flags"]}


def _connections(gateway: RunningGateway) -> set[str]:
    clients: Any = gateway.harness.redis.client_list()
    return {c["id"] for c in clients}


@pytest.mark.parametrize(
    ("path", "media_type", "needle"),
    [
        ("/dashboard", "text/html", 'src="/dashboard/dashboard.js"'),
        ("/dashboard/dashboard.js", "text/javascript", "/v1/dashboard/events"),
        ("/dashboard/dashboard.css", "text/css", ".cell.p"),
    ],
)
def test_the_page_needs_no_key(secured: RunningGateway, path: str, media_type: str, needle: str) -> None:
    response = secured.client.get(path)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith(media_type)
    assert needle in response.text


@pytest.mark.parametrize("path", ["/v1/dashboard/events", "/dashboard/other.js", "/dashboard/"])
def test_everything_else_needs_a_key(secured: RunningGateway, path: str) -> None:
    assert secured.client.get(path).status_code == 401
    assert secured.client.get(path, headers={"Authorization": "Bearer sk-wrong"}).status_code == 401


def test_the_dashboard_is_no_part_of_the_openapi_schema(secured: RunningGateway) -> None:
    paths = secured.client.get("/openapi.json", headers=AUTH).json()["paths"]
    assert "/v1/chat/completions" in paths
    assert not [path for path in paths if "dashboard" in path]


def test_events_replay_follow_and_stop_with_the_client(secured: RunningGateway) -> None:
    r = secured.harness.redis
    written = [encode_trace(_trace(1)), encode_trace(_trace(2))]
    for data in written:
        r.xadd(streams.BATCHER_TRACE, {FIELD: data})
    spec = {
        "spec_decode_num_drafts": 4,
        "spec_decode_num_draft_tokens": 12,
        "spec_decode_num_accepted_tokens": 6,
    }
    per_pos = {f"spec_decode_num_accepted_tokens_per_pos:{i}": n for i, n in enumerate([3, 2, 1])}
    r.hset(
        streams.BATCHER_STATS,
        mapping={"num_waiting": 5, "num_running": 2, "updated_at": time.time(), **spec, **per_pos},
    )

    with secured.client.stream("GET", "/v1/dashboard/events", headers=AUTH) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = _events(response)
        # The recent steps first, byte for byte as the batcher wrote them, then the stats.
        assert [next(events), next(events)] == [("step", data.decode()) for data in written]
        stats = msgspec.json.decode(_next(events, "stats"))
        assert (stats["num_waiting"], stats["num_running"], stats["workers"]) == (5, 2, {})
        # Speculative decoding's figures: 1 + 6 / 4 tokens per drafting decode, half the drafts accepted.
        assert (stats["spec_accepted_len"], stats["spec_acceptance_rate"]) == (2.5, 0.5)
        assert stats["spec_acceptance_per_pos"] == [0.75, 0.5, 0.25]
        # Then live: a step traced now arrives on the open stream.
        live = encode_trace(_trace(3))
        r.xadd(streams.BATCHER_TRACE, {FIELD: live})
        assert _next(events, "step") == live.decode()
        wait_for(lambda: len(_blocked_readers(secured)) == 1, 5, "the stream's XREAD to block in Redis")
        [reader] = _blocked_readers(secured)
    # The client left: its blocked read is cancelled, which closes that connection (a read that went
    # on would keep it open, blocked or between reads).
    wait_for(lambda: reader not in _connections(secured), 5, "the dashboard's reading connection to close")


def test_events_ride_out_a_redis_restart(tiny_model_dir: Path, tmp_path: Path) -> None:
    redis_proc = RedisProcess(tmp_path / "redis")
    redis_proc.start()
    settings = GatewaySettings(model=tiny_model_dir, redis_url=redis_proc.url)
    server, thread, url = start_server(settings)
    client = redis.Redis.from_url(redis_proc.url)
    try:
        with (
            httpx.Client(base_url=url, timeout=30) as http,
            http.stream("GET", "/v1/dashboard/events") as response,
        ):
            events = _events(response)
            _next(events, "stats")
            redis_proc.stop()  # SIGTERM: the AOF keeps what was written
            assert "redis unreachable" in msgspec.json.decode(_next(events, "unavailable"))["message"]
            redis_proc.start()
            # Back on the same connection: a step traced after the restart arrives.
            live = encode_trace(_trace(1))
            client.xadd(streams.BATCHER_TRACE, {FIELD: live})
            assert _next(events, "step") == live.decode()
    finally:
        client.close()
        server.should_exit = True
        thread.join(timeout=15)
        redis_proc.stop()
