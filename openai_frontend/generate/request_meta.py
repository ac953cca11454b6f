"""What a gateway needs to render a request's stream again, stored in Redis at submit time.

Any gateway can then resume the stream (`GET /v1/requests/{id}/stream`) or answer a fetch by id with
chunks identical to the first gateway's: same kind, id, `created`, model name, stop strings, and the
prompt's last tokens (all the incremental detokenizer looks at). The hash also holds `attach`, a
counter bumped by every resuming client, for operators and tests; what keeps a resumed request alive
is its follow deadline (openai_frontend/follow/deadlines.py).
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec
import redis.asyncio as aioredis

from common.protocol import SamplingParams
from common.streams import request_meta
from openai_frontend.generate.request_builder import PreparedRequest
from openai_frontend.text.detokenizer import NUM_CONTEXT_TOKENS

Kind = Literal["completion", "chat"]
_ID_PREFIX: dict[Kind, str] = {"completion": "cmpl-", "chat": "chatcmpl-"}
_META, _ATTACH = b"m", b"attach"


class RequestMeta(msgspec.Struct, kw_only=True, frozen=True):
    req_id: str
    kind: Kind  # which endpoint created it: the shape of its chunks and response
    model: str  # the served model name the chunks show
    created: int  # unix seconds, as in the chunks
    owner: str  # name of the API key that created it ("" when the API is open)
    arrival_time: float  # unix seconds; the request timeout counts from here
    prompt_tail: list[int]  # the prompt's last tokens: left context for the detokenizer
    num_prompt_tokens: int  # for usage
    stop: list[str]  # stop strings, matched again when the stream is replayed
    stream: bool  # how the client asked for it
    include_usage: bool
    return_token_ids: bool
    logprobs: bool
    echo_text: str | None = None  # completions with echo: the text each choice starts with
    resumable: bool = False  # its client asked that it outlive a disconnect (the resume window)
    tool_parser: str | None = None  # chat with tools: tool calls are read back from the text
    max_tool_calls: int | None = None

    @property
    def response_id(self) -> str:
        return response_id(self.kind, self.req_id)


def response_id(kind: Kind, req_id: str) -> str:
    """The OpenAI object's `id` (`cmpl-<req_id>` / `chatcmpl-<req_id>`)."""
    return _ID_PREFIX[kind] + req_id


def req_id_from(any_id: str) -> str:
    """Accepts the bare request id (`X-Request-Id`) or the OpenAI object's `id`."""
    for prefix in _ID_PREFIX.values():
        if any_id.startswith(prefix):
            return any_id[len(prefix) :]
    return any_id


def meta_of(request: PreparedRequest, kind: Kind, model: str) -> RequestMeta:
    return RequestMeta(
        req_id=request.req_id,
        kind=kind,
        model=model,
        created=int(request.arrival_time),
        owner=request.owner,
        arrival_time=request.arrival_time,
        prompt_tail=request.prompt_token_ids[-NUM_CONTEXT_TOKENS:],
        num_prompt_tokens=len(request.prompt_token_ids),
        stop=request.stop,
        stream=request.stream,
        include_usage=request.include_usage,
        return_token_ids=request.return_token_ids,
        logprobs=request.logprobs,
        echo_text=request.echo_text,
        resumable=request.resumable,
        tool_parser=request.tool_parser,
        max_tool_calls=request.max_tool_calls,
    )


def prepared_from(meta: RequestMeta) -> PreparedRequest:
    """The PreparedRequest the chunk formatters and the runner need (sampling params are not kept)."""
    return PreparedRequest(
        req_id=meta.req_id,
        prompt_token_ids=meta.prompt_tail,
        sampling_params=SamplingParams(),
        stop=meta.stop,
        arrival_time=meta.arrival_time,
        stream=meta.stream,
        include_usage=meta.include_usage,
        return_token_ids=meta.return_token_ids,
        logprobs=meta.logprobs,
        echo_text=meta.echo_text,
        resumable=meta.resumable,
        owner=meta.owner,
        full_prompt_len=meta.num_prompt_tokens,
        tool_parser=meta.tool_parser,
        max_tool_calls=meta.max_tool_calls,
    )


def save_meta(pipe: Any, meta: RequestMeta, ttl_s: int) -> None:
    """Queue the writes on `pipe` (the submit pipeline), so the hash exists before the request does."""
    key = request_meta(meta.req_id)
    pipe.hset(key, mapping={_META: msgspec.msgpack.encode(meta), _ATTACH: 0})
    pipe.expire(key, ttl_s)


async def load_meta(redis: aioredis.Redis, req_id: str) -> RequestMeta | None:
    raw = await redis.hget(request_meta(req_id), _META)
    if raw is None:
        return None
    assert isinstance(raw, bytes)  # connect_async leaves replies undecoded
    return msgspec.msgpack.decode(raw, type=RequestMeta)


async def attach(redis: aioredis.Redis, req_id: str) -> int:
    """Count a resuming client in; returns the count so far."""
    return int(await redis.hincrby(request_meta(req_id), _ATTACH, 1))
