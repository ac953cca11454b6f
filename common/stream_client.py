"""A client of the stream protocol (docs/protocol.md): submit a request, follow its tokens, abort it.

Anything that can reach Redis can use the model this way, without the HTTP gateway: the gateway itself
submits and filters with these functions. Sync functions take a `redis.Redis`, the `*_async` ones a
`redis.asyncio.Redis`; both must return bytes (the default, `decode_responses=False`).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import redis
import redis.asyncio as aioredis

from common.protocol import (
    FIELD,
    AbortRequest,
    GenerateRequest,
    PoolingEvent,
    PromptEvent,
    TokenEvent,
    encode,
)
from common.redis_io.redis_conn import MAX_BLOCK_MS, min_id
from common.streams import DEFAULT_CELL, cell_keys, cell_of, placed_req_id, submitted_key, token_stream
from common.token_rules import EventFilter, RequestTimedOut, accept_entry

# A request id submitted with submit_once is remembered this long: longer than any request runs
# (retried clients follow it instead of submitting it again). When the request ends, the batcher cuts
# it to the retention window, with the token stream a retried client would follow.
SUBMITTED_TTL_S = 24 * 3600
_READ_COUNT = 256  # entries fetched per XREAD

# XADD only if the request id was never submitted: the marker and the entry are written together.
# The marker keeps the entry id, so a retried client can ask the batcher's group about the request
# (common/redis_io/result_lost.py). KEYS: requests stream, marker. ARGV: field, message, marker TTL.
_SUBMIT_ONCE = """
if redis.call('SET', KEYS[2], '1', 'NX', 'EX', ARGV[3]) then
  local id = redis.call('XADD', KEYS[1], '*', ARGV[1], ARGV[2])
  redis.call('SET', KEYS[2], id, 'KEEPTTL')
  return 1
end
return 0
"""


def new_req_id(cell: str = DEFAULT_CELL) -> str:
    """An unguessable id placed in `cell`: it names the token stream, which anyone holding the id can
    read, and the cell whose requests stream and keys the request uses."""
    return placed_req_id(cell, secrets.token_hex(16))


def request_entry(request: GenerateRequest) -> dict[Any, Any]:
    return {FIELD: encode(request)}


def submit(r: redis.Redis, request: GenerateRequest) -> str:
    """Append `request` to the requests stream of its cell (from its id); returns its req_id. No trim:
    the active batcher trims the stream by age, sparing entries still pending (docs/protocol.md)."""
    r.xadd(cell_keys(cell_of(request.req_id)).requests, request_entry(request))
    return request.req_id


async def submit_async(r: aioredis.Redis, request: GenerateRequest) -> str:
    await r.xadd(cell_keys(cell_of(request.req_id)).requests, request_entry(request))
    return request.req_id


def _submit_once_args(request: GenerateRequest) -> tuple[Any, ...]:
    keys = (cell_keys(cell_of(request.req_id)).requests, submitted_key(request.req_id))  # one slot
    return (_SUBMIT_ONCE, 2, *keys, FIELD, encode(request), SUBMITTED_TTL_S)


def submit_once(r: redis.Redis, request: GenerateRequest) -> bool:
    """Submit unless this req_id was submitted before (a retry); True when it was submitted now."""
    return bool(r.eval(*_submit_once_args(request)))


async def submit_once_async(r: aioredis.Redis, request: GenerateRequest) -> bool:
    return bool(await r.eval(*_submit_once_args(request)))


def submit_once_on(pipe: Any, request: GenerateRequest) -> None:
    """Queue `submit_once` on a pipeline (its reply, 1 or 0, among the pipeline's)."""
    pipe.eval(*_submit_once_args(request))


def abort(r: redis.Redis, req_id: str, reason: str = "abort") -> None:
    """Ask the batcher to stop `req_id`; its stream then ends without a normal finish."""
    message = encode(AbortRequest(req_id=req_id, reason=reason))
    r.xadd(cell_keys(cell_of(req_id)).inbox, {FIELD: message}, minid=min_id(), approximate=True)


async def abort_async(r: aioredis.Redis, req_id: str, reason: str = "abort") -> None:
    message = encode(AbortRequest(req_id=req_id, reason=reason))
    await r.xadd(cell_keys(cell_of(req_id)).inbox, {FIELD: message}, minid=min_id(), approximate=True)


def _entries(reply: Any) -> list[tuple[str, dict[bytes, bytes]]]:
    # RESP2 answers [[stream, [(id, fields), ...]]], RESP3 {stream: [[(id, fields), ...]]}; [] on timeout.
    streams = reply.values() if isinstance(reply, dict) else [raw for _, raw in reply or []]
    out = []
    for raw in streams:
        entries = raw[0] if raw and isinstance(raw[0], list) else raw
        for raw_id, fields in entries:
            out.append((raw_id.decode() if isinstance(raw_id, bytes) else str(raw_id), fields))
    return out


def _accepted(
    r: redis.Redis, req_id: str, last_id: str, timeout_s: float | None
) -> Iterator[tuple[str, TokenEvent | PromptEvent | PoolingEvent]]:
    """(entry id, event) for each event of the stream after `last_id` that the reader rules keep,
    for as long as the caller reads; RequestTimedOut after `timeout_s`."""
    key = token_stream(req_id)
    event_filter = EventFilter(next_index=0 if last_id == "0-0" else None)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        block_ms = _block_ms(req_id, deadline)
        # Bounded BLOCK: redis-py retries a timed-out blocking read for a long time.
        for entry_id, fields in _entries(r.xread({key: last_id}, count=_READ_COUNT, block=block_ms)):
            last_id = entry_id
            event = accept_entry(event_filter, req_id, entry_id, fields)
            if event is not None:
                yield entry_id, event


def follow_entries(
    r: redis.Redis, req_id: str, *, last_id: str = "0-0", timeout_s: float | None = None
) -> Iterator[tuple[str, TokenEvent]]:
    """(entry id, token) for each token the reader rules keep, after `last_id`, until the last one.

    An entry id can be passed back as `last_id` to resume after it. Raises RequestFailed when the
    request fails and RequestTimedOut when it has not finished after `timeout_s`.
    """
    for entry_id, event in _accepted(r, req_id, last_id, timeout_s):
        if isinstance(event, PoolingEvent) or (isinstance(event, PromptEvent) and event.finish_reason):
            return  # the request generates nothing (max_tokens 0, or a pooling request)
        if not isinstance(event, TokenEvent):
            continue  # prompt logprobs: these readers follow tokens only
        yield entry_id, event
        if event.finish_reason is not None:
            return


def wait_pooled(
    r: redis.Redis, req_id: str, *, last_id: str = "0-0", timeout_s: float | None = None
) -> PoolingEvent:
    """A pooling request's result: the `PoolingEvent` that ends its stream. Raises RequestFailed when
    the request fails and RequestTimedOut when it has not finished after `timeout_s`."""
    for _, event in _accepted(r, req_id, last_id, timeout_s):
        if isinstance(event, PoolingEvent):
            return event
    raise AssertionError("unreachable: the stream is read until an event ends it")


def _block_ms(req_id: str, deadline: float | None) -> int:
    """How long the next read may block: MAX_BLOCK_MS, or what is left before `deadline`."""
    if deadline is None:
        return MAX_BLOCK_MS
    remaining_ms = int((deadline - time.monotonic()) * 1000)
    if remaining_ms <= 0:
        raise RequestTimedOut(req_id)
    return max(1, min(MAX_BLOCK_MS, remaining_ms))


def follow(
    r: redis.Redis, req_id: str, *, last_id: str = "0-0", timeout_s: float | None = None
) -> Iterator[TokenEvent]:
    """The request's tokens in order, each once, until the one with a finish_reason."""
    for _, event in follow_entries(r, req_id, last_id=last_id, timeout_s=timeout_s):
        yield event


async def follow_async(
    r: aioredis.Redis, req_id: str, *, last_id: str = "0-0", timeout_s: float | None = None
) -> AsyncIterator[TokenEvent]:
    """`follow` for asyncio; one blocking read per request (the gateway shares one read instead)."""
    key = token_stream(req_id)
    event_filter = EventFilter(next_index=0 if last_id == "0-0" else None)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        block_ms = _block_ms(req_id, deadline)
        for entry_id, fields in _entries(await r.xread({key: last_id}, count=_READ_COUNT, block=block_ms)):
            last_id = entry_id
            event = accept_entry(event_filter, req_id, entry_id, fields)
            if isinstance(event, PoolingEvent) or (
                isinstance(event, PromptEvent) and event.finish_reason is not None
            ):
                return
            if not isinstance(event, TokenEvent):
                continue
            yield event
            if event.finish_reason is not None:
                return
