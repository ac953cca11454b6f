"""A batcher taking over rebuilds its state from Redis alone (batcher/service/recovery.py), in-process."""

from __future__ import annotations

from typing import Any

import redis

from batcher.service.leadership import Leadership
from batcher.service.loop import Batcher
from batcher.service.recovery import _history
from batcher.settings import BatcherSettings
from common import streams
from common.protocol import (
    FIELD,
    AbortRequest,
    GenerateRequest,
    RequestError,
    SamplingParams,
    TokenEvent,
    WorkerInfo,
    encode,
)


def _rows(*events: TokenEvent | RequestError) -> list[tuple[bytes, dict[bytes, bytes]]]:
    return [(f"{i}-0".encode(), {FIELD: encode(e)}) for i, e in enumerate(events)]


def _token(index: int, token_id: int, attempt: int, finish: bool = False) -> TokenEvent:
    return TokenEvent(
        req_id="r",
        index=index,
        token_id=token_id,
        attempt=attempt,
        finish_reason="length" if finish else None,
    )


def test_history_takes_each_index_once_and_the_newest_attempt() -> None:
    h = _history(_rows(_token(0, 10, 1), _token(1, 11, 1), _token(1, 99, 2), _token(2, 12, 2)))
    assert h.output_token_ids == [10, 11, 12] and h.attempt == 2 and not h.finished
    assert _history(_rows(_token(0, 10, 1), _token(1, 11, 1, finish=True))).finished
    assert _history(_rows(_token(0, 10, 1), RequestError(req_id="r", message="boom"))).finished
    assert _history([]).output_token_ids == []


def _submit(client: redis.Redis, req_id: str) -> str:
    req = GenerateRequest(
        req_id=req_id,
        prompt_token_ids=[5, 6, 7],
        sampling_params=SamplingParams(max_tokens=8, temperature=0.0),
        arrival_time=0.0,
    )
    return client.xadd(streams.REQUESTS_STREAM, {FIELD: encode(req)}).decode()  # type: ignore[union-attr]


def test_takeover_fences_workers_and_rebuilds_from_pending_and_token_streams(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    client.xgroup_create(streams.REQUESTS_STREAM, streams.BATCHER_GROUP, id="0", mkstream=True)
    ids = {name: _submit(client, name) for name in ["running", "waiting", "done", "aborted"]}
    # The old batcher (consumer "old") claimed them all and streamed some tokens.
    client.xreadgroup(streams.BATCHER_GROUP, "old", {streams.REQUESTS_STREAM: ">"})
    for i, token_id in enumerate([40, 41, 42]):
        event = TokenEvent(req_id="running", index=i, token_id=token_id, attempt=2)
        client.xadd(streams.token_stream("running"), {FIELD: encode(event)})
    final = TokenEvent(req_id="done", index=0, token_id=9, attempt=1, finish_reason="stop")
    client.xadd(streams.token_stream("done"), {FIELD: encode(final)})
    client.xadd(streams.BATCHER_INBOX, {FIELD: encode(AbortRequest(req_id="aborted"))})
    # A worker that holds the old batcher's requests.
    info = WorkerInfo(
        worker_id="w", model="m", num_blocks=16, block_size=16, max_model_len=256, started_at=0.0
    )
    client.hset(streams.WORKERS_HASH, "w", encode(info))
    client.xadd(streams.worker_steps("w"), {FIELD: b"stale step"})
    client.set(streams.BATCHER_EPOCH, 1)  # an earlier batcher led

    settings = BatcherSettings(redis_url=redis_url, batcher_id="new", lease_ttl_s=30)
    lease = Leadership(client, "new", settings.lease_ttl_s)
    assert lease.acquire() and lease.epoch == 2
    batcher = Batcher(settings, client, lease)
    batcher.setup()
    batcher.send()

    assert not client.hexists(streams.WORKERS_HASH, "w")
    assert not client.exists(streams.worker_steps("w"))
    requests = batcher.scheduler.requests
    assert sorted(requests) == ["running", "waiting"]
    assert requests["running"].output_token_ids == [40, 41, 42] and requests["running"].attempt == 2
    assert requests["waiting"].output_token_ids == [] and requests["waiting"].attempt == 0
    rows: Any = client.xpending_range(streams.REQUESTS_STREAM, streams.BATCHER_GROUP, "-", "+", 10)
    assert sorted((r["message_id"].decode(), r["consumer"].decode()) for r in rows) == sorted(
        [(ids["running"], "new"), (ids["waiting"], "new")]
    )
    assert batcher.num_recovered == 4


def test_entries_read_by_a_stale_leader_are_claimed(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    settings = BatcherSettings(redis_url=redis_url, batcher_id="new", lease_ttl_s=30)
    lease = Leadership(client, "new", settings.lease_ttl_s)
    assert lease.acquire()
    batcher = Batcher(settings, client, lease)
    batcher.setup()
    _submit(client, "late")
    # An old leader woke from a pause and read it into its own name before stepping down.
    client.xreadgroup(streams.BATCHER_GROUP, "old", {streams.REQUESTS_STREAM: ">"})
    batcher.housekeeping.next_worker_check = 0.0
    batcher.step()
    assert "late" in batcher.scheduler.requests
    rows: Any = client.xpending_range(streams.REQUESTS_STREAM, streams.BATCHER_GROUP, "-", "+", 10)
    assert [r["consumer"].decode() for r in rows] == ["new"]
