"""A generation streamed as SSE: one event per text delta, its id the token stream entry id.

Takes the n requests of an n-choice response (see `request_builder.fan_out`); with one choice, each
SSE event's id is the token stream entry id, so a client can resume. With several, the events of
different token streams interleave and no id could name a resume point: they carry none. The
non-streaming answer is `openai_frontend/follow/collect.py`.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import aclosing

import redis.exceptions

from common.redis_conn import entry_key
from gateway.streaming.sse import DONE, KEEPALIVE, sse_event
from openai_frontend.completions.endpoint import ChunkFormatter, usage
from openai_frontend.follow.fanout import merged_outputs
from openai_frontend.follow.request_follower import FollowPolicy, RequestFollower
from openai_frontend.follow.token_stream import RequestFailed, RequestTimedOut
from openai_frontend.generate.request import PreparedRequest
from openai_frontend.protocol.errors import OpenAIError, from_request_error, timed_out_error


def _unavailable() -> OpenAIError:
    return OpenAIError(503, "the request queue became unavailable", type="server_error")


async def stream_sse(
    follower: RequestFollower,
    requests: Sequence[PreparedRequest],
    formatter: ChunkFormatter,
    follow: FollowPolicy | None = None,
    resume_after: str | None = None,
    keepalive_s: float = 0.0,
) -> AsyncIterator[bytes]:
    """SSE body: opening chunks, one chunk per delta (id = its token event), usage, then [DONE].

    Failures become an `{"error": ...}` event, since the 200 status has already been sent. On client
    disconnect Starlette cancels this generator; `outputs` then aborts the request without awaiting
    (or after the resume grace, per `follow`). With `resume_after` (a Last-Event-ID) the stream is
    replayed from its start through the same formatter, and only the events after that id are sent.
    While nothing is sent for `keepalive_s` (queued, a slow step, Redis away) a keep-alive comment is:
    the outputs come back empty at least once a second while the request waits.
    """
    num_output_tokens = [0] * len(requests)
    num_cached_tokens = [0] * len(requests)
    resumable = len(requests) == 1
    after = None if resume_after is None else entry_key(resume_after)

    def is_new(entry_id: str | None) -> bool:
        return after is None or entry_id is None or entry_key(entry_id) > after

    try:
        if after is None:
            for data in formatter.opening():
                yield sse_event(data)
        sent_at = time.monotonic()
        async with aclosing(merged_outputs(follower, requests, follow)) as outputs:
            async for index, out in outputs:
                if out is not None:
                    num_output_tokens[index] = out.num_output_tokens
                    num_cached_tokens[index] = out.num_cached_tokens
                    chunk = formatter.delta(index, out)  # always: the formatter keeps state (logprob offsets)
                    if chunk is not None and is_new(out.entry_id):
                        yield sse_event(chunk, out.entry_id if resumable else None)
                        sent_at = time.monotonic()
                        continue
                if keepalive_s and time.monotonic() - sent_at >= keepalive_s:
                    yield KEEPALIVE
                    sent_at = time.monotonic()
        if requests[0].include_usage:
            yield sse_event(formatter.usage(usage(requests, num_output_tokens, num_cached_tokens)))
    except RequestFailed as exc:
        if is_new(exc.entry_id):
            yield sse_event(json.dumps(from_request_error(exc.error).body()), exc.entry_id)
    except RequestTimedOut:
        yield sse_event(json.dumps(timed_out_error().body()))
    except redis.exceptions.RedisError:
        yield sse_event(json.dumps(_unavailable().body()))
    yield DONE
