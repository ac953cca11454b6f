"""The stream client against a real redis-server, with hand-written token streams (no model)."""

from __future__ import annotations

import asyncio

import pytest
import redis
import redis.asyncio as aioredis

from common.protocol import (
    FIELD,
    AbortRequest,
    GenerateRequest,
    RequestError,
    SamplingParams,
    TokenEvent,
    decode_inbox,
    decode_request,
    encode,
)
from common.stream_client import abort, follow, follow_async, follow_entries, new_req_id, submit, submit_once
from common.streams import BATCHER_INBOX, REQUESTS_STREAM, token_stream
from common.token_rules import RequestFailed, RequestTimedOut


@pytest.fixture()
def r(redis_url: str) -> redis.Redis:
    return redis.Redis.from_url(redis_url)


def _request(req_id: str) -> GenerateRequest:
    params = SamplingParams(max_tokens=4, temperature=0.0)
    return GenerateRequest(
        req_id=req_id, prompt_token_ids=[5, 6, 7], sampling_params=params, arrival_time=1.0
    )


def _write(r: redis.Redis, req_id: str, *events: TokenEvent | RequestError) -> None:
    for event in events:
        r.xadd(token_stream(req_id), {FIELD: encode(event)})


def _token(index: int, attempt: int, finish: str | None = None) -> TokenEvent:
    return TokenEvent(
        req_id="r1", index=index, token_id=100 * attempt + index, attempt=attempt, finish_reason=finish
    )  # type: ignore[arg-type]


def test_submit_appends_one_entry_holding_the_request(r: redis.Redis) -> None:
    req_id = new_req_id()
    assert submit(r, _request(req_id)) == req_id
    [(_, fields)] = r.xrange(REQUESTS_STREAM)
    assert decode_request(fields[FIELD]) == _request(req_id)


def test_submit_once_submits_a_request_id_only_once(r: redis.Redis) -> None:
    assert submit_once(r, _request("job-1"))
    assert not submit_once(r, _request("job-1"))  # a retried client
    assert submit_once(r, _request("job-2"))
    ids = [decode_request(fields[FIELD]).req_id for _, fields in r.xrange(REQUESTS_STREAM)]
    assert ids == ["job-1", "job-2"]


def test_follow_applies_the_reader_rules_and_stops_at_the_finish(r: redis.Redis) -> None:
    _write(
        r,
        "r1",
        _token(0, 0),
        _token(1, 0),
        _token(1, 0),  # a repeated index
        _token(0, 1),  # failover: the new attempt replays what was streamed...
        _token(1, 1),
        _token(2, 1),  # ...and continues
        _token(3, 0),  # the old attempt, late
        _token(3, 1, "length"),
        _token(4, 1),  # nothing after the finish is read
    )
    tokens = [(e.index, e.attempt) for e in follow(r, "r1", timeout_s=5)]
    assert tokens == [(0, 0), (1, 0), (2, 1), (3, 1)]


def test_follow_resumes_after_an_entry_id(r: redis.Redis) -> None:
    _write(r, "r1", _token(0, 0), _token(1, 0), _token(2, 0, "stop"))
    entry_ids = [entry_id for entry_id, _ in follow_entries(r, "r1", timeout_s=5)]
    rest = [e.index for e in follow(r, "r1", last_id=entry_ids[0], timeout_s=5)]
    assert rest == [1, 2]


def test_follow_raises_on_errors_and_server_side_ends(r: redis.Redis) -> None:
    _write(r, "r1", _token(0, 0), RequestError(req_id="r1", message="boom", code="queue_timeout"))
    with pytest.raises(RequestFailed) as failed:
        list(follow(r, "r1", timeout_s=5))
    assert failed.value.error.code == "queue_timeout"
    _write(r, "r2", _token(0, 0, "abort"))
    with pytest.raises(RequestFailed):
        list(follow(r, "r2", timeout_s=5))


def test_follow_times_out_on_a_silent_stream(r: redis.Redis) -> None:
    with pytest.raises(RequestTimedOut):
        list(follow(r, "nobody", timeout_s=0.2))


def test_abort_reaches_the_batcher_inbox(r: redis.Redis) -> None:
    abort(r, "r1", "stop")
    [(_, fields)] = r.xrange(BATCHER_INBOX)
    assert decode_inbox(fields[FIELD]) == AbortRequest(req_id="r1", reason="stop")


def test_follow_async_applies_the_same_rules(redis_url: str, r: redis.Redis) -> None:
    _write(r, "r1", _token(0, 0), _token(0, 1), _token(1, 1, "stop"))

    async def read() -> list[int]:
        client = aioredis.Redis.from_url(redis_url)
        try:
            return [e.index async for e in follow_async(client, "r1", timeout_s=5)]
        finally:
            await client.aclose()

    assert asyncio.run(read()) == [0, 1]
