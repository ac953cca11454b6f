"""Plays the worker's part of the Redis protocol for gateway tests: no batcher, no GPU.

It reads GenerateRequests from the requests stream, writes TokenEvents / RequestErrors to a request's
token stream, seeds worker heartbeats, and reads AbortRequests from the batcher's inbox, all through a
real Redis with the real message encoding.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import redis

from common.protocol import (
    FIELD,
    AbortRequest,
    FinishReason,
    GenerateRequest,
    RequestError,
    TokenEvent,
    decode_inbox,
    decode_request,
    encode,
    ends_stream,
)
from common.redis_io.ended_streams import announce_end
from common.streams import BATCHER_INBOX, REQUESTS_STREAM, WORKERS_HEARTBEAT, token_stream
from common.token_rules import decode_message

BLOCK_MS = 200


class StreamHarness:
    def __init__(self, redis_url: str) -> None:
        # Typed loosely: redis-py's sync stubs union every possible reply shape.
        self.redis: Any = redis.Redis.from_url(redis_url)
        self._last_read = {REQUESTS_STREAM: "0-0", BATCHER_INBOX: "0-0"}  # stream -> last entry id read

    def append(self, req_id: str, event: bytes) -> str:
        """XADD one encoded event to `req_id`'s token stream as a writer does (a last one announced
        as its end, in the same write); its entry id."""
        decoded = decode_message(req_id, event)  # an unreadable one ends the stream too
        pipe = self.redis.pipeline(transaction=True)
        pipe.xadd(token_stream(req_id), {FIELD: event})
        if isinstance(decoded, RequestError) or ends_stream(decoded):
            announce_end(pipe, req_id)
        return pipe.execute()[0].decode()

    def close(self) -> None:
        self.redis.close()

    def heartbeat(self, worker_id: str = "worker-0", at: float | None = None) -> None:
        """Record a heartbeat (unix ms score), now or at time `at`."""
        at_ms = int((time.time() if at is None else at) * 1000)
        self.redis.zadd(WORKERS_HEARTBEAT, {worker_id: at_ms})

    def _read_new(self, stream: str, count: int, timeout_s: float) -> Iterator[bytes]:
        """The messages of `stream`'s entries after the last one read, each marked read as it is
        yielded; waits up to `timeout_s` in all for them."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            reply = self.redis.xread({stream: self._last_read[stream]}, count=count, block=BLOCK_MS)
            for _, entries in reply or []:
                for entry_id, fields in entries:
                    self._last_read[stream] = entry_id.decode()
                    yield fields[FIELD]

    def next_request(self, timeout_s: float = 10.0) -> GenerateRequest:
        """The next GenerateRequest on the requests stream, waiting up to `timeout_s`."""
        for data in self._read_new(REQUESTS_STREAM, 1, timeout_s):
            return decode_request(data)
        raise TimeoutError("no GenerateRequest arrived")

    def num_requests(self) -> int:
        return int(self.redis.xlen(REQUESTS_STREAM))

    def emit(
        self,
        req_id: str,
        token_id: int,
        index: int,
        *,
        attempt: int = 0,
        finish_reason: FinishReason | None = None,
    ) -> str:
        """XADD one TokenEvent; returns its entry id (what the gateway must use as the SSE id)."""
        event = TokenEvent(
            req_id=req_id, index=index, token_id=token_id, attempt=attempt, finish_reason=finish_reason
        )
        return self.append(req_id, encode(event))

    def emit_tokens(
        self,
        req_id: str,
        token_ids: list[int],
        *,
        start_index: int = 0,
        attempt: int = 0,
        finish_reason: FinishReason | None = "length",
    ) -> list[str]:
        """One event per token, the last carrying `finish_reason` (None leaves the request running)."""
        ids = []
        for offset, token_id in enumerate(token_ids):
            last = offset == len(token_ids) - 1
            ids.append(
                self.emit(
                    req_id,
                    token_id,
                    start_index + offset,
                    attempt=attempt,
                    finish_reason=finish_reason if last else None,
                )
            )
        return ids

    def emit_error(self, req_id: str, message: str, code: str = "server_error") -> str:
        error = RequestError(req_id=req_id, message=message, code=code)
        return self.append(req_id, encode(error))

    def wait_abort(self, req_id: str, timeout_s: float = 10.0) -> AbortRequest:
        """The first AbortRequest for `req_id` in the batcher's inbox, waiting up to `timeout_s`."""
        for data in self._read_new(BATCHER_INBOX, 100, timeout_s):
            message = decode_inbox(data)
            if isinstance(message, AbortRequest) and message.req_id == req_id:
                return message
        raise TimeoutError(f"no AbortRequest for {req_id}")

    def aborts(self) -> list[AbortRequest]:
        """Every AbortRequest in the inbox so far (no waiting)."""
        entries = self.redis.xrange(BATCHER_INBOX)
        messages = [decode_inbox(fields[FIELD]) for _, fields in entries]
        return [m for m in messages if isinstance(m, AbortRequest)]
