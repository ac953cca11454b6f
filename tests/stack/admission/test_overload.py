"""Overload is said, not suffered: past GATEWAY_MAX_QUEUED_REQUESTS the gateway answers 429 with
Retry-After and queues nothing; requests that wait past GATEWAY_MAX_QUEUE_WAIT_S end with a
`queue_timeout` error (503, or an error event when streaming), and the service goes on serving.

Real processes: batcher and gateway, and no worker at first, so every request waits.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import httpx
import redis

from common import streams
from harness.processes.services import Stack, wait_for

MAX_QUEUED = 2
# Long enough that both requests are seen waiting together before the first times out, even when
# the full suite loads the machine (at 3 s one run in the suite missed that window).
MAX_WAIT_S = 8.0
BODY = {"prompt": "hi", "max_tokens": 2}


def _stream_error(url: str) -> dict[str, object]:
    """The error event a streaming request ends with."""
    with httpx.stream("POST", f"{url}/v1/completions", json={**BODY, "stream": True}, timeout=30) as r:
        assert r.status_code == 200
        events = [line[len("data: ") :] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return dict(json.loads(events[-2])["error"])


def test_queue_bound_and_queue_deadline(make_stack: Callable[[], Stack], redis_url: str) -> None:
    stack = make_stack()
    stack.start_batcher()
    stack.start_gateway(GATEWAY_MAX_QUEUED_REQUESTS=str(MAX_QUEUED), GATEWAY_MAX_QUEUE_WAIT_S=str(MAX_WAIT_S))
    wait_for(lambda: stack.answers("/v1/models"), 60, "the gateway to answer")
    wait_for(lambda: "updated_at" in stack.stats(), 30, "the batcher to publish stats")
    client = redis.Redis.from_url(redis_url)

    with ThreadPoolExecutor(max_workers=2) as pool:
        started = time.monotonic()
        plain = pool.submit(httpx.post, f"{stack.base_url}/v1/completions", json=BODY, timeout=30)
        streamed = pool.submit(_stream_error, stack.base_url)
        wait_for(lambda: stack.stats().get("num_waiting") == MAX_QUEUED, 10, "both requests to wait")

        # Full: refused at once, with a time to come back, and nothing queued for it.
        refused = httpx.post(f"{stack.base_url}/v1/completions", json=BODY, timeout=30)
        assert refused.status_code == 429, refused.text
        assert int(refused.headers["retry-after"]) >= 1
        error = refused.json()["error"]
        assert error["code"] == "queue_full" and set(error) == {"message", "type", "param", "code"}
        assert client.xlen(streams.REQUESTS_STREAM) == MAX_QUEUED

        # The waiting ones end with a clear error once their deadline passes, not silence.
        response = plain.result(timeout=30)
        assert response.status_code == 503, response.text
        assert response.json()["error"]["code"] == "queue_timeout"
        assert streamed.result(timeout=30)["code"] == "queue_timeout"
        assert time.monotonic() - started >= MAX_WAIT_S - 0.5

    stats = stack.stats()
    assert stats["num_waiting"] == 0 and stats["num_queue_timeouts"] == MAX_QUEUED
    [group] = client.xinfo_groups(streams.REQUESTS_STREAM)
    assert group["pending"] == 0  # acknowledged: nothing left to recover

    # With room again and a worker, it serves.
    stack.start_worker()
    wait_for(lambda: stack.num_workers_joined() == 1, 90, "the worker to join")
    ok = httpx.post(f"{stack.base_url}/v1/completions", json=BODY, timeout=60)
    assert ok.status_code == 200, ok.text
    assert ok.json()["usage"]["completion_tokens"] == 2
