"""A message followed to its end as Anthropic's stream events (events.py), from the request follower."""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator
from contextlib import aclosing

import redis.exceptions

from openai_frontend.anthropic.events import Event, MessageEvents, error_event, event
from openai_frontend.anthropic.message import stop_sequence
from openai_frontend.follow.collect import Completed
from openai_frontend.follow.request_follower import FollowPolicy, RequestFollower
from openai_frontend.follow.token_stream import RequestFailed, RequestTimedOut
from openai_frontend.generate.request import PreparedRequest
from openai_frontend.model.tokenizer import ModelTokenizer
from openai_frontend.protocol.errors import OpenAIError, from_request_error, timed_out_error


async def message_events(
    follower: RequestFollower,
    request: PreparedRequest,
    tokenizer: ModelTokenizer,
    follow: FollowPolicy,
    keepalive_s: float = 0.0,
) -> AsyncGenerator[Event, None]:
    """Every event of the message; while nothing is sent for `keepalive_s` (queued, a slow step),
    a `ping` is, as Anthropic keeps its own streams alive. Leaving early aborts the request (`follow`)."""
    events = MessageEvents(request)
    for opening in events.opening():
        yield opening
    done = Completed()
    sent_at = time.monotonic()
    try:
        async with aclosing(follower.outputs(request, follow)) as outputs:
            async for out in outputs:
                if out is not None:
                    done.add(out)
                    for delta in events.delta(out.text):
                        yield delta
                        sent_at = time.monotonic()
                if keepalive_s and time.monotonic() - sent_at >= keepalive_s:
                    yield event("ping")
                    sent_at = time.monotonic()
    except RequestFailed as exc:
        yield error_event(from_request_error(exc.error))
        return
    except RequestTimedOut:
        yield error_event(timed_out_error())
        return
    except redis.exceptions.RedisError:
        yield error_event(OpenAIError(503, "the request queue became unavailable", type="server_error"))
        return
    matched = stop_sequence(request, done, tokenizer)
    for closing in events.closing(done.finish_reason, matched, done.num_output_tokens):
        yield closing
