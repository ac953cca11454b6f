"""The two ways to answer a generation: one SSE event per text delta, or one body at the end."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass
from typing import Protocol

import redis.exceptions
from starlette.requests import Request

from gateway.errors import OpenAIError, from_request_error
from gateway.openai_schemas import UsageInfo
from gateway.request_builder import PreparedRequest
from gateway.request_runner import RequestRunner
from gateway.sse import DONE, sse_event
from gateway.stream_reader import RequestFailed, RequestTimedOut

# 499 (nginx's "client closed request"): nobody reads it, but logs show what happened.
_CLIENT_GONE = 499


class ChunkFormatter(Protocol):
    """Builds the JSON of each streamed chunk for one endpoint (completions or chat)."""

    def opening(self) -> list[str]: ...

    def delta(self, text: str, finish_reason: str | None, token_ids: list[int]) -> str: ...

    def usage(self, usage: UsageInfo) -> str: ...


@dataclass(slots=True, frozen=True)
class Completed:
    text: str
    finish_reason: str
    usage: UsageInfo
    token_ids: list[int]


def _usage(request: PreparedRequest, num_output_tokens: int) -> UsageInfo:
    num_prompt_tokens = len(request.prompt_token_ids)
    return UsageInfo(
        prompt_tokens=num_prompt_tokens,
        completion_tokens=num_output_tokens,
        total_tokens=num_prompt_tokens + num_output_tokens,
    )


def _timed_out() -> OpenAIError:
    return OpenAIError(504, "the request did not finish in time", type="server_error", code="timeout")


def _unavailable() -> OpenAIError:
    return OpenAIError(503, "the request queue became unavailable", type="server_error")


async def stream_sse(
    runner: RequestRunner, request: PreparedRequest, formatter: ChunkFormatter
) -> AsyncIterator[bytes]:
    """SSE body: opening chunks, one chunk per delta (id = its token event), usage, then [DONE].

    Failures become an `{"error": ...}` event, since the 200 status has already been sent. On client
    disconnect Starlette cancels this generator; `outputs` then aborts the request without awaiting.
    """
    num_output_tokens = 0
    try:
        for data in formatter.opening():
            yield sse_event(data)
        async with aclosing(runner.outputs(request)) as outputs:
            async for out in outputs:
                if out is None:
                    continue
                num_output_tokens = out.num_output_tokens
                yield sse_event(formatter.delta(out.text, out.finish_reason, out.token_ids), out.entry_id)
        if request.include_usage:
            yield sse_event(formatter.usage(_usage(request, num_output_tokens)))
    except RequestFailed as exc:
        yield sse_event(json.dumps(from_request_error(exc.error).body()), exc.entry_id)
    except RequestTimedOut:
        yield sse_event(json.dumps(_timed_out().body()))
    except redis.exceptions.RedisError:
        yield sse_event(json.dumps(_unavailable().body()))
    yield DONE


async def collect(runner: RequestRunner, request: PreparedRequest, http_request: Request) -> Completed:
    """The whole answer; checks between reads that the client is still waiting, and aborts if not."""
    parts: list[str] = []
    token_ids: list[int] = []
    finish_reason: str | None = None
    num_output_tokens = 0
    try:
        async with aclosing(runner.outputs(request)) as outputs:
            async for out in outputs:
                if await http_request.is_disconnected():
                    # Leaving the loop closes `outputs`, which aborts the request.
                    raise OpenAIError(_CLIENT_GONE, "client disconnected", code="client_disconnected")
                if out is None:
                    continue
                parts.append(out.text)
                token_ids.extend(out.token_ids)
                finish_reason = out.finish_reason
                num_output_tokens = out.num_output_tokens
    except RequestFailed as exc:
        raise from_request_error(exc.error) from exc
    except RequestTimedOut as exc:
        raise _timed_out() from exc
    assert finish_reason is not None  # outputs ends only on a finish or by raising
    return Completed("".join(parts), finish_reason, _usage(request, num_output_tokens), token_ids)
