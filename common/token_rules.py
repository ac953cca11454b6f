"""The reader rules of a token stream, shared by every client (gateway, stream client, Celery).

A token stream has one writer at a time, but a recomputed request (preemption, failover) starts a new
`attempt` that streams again from where the last one stopped; readers keep each output index once,
from the newest attempt, and stop at the first finish. See docs/protocol.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from common.protocol import FIELD, PoolingEvent, PromptEvent, RequestError, TokenEvent, decode_event


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
    """One writer per token stream is enforced by readers: stale attempts, repeated indexes and
    indexes past a gap drop out.

    A gap is a late write: after a failover that lost the stream's last entries, the old writer's
    retried publish can land an index the stream no longer leads up to. The new attempt recomputes
    from the stream's unbroken run, so it writes the missing index and the rest again, in order.
    """

    # The output index the next token must have; None for a reader that starts after an entry id
    # (a resume), which takes the first token's index as where it is.
    next_index: int | None = 0
    attempt: int = -1  # newest attempt seen

    def accept(self, event: TokenEvent | PromptEvent | PoolingEvent) -> bool:
        if event.attempt < self.attempt:
            return False
        if isinstance(event, PromptEvent | PoolingEvent):
            if self.next_index:  # it comes before any token: too late once one was kept
                return False
        elif self.next_index is not None and event.index != self.next_index:
            return False
        else:
            self.next_index = event.index + 1
        self.attempt = event.attempt
        return True


def decode_message(
    req_id: str, message: bytes | None
) -> TokenEvent | PromptEvent | PoolingEvent | RequestError:
    """One token stream entry's message (its `m` field, None if it has none); an unreadable one reads
    as the error it is."""
    if message is None:
        return RequestError(req_id=req_id, message="unreadable token stream entry: no message field")
    try:
        return decode_event(message)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        return RequestError(req_id=req_id, message=f"unreadable token stream entry: {exc}")


def accept_entry(
    event_filter: EventFilter, req_id: str, entry_id: str, fields: dict[bytes, bytes]
) -> TokenEvent | PromptEvent | PoolingEvent | None:
    """`accept_message` of the entry's message."""
    return accept_message(event_filter, req_id, entry_id, fields.get(FIELD))


def accept_message(
    event_filter: EventFilter, req_id: str, entry_id: str, message: bytes | None
) -> TokenEvent | PromptEvent | PoolingEvent | None:
    """The entry's token if the reader rules keep it, None if they drop it.

    Raises RequestFailed on a RequestError, and on a finish the server chose ("abort", "error"), which a
    client must never take for a normal end.
    """
    event = decode_message(req_id, message)
    if isinstance(event, RequestError):
        raise RequestFailed(event, entry_id)
    if not event_filter.accept(event):
        return None
    if isinstance(event, PoolingEvent):
        return event  # a pooling request's one result: it always ends the stream
    if event.finish_reason in ("abort", "error"):
        why = f"request ended by the server ({event.finish_reason})"
        raise RequestFailed(RequestError(req_id=req_id, message=why), entry_id)
    return event
