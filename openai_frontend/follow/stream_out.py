"""Every streamed answer, of any API surface: a request followed to its end as that surface's events.

One loop for chat and completions chunks, Responses events and Anthropic's Messages events (and a
resumed stream): each surface only encodes (an `Encoder`: its opening, one step's deltas, its end, its
error event and its keep-alive). The loop maps a failure to the surface's error event (the 200 status
is sent already), sends a keep-alive while nothing else is sent for `keepalive_s` (queued, a slow
step, Redis away: the outputs come back empty at least once a second while the request waits), and
on a resume sends only the events after the client's last one. The gateway writes the events as SSE
(gateway/streaming/sse_stream.py); a non-streaming answer is collect.py's.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator, Iterable, Sequence
from contextlib import aclosing
from dataclasses import dataclass

import redis.exceptions

from openai_frontend.follow.fanout import merged_outputs
from openai_frontend.follow.request_follower import FollowPolicy, Output, RequestFollower
from openai_frontend.follow.token_stream import RequestFailed, RequestTimedOut
from openai_frontend.generate.request import PreparedRequest
from openai_frontend.protocol.errors import (
    OpenAIError,
    from_request_error,
    queue_unavailable,
    timed_out_error,
)

# Where an event stands in its stream, for a resume: a token stream entry id's (ms, seq), or a
# Responses event's sequence number.
Position = tuple[int, ...]


@dataclass(slots=True, frozen=True)
class StreamEvent:
    """One event as SSE sends it, or a comment line (a keep-alive) that clients skip."""

    data: str = ""  # JSON text (or OpenAI's `[DONE]`)
    type: str | None = None  # SSE `event:`; Responses and Anthropic name theirs, OpenAI's chunks none
    id: str | None = None  # SSE `id:`: a token stream entry a client can resume after (Last-Event-ID)
    position: Position | None = None  # a resumed stream sends it only past the client's; None: always
    comment: str | None = None  # not an event: a comment line with this text


# A comment line alone, while a stream has nothing else to say (Anthropic's streams send `ping`).
KEEPALIVE = StreamEvent(comment="keep-alive")


class Encoder(ABC):
    """One API surface's events of one streamed answer, built as its outputs arrive."""

    keepalive: StreamEvent = KEEPALIVE

    @abstractmethod
    def opening(self) -> list[StreamEvent]:
        """Before any output."""

    @abstractmethod
    def delta(self, index: int, out: Output) -> list[StreamEvent]:
        """What choice `index`'s output adds (called for every output: encoders keep state)."""

    @abstractmethod
    async def closing(self) -> list[StreamEvent]:
        """After the last output: what the answer's end says (usage, a stop reason, the final object)."""

    @abstractmethod
    def error(self, error: OpenAIError) -> list[StreamEvent]:
        """The stream stops without an end: a timeout, Redis gone, or (by default) a failed request."""

    async def failed(self, exc: RequestFailed) -> list[StreamEvent]:
        return self.error(from_request_error(exc.error))

    def end(self) -> list[StreamEvent]:
        """The very last events, after an end or an error alike."""
        return []


async def stream_out(
    encoder: Encoder,
    follower: RequestFollower,
    requests: Sequence[PreparedRequest],
    follow: FollowPolicy | None = None,
    *,
    keepalive_s: float = 0.0,
    resume_after: Position | None = None,
) -> AsyncGenerator[StreamEvent, None]:
    """The events of the answer to `requests` (one per choice). Closing the generator (the client went
    away) closes the outputs, which aborts the requests as `follow` says. With `resume_after`, only
    the events after that position are sent: the stream is replayed from its start through the same
    encoder, so the events are the ones sent the first time."""

    def new(events: Iterable[StreamEvent]) -> list[StreamEvent]:
        return [e for e in events if resume_after is None or e.position is None or e.position > resume_after]

    for event in new(encoder.opening()):
        yield event
    sent_at = time.monotonic()
    try:
        async with aclosing(merged_outputs(follower, requests, follow)) as outputs:
            async for index, out in outputs:
                events = [] if out is None else new(encoder.delta(index, out))
                for event in events:
                    yield event
                if events:
                    sent_at = time.monotonic()
                elif keepalive_s and time.monotonic() - sent_at >= keepalive_s:
                    yield encoder.keepalive
                    sent_at = time.monotonic()
        ending = await encoder.closing()
    except RequestFailed as exc:
        ending = await encoder.failed(exc)
    except RequestTimedOut:
        ending = encoder.error(timed_out_error())
    except redis.exceptions.RedisError:
        ending = encoder.error(queue_unavailable())
    for event in new([*ending, *encoder.end()]):
        yield event
