"""The two ways to answer a generation: one SSE event per text delta, or one body at the end.

Both take the n requests of an n-choice response (see `request_builder.fan_out`); with one choice,
each SSE event's id is the token stream entry id, so a client can resume. With several, the events
of different token streams interleave and no id could name a resume point: they carry none.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Protocol

import redis.exceptions

from common.protocol import TokenEvent
from common.redis_conn import entry_key
from gateway.errors import OpenAIError, from_request_error
from gateway.fanout import merged_outputs
from gateway.openai_schemas import UsageInfo
from gateway.request_builder import PreparedRequest
from gateway.request_runner import Follow, Output, RequestRunner
from gateway.sse import DONE, sse_event
from gateway.stream_reader import RequestFailed, RequestTimedOut

# 499 (nginx's "client closed request"): nobody reads it, but logs show what happened.
_CLIENT_GONE = 499


class ClientConnection(Protocol):
    """Who waits for a collected answer: an HTTP request, or a batch line, whose client never leaves."""

    async def is_disconnected(self) -> bool: ...


class ChunkFormatter(Protocol):
    """Builds the JSON of each streamed chunk for one endpoint (completions or chat)."""

    def opening(self) -> list[str]: ...

    def delta(self, index: int, out: Output) -> str: ...

    def usage(self, usage: UsageInfo) -> str: ...


@dataclass(slots=True)
class Completed:
    """One choice of a non-streaming answer."""

    text: str = ""
    finish_reason: str | None = None
    num_output_tokens: int = 0
    token_ids: list[int] = field(default_factory=list)
    events: list[TokenEvent] = field(default_factory=list)  # for logprobs


def usage(requests: Sequence[PreparedRequest], num_output_tokens: Sequence[int]) -> UsageInfo:
    """The prompt is counted once, however many choices share it (as OpenAI counts n > 1)."""
    num_prompt_tokens = requests[0].num_prompt_tokens
    completion_tokens = sum(num_output_tokens)
    return UsageInfo(
        prompt_tokens=num_prompt_tokens,
        completion_tokens=completion_tokens,
        total_tokens=num_prompt_tokens + completion_tokens,
    )


def _timed_out() -> OpenAIError:
    return OpenAIError(504, "the request did not finish in time", type="server_error", code="timeout")


def _unavailable() -> OpenAIError:
    return OpenAIError(503, "the request queue became unavailable", type="server_error")


async def stream_sse(
    runner: RequestRunner,
    requests: Sequence[PreparedRequest],
    formatter: ChunkFormatter,
    follow: Follow | None = None,
    resume_after: str | None = None,
) -> AsyncIterator[bytes]:
    """SSE body: opening chunks, one chunk per delta (id = its token event), usage, then [DONE].

    Failures become an `{"error": ...}` event, since the 200 status has already been sent. On client
    disconnect Starlette cancels this generator; `outputs` then aborts the request without awaiting
    (or after the resume grace, per `follow`). With `resume_after` (a Last-Event-ID) the stream is
    replayed from its start through the same formatter, and only the events after that id are sent.
    """
    num_output_tokens = [0] * len(requests)
    resumable = len(requests) == 1
    after = None if resume_after is None else entry_key(resume_after)

    def is_new(entry_id: str | None) -> bool:
        return after is None or entry_id is None or entry_key(entry_id) > after

    try:
        if after is None:
            for data in formatter.opening():
                yield sse_event(data)
        async with aclosing(merged_outputs(runner, requests, follow)) as outputs:
            async for index, out in outputs:
                if out is None:
                    continue
                num_output_tokens[index] = out.num_output_tokens
                chunk = formatter.delta(index, out)  # always: the formatter keeps state (logprob offsets)
                if is_new(out.entry_id):
                    yield sse_event(chunk, out.entry_id if resumable else None)
        if requests[0].include_usage:
            yield sse_event(formatter.usage(usage(requests, num_output_tokens)))
    except RequestFailed as exc:
        if is_new(exc.entry_id):
            yield sse_event(json.dumps(from_request_error(exc.error).body()), exc.entry_id)
    except RequestTimedOut:
        yield sse_event(json.dumps(_timed_out().body()))
    except redis.exceptions.RedisError:
        yield sse_event(json.dumps(_unavailable().body()))
    yield DONE


async def collect(
    runner: RequestRunner,
    requests: Sequence[PreparedRequest],
    client: ClientConnection,
    follow: Follow | None = None,
) -> list[Completed]:
    """Every choice whole; checks between reads that the client is still waiting, and aborts if not.

    A non-streaming client learns the request id only with the answer, so it cannot resume: the
    default `follow` aborts at once when it leaves.
    """
    choices = [Completed() for _ in requests]
    try:
        async with aclosing(merged_outputs(runner, requests, follow)) as outputs:
            async for index, out in outputs:
                if await client.is_disconnected():
                    # Leaving the loop closes `outputs`, which aborts the requests.
                    raise OpenAIError(_CLIENT_GONE, "client disconnected", code="client_disconnected")
                if out is None:
                    continue
                choice = choices[index]
                choice.text += out.text
                choice.token_ids.extend(out.token_ids)
                choice.events.extend(out.events)
                choice.finish_reason = out.finish_reason
                choice.num_output_tokens = out.num_output_tokens
    except RequestFailed as exc:
        raise from_request_error(exc.error) from exc
    except RequestTimedOut as exc:
        raise _timed_out() from exc
    # outputs ends only when every choice finished, or by raising
    assert all(c.finish_reason is not None for c in choices)
    return choices
