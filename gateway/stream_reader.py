"""Follows one request's token stream in Redis, dropping duplicate and stale-attempt events."""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

import msgspec
import redis.asyncio as aioredis

from common.protocol import FIELD, RequestError, TokenEvent, decode_event
from common.redis_conn import MAX_BLOCK_MS
from common.streams import token_stream

# Entries fetched per XREAD; a burst larger than this is simply read in several calls.
_READ_COUNT = 256


class RequestFailed(Exception):
    """The token stream ended with a RequestError (or held something unreadable)."""

    def __init__(self, error: RequestError, entry_id: str | None = None) -> None:
        super().__init__(error.message)
        self.error = error
        self.entry_id = entry_id


class RequestTimedOut(Exception):
    """The request did not finish before its deadline."""


@dataclass(slots=True)
class EventFilter:
    """One writer per token stream is enforced by readers: stale attempts and repeated indexes drop out."""

    next_index: int = 0  # output index the next new token must have at least
    attempt: int = -1  # newest attempt seen

    def accept(self, event: TokenEvent) -> bool:
        if event.attempt < self.attempt or event.index < self.next_index:
            return False
        self.attempt = event.attempt
        self.next_index = event.index + 1
        return True


def _entries(reply: Any) -> list[tuple[bytes, dict[bytes, bytes]]]:
    # connect_async speaks RESP2, where XREAD answers [[stream, [(id, fields), ...]]] (or [] on timeout).
    return [entry for _, entries in reply or [] for entry in entries]


async def follow_token_stream(
    redis: aioredis.Redis, req_id: str, *, deadline: float, last_id: str = "0-0"
) -> AsyncGenerator[list[tuple[str, TokenEvent]], None]:
    """Yield the new token events of each XREAD (possibly none, about once a second) until the last one.

    Empty batches give the caller a regular chance to notice that its client went away. Raises
    RequestFailed on a RequestError event and RequestTimedOut past `deadline` (time.monotonic()).
    """
    key = token_stream(req_id)
    event_filter = EventFilter()
    while True:
        remaining_ms = int((deadline - time.monotonic()) * 1000)
        if remaining_ms <= 0:
            raise RequestTimedOut(req_id)
        # Bounded BLOCK: redis-py retries a timed-out blocking read for a long time, so never block long.
        reply = await redis.xread({key: last_id}, count=_READ_COUNT, block=min(MAX_BLOCK_MS, remaining_ms))
        batch: list[tuple[str, TokenEvent]] = []
        for raw_id, fields in _entries(reply):
            entry_id = raw_id.decode() if isinstance(raw_id, bytes) else str(raw_id)
            last_id = entry_id
            event = _decode(req_id, fields)
            if isinstance(event, RequestError):
                raise RequestFailed(event, entry_id)
            if not event_filter.accept(event):
                continue
            if event.finish_reason in ("abort", "error"):
                # Never a normal finish for a client: the batcher ended the request for its own reasons.
                raise RequestFailed(
                    RequestError(
                        req_id=req_id, message=f"request ended by the server ({event.finish_reason})"
                    ),
                    entry_id,
                )
            batch.append((entry_id, event))
            if event.finish_reason is not None:
                yield batch
                return
        yield batch


def _decode(req_id: str, fields: dict[bytes, bytes]) -> TokenEvent | RequestError:
    try:
        return decode_event(fields[FIELD])
    except (KeyError, msgspec.DecodeError, msgspec.ValidationError) as exc:
        return RequestError(req_id=req_id, message=f"unreadable token stream entry: {exc}")
