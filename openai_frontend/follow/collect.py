"""A generation's answer in one piece: every choice followed to its end, for a non-streaming body.

Used by the non-streaming HTTP answer, a fetch by id and each batch line. A streamed answer is
stream_out.py's; both read the same `merged_outputs`.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Protocol

from common.protocol import PromptEvent, TokenEvent
from openai_frontend.follow.fanout import merged_outputs
from openai_frontend.follow.request_follower import FollowPolicy, Output, RequestFollower
from openai_frontend.follow.token_stream import RequestFailed, RequestTimedOut
from openai_frontend.generate.request import PreparedRequest
from openai_frontend.protocol.errors import OpenAIError, from_request_error, timed_out_error

# 499 (nginx's "client closed request"): nobody reads it, but logs show what happened.
_CLIENT_GONE = 499


class ClientConnection(Protocol):
    """Who waits for a collected answer: an HTTP request, or a batch line, whose client never leaves."""

    async def is_disconnected(self) -> bool: ...


@dataclass(slots=True)
class Completed:
    """One choice of a non-streaming answer."""

    text: str = ""
    finish_reason: str | None = None
    num_output_tokens: int = 0
    num_cached_tokens: int = 0
    token_ids: list[int] = field(default_factory=list)
    events: list[TokenEvent] = field(default_factory=list)  # for logprobs
    prompt: PromptEvent | None = None  # the prompt's logprobs, when asked (echo with logprobs)

    def add(self, out: Output) -> None:
        if out.prompt is not None:
            self.prompt = out.prompt
        self.text += out.text
        self.token_ids.extend(out.token_ids)
        self.events.extend(out.events)
        self.finish_reason = out.finish_reason
        self.num_output_tokens = out.num_output_tokens
        self.num_cached_tokens = out.num_cached_tokens


async def collect(
    follower: RequestFollower,
    requests: Sequence[PreparedRequest],
    client: ClientConnection,
    follow: FollowPolicy | None = None,
) -> list[Completed]:
    """Every choice whole; checks between reads that the client is still waiting, and aborts if not.

    A non-streaming client learns the request id only with the answer, so it cannot resume: the
    default `follow` aborts at once when it leaves. Each choice is read once, when it ended (vLLM's
    FINAL_ONLY outputs), not handed its tokens at every step.
    """
    choices = [Completed() for _ in requests]
    try:
        async with aclosing(merged_outputs(follower, requests, follow, final_only=True)) as outputs:
            async for index, out in outputs:
                if out is not None:
                    choices[index].add(out)
                # Asked after reads with nothing to show, about once a second (token_mux.py's tick),
                # not per token: each ask costs the gateway's CPU a cancel scope and a receive.
                elif await client.is_disconnected():
                    # Leaving the loop closes `outputs`, which aborts the requests.
                    raise OpenAIError(_CLIENT_GONE, "client disconnected", code="client_disconnected")
    except RequestFailed as exc:
        raise from_request_error(exc.error) from exc
    except RequestTimedOut as exc:
        raise timed_out_error() from exc
    # outputs ends only when every choice finished, or by raising
    assert all(c.finish_reason is not None for c in choices)
    return choices
