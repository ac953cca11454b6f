"""What a request leaves in Redis goes one retention window after it ends, and not before.

Real batcher and worker processes with `CBSERVE_RETENTION_S=2`. The batcher trims the requests stream
by age but never from the oldest pending entry on: a request that waits longer than the window (no
worker yet) keeps its entry, so a batcher taking over could still rebuild it. Once it has finished,
its entry, its token stream and its submit marker go, the inbox empties, and the consumer name of an
earlier batcher is gone.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import redis

from common import streams
from common.protocol import GenerateRequest, SamplingParams
from common.stream_client import follow, new_req_id, submit_once
from harness.processes.services import Stack, wait_for

RETENTION = {"CBSERVE_RETENTION_S": "2"}


def _ids(r: redis.Redis, stream: str) -> list[str]:
    rows: Any = r.xrange(stream)
    return [entry_id.decode() for entry_id, _ in rows]


def test_pending_requests_outlive_the_window_and_finished_ones_leave_nothing(
    make_stack: Callable[[], Stack],
) -> None:
    stack = make_stack()
    r = redis.Redis.from_url(stack.redis_url)
    old = stack.start_batcher("old", BATCHER_BATCHER_ID="old", **RETENTION)
    wait_for(lambda: stack.stats().get("epoch") == 1, 60, "the first batcher to lead")
    old.terminate()  # a clean stop frees the lease at once
    old.wait(timeout=30)
    stack.start_batcher("batcher", BATCHER_BATCHER_ID="new", **RETENTION)
    wait_for(lambda: stack.stats().get("epoch") == 2, 60, "the second batcher to lead")

    # No worker yet: the request is claimed and waits, pending, for longer than the window.
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    request = GenerateRequest(
        req_id=new_req_id(), prompt_token_ids=[5, 6, 7], sampling_params=params, arrival_time=time.time()
    )
    assert submit_once(r, request)
    # An unreadable entry after it is dead-lettered (and acknowledged) at once.
    r.xadd(streams.REQUESTS_STREAM, {b"m": b"not msgpack"})
    wait_for(lambda: r.xlen(streams.DEAD_LETTER_STREAM) == 1, 30, "the bad entry to be dead-lettered")
    kept = _ids(r, streams.REQUESTS_STREAM)
    # The dead-letter entry is younger than both: once it is trimmed, so would they have been.
    wait_for(lambda: r.xlen(streams.DEAD_LETTER_STREAM) == 0, 30, "a trim past the window")
    assert _ids(r, streams.REQUESTS_STREAM) == kept and len(kept) == 2
    pending: Any = r.xpending(streams.REQUESTS_STREAM, streams.BATCHER_GROUP)
    assert pending["pending"] == 1

    stack.start_worker(**RETENTION)
    assert len(list(follow(r, request.req_id, timeout_s=90))) == 4

    def nothing_left() -> bool:
        left = [k for pattern in streams.REQUEST_KEY_PATTERNS for k in r.scan_iter(match=pattern)]
        return not left and r.xlen(streams.REQUESTS_STREAM) == 0 and r.xlen(streams.BATCHER_INBOX) == 0

    wait_for(nothing_left, 30, "the request's keys and stream entries to go")
    pending = r.xpending(streams.REQUESTS_STREAM, streams.BATCHER_GROUP)
    assert pending["pending"] == 0
    consumers: Any = r.xinfo_consumers(streams.REQUESTS_STREAM, streams.BATCHER_GROUP)
    assert [c["name"] for c in consumers] == [b"new"]
