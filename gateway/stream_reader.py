"""Follows one request's token stream in Redis, dropping duplicate and stale-attempt events."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass

import msgspec

from common.protocol import FIELD, RequestError, TokenEvent, decode_event
from common.redis_conn import MAX_BLOCK_MS
from gateway.token_mux import TokenStreamMux


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


async def follow_token_stream(
    mux: TokenStreamMux, req_id: str, *, deadline: float, last_id: str = "0-0"
) -> AsyncGenerator[list[tuple[str, TokenEvent]], None]:
    """Yield the new token events of each read (possibly none, about once a second) until the last one.

    Empty batches give the caller a regular chance to notice that its client went away. Raises
    RequestFailed on a RequestError event and RequestTimedOut past `deadline` (time.monotonic()).
    While Redis is unreachable the shared read retries and this keeps yielding empty batches.
    """
    event_filter = EventFilter()
    sub = await mux.subscribe(req_id, last_id)
    try:
        while True:
            remaining_s = deadline - time.monotonic()
            if remaining_s <= 0:
                raise RequestTimedOut(req_id)
            try:
                item = await asyncio.wait_for(sub.queue.get(), timeout=min(MAX_BLOCK_MS / 1000, remaining_s))
            except TimeoutError:
                yield []
                continue
            batch: list[tuple[str, TokenEvent]] = []
            for entry_id, fields in item:
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
    finally:
        mux.unsubscribe(sub)


def _decode(req_id: str, fields: dict[bytes, bytes]) -> TokenEvent | RequestError:
    try:
        return decode_event(fields[FIELD])
    except (KeyError, msgspec.DecodeError, msgspec.ValidationError) as exc:
        return RequestError(req_id=req_id, message=f"unreadable token stream entry: {exc}")
