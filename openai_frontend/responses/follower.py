"""Follows Responses API responses on the request follower and keeps their end in the response store.

A response is one chat-shaped request (responses/input.py). Its events come from following the
request's token stream through the one stream-out (follow/stream_out.py) with `ResponseStream` as
the encoder; whoever reaches the end records it (`ResponseStore.finish`). A background response
nobody follows is recorded by the first read that finds its stream ended (`settle`), which replays
the stream through the same code.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import time
from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass, field

from openai_frontend.follow.collect import Completed
from openai_frontend.follow.request_follower import FollowPolicy, Output, RequestFollower
from openai_frontend.follow.stream_out import Encoder, StreamEvent, stream_out
from openai_frontend.follow.token_stream import RequestFailed
from openai_frontend.protocol.errors import OpenAIError
from openai_frontend.reasoning.usage import num_reasoning_tokens
from openai_frontend.responses.objects import ResponseEvents, result_of, status_of_error, status_of_finish
from openai_frontend.responses.schemas import TERMINAL, ResponseStatus
from openai_frontend.responses.store import ResponseParams, ResponseResult, ResponseStore, StoredResponse

# A read that finds the stream ended replays it; this bounds that replay.
SETTLE_WAIT_S = 5.0
# How a background response is followed: leaving never aborts it, a stop string still does.
BACKGROUND = FollowPolicy(leave_running=True)
# How a later reader follows any response: the same, and not counted again in the metrics.
WATCHER = FollowPolicy(leave_running=True, track=False)


def initial_status(params: ResponseParams) -> ResponseStatus:
    return "queued" if params.background else "in_progress"


@dataclass(slots=True)
class ResponseFollower:
    request_follower: RequestFollower
    store: ResponseStore
    retention_s: int  # a finished response stays this long (CBSERVE_RETENTION_S)
    _followers: set[asyncio.Task[None]] = field(default_factory=set)

    def follow_in_background(self, stored: StoredResponse) -> None:
        """Follow a background response nobody streams, so that a stop string stops it at once and
        its end is recorded as it happens (if this gateway goes away, `settle` still records it)."""
        task = asyncio.get_running_loop().create_task(self._drain(stored, BACKGROUND))
        self._followers.add(task)
        task.add_done_callback(self._followers.discard)

    async def _drain(self, stored: StoredResponse, follow: FollowPolicy) -> None:
        async with aclosing(self.events(stored, follow)) as events:
            async for _ in events:
                pass

    async def close(self) -> None:
        """Stop following (the responses run on; a later read records their end)."""
        for task in self._followers:
            task.cancel()
        if self._followers:
            await asyncio.wait(set(self._followers), timeout=5.0)

    async def end(
        self, stored: StoredResponse, status: ResponseStatus, result: ResponseResult, persist: bool
    ) -> StoredResponse:
        """Record how the response ended; the record's first end wins (a cancel, a completion)."""
        if not persist:
            return StoredResponse(stored.params, status, result)
        return await self.store.finish(stored, status, result, self.retention_s)

    async def finished(self, stored: StoredResponse, done: Completed, persist: bool) -> StoredResponse:
        request = stored.params.request
        num_reasoning = num_reasoning_tokens(
            request.reasoning_parser,
            request.reasoning_open,
            done.token_ids,
            functools.partial(self.request_follower.token_text, request),
        )
        result = result_of(done, int(time.time()), num_reasoning)
        return await self.end(stored, status_of_finish(done.finish_reason), result, persist)

    def events(
        self,
        stored: StoredResponse,
        follow: FollowPolicy,
        persist: bool = True,
        *,
        keepalive_s: float = 0.0,
        starting_after: int | None = None,
    ) -> AsyncGenerator[StreamEvent, None]:
        """Every event of the response from its start (after `starting_after`), following its token
        stream to the end."""
        encoder = ResponseStream(self, stored, persist)
        return stream_out(
            encoder,
            self.request_follower,
            [stored.params.request],
            follow,
            keepalive_s=keepalive_s,
            resume_after=None if starting_after is None else (starting_after,),
        )

    async def settle(self, stored: StoredResponse) -> StoredResponse:
        """The response as it stands: a request that ended is recorded now if nobody did yet."""
        if stored.status in TERMINAL:
            return stored
        req_id = stored.params.request.req_id
        if not await self.store.has_ended(req_id):
            started = await self.store.has_started(req_id)
            return StoredResponse(stored.params, "in_progress" if started else stored.status, None)
        await self._drain(stored, dataclasses.replace(WATCHER, wait_s=SETTLE_WAIT_S))
        return await self.store.get(stored.params.request.message.owner, stored.params.id) or stored


class ResponseStream(Encoder):
    """A response's events (objects.py), and its end recorded as the stream reaches it."""

    def __init__(self, responses: ResponseFollower, stored: StoredResponse, persist: bool) -> None:
        self._responses = responses
        self._stored = stored
        self._persist = persist
        self._events = ResponseEvents(
            StoredResponse(stored.params, initial_status(stored.params), None), store=persist
        )
        self._done = Completed()

    def opening(self) -> list[StreamEvent]:
        return self._events.opening()

    def delta(self, index: int, out: Output) -> list[StreamEvent]:
        self._done.add(out)
        return self._events.delta(out.text) if out.text else []

    async def closing(self) -> list[StreamEvent]:
        held_back = self._events.finish()
        ended = await self._responses.finished(self._stored, self._done, self._persist)
        if ended.status in ("completed", "incomplete"):
            return [*held_back, *self._events.closing(ended)]
        return [*held_back, self._events.failed(ended)]  # cancelled while its last tokens were read

    async def failed(self, exc: RequestFailed) -> list[StreamEvent]:
        result = ResponseResult(completed_at=int(time.time()), error=exc.error)
        status = status_of_error(exc.error.code)
        return [self._events.failed(await self._responses.end(self._stored, status, result, self._persist))]

    def error(self, error: OpenAIError) -> list[StreamEvent]:
        """The stream stops without an end (a timeout, Redis gone): the response may still finish."""
        return [self._events.error(error)]
