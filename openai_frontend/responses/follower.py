"""Runs Responses API responses on the request follower and keeps their end in the response store.

A response is one chat-shaped request (responses_input.py). Its events come from following the
request's token stream (`events`); whoever reaches the end records it (`ResponseStore.finish`). A
background response nobody follows is recorded by the first read that finds its stream ended
(`settle`), which replays the stream through the same code.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass, field

import redis.exceptions

from openai_frontend.follow.collect import Completed
from openai_frontend.follow.request_follower import FollowPolicy, RequestFollower
from openai_frontend.follow.token_stream import RequestFailed, RequestTimedOut
from openai_frontend.protocol.errors import OpenAIError, timed_out_error
from openai_frontend.reasoning.usage import num_reasoning_tokens
from openai_frontend.responses.objects import (
    Event,
    ResponseEvents,
    result_of,
    status_of_error,
    status_of_finish,
)
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
            request.reasoning_parser, request.reasoning_open, done.token_ids, self.request_follower.token_text
        )
        result = result_of(done, int(time.time()), num_reasoning)
        return await self.end(stored, status_of_finish(done.finish_reason), result, persist)

    async def events(
        self, stored: StoredResponse, follow: FollowPolicy, persist: bool = True
    ) -> AsyncGenerator[Event | None, None]:
        """Every event of the response from its start, following its token stream to the end; None
        after a read that brought nothing to show (about once a second while the request waits), so
        that a stream can send keep-alives."""
        events = ResponseEvents(
            StoredResponse(stored.params, initial_status(stored.params), None), store=persist
        )
        for event in events.opening():
            yield event
        done = Completed()
        request = stored.params.request
        try:
            async with aclosing(self.request_follower.outputs(request, follow)) as outputs:
                async for out in outputs:
                    if out is None:
                        yield None
                        continue
                    done.add(out)
                    if out.text:
                        for event in events.delta(out.text):
                            yield event
        except RequestFailed as exc:
            result = ResponseResult(completed_at=int(time.time()), error=exc.error)
            yield events.failed(await self.end(stored, status_of_error(exc.error.code), result, persist))
            return
        except RequestTimedOut:
            yield events.error(timed_out_error())
            return
        except redis.exceptions.RedisError:
            yield events.error(OpenAIError(503, "the request queue became unavailable", type="server_error"))
            return
        for event in events.end():
            yield event
        ended = await self.finished(stored, done, persist)
        if ended.status in ("completed", "incomplete"):
            for event in events.closing(ended):
                yield event
        else:  # cancelled while its last tokens were read
            yield events.failed(ended)

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
