"""Stored responses in Redis: what was asked, the conversation so far, the status and the result.

One hash per response (`llm:response:{req_id}`, named after the request that generates it): `spec`
(its ResponseParams, fixed at creation), `status`, and `result` once the response ended. It is one of
the request's keys (`common.streams.request_keys`), so when the request ends the batcher gives it the
retention window (CBSERVE_RETENTION_S) like the token stream; finishing the record renews that window,
so a conversation can go on as long as each turn follows the last within it. Another API key's response
answers exactly as an unknown id, as files and batches do.

The result is written by whoever first sees the request end (the client that follows it, or a later
GET that replays its token stream); a compare-and-set keeps the first terminal status, so a cancel
and a completion racing each other leave one answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec
import redis.asyncio as aioredis

from common.protocol import FIELD, PoolingEvent, RequestError, decode_event
from common.redis_io.redis_conn import as_bytes, as_str
from common.streams import response_key, token_stream
from openai_frontend.generate.request import PreparedRequest
from openai_frontend.responses.schemas import TERMINAL, ResponseStatus

# The params' hash field keeps its first name, so that responses stored before ResponseParams was
# named so still read.
_PARAMS, _STATUS, _RESULT = "spec", "status", "result"
_ID_PREFIX = "resp_"
_LAST_ENTRIES = 4  # entries of a token stream looked at for its end (see has_ended)

# Set status and result unless the response already ended. KEYS: the hash. ARGV: status, result, ttl.
_FINISH = (
    "local status = redis.call('HGET', KEYS[1], 'status')\n"
    "if not status then return 0 end\n"
    + "".join(f"if status == '{s}' then return 0 end\n" for s in TERMINAL)
    + "redis.call('HSET', KEYS[1], 'status', ARGV[1], 'result', ARGV[2])\n"
    "redis.call('EXPIRE', KEYS[1], ARGV[3])\n"
    "return 1\n"
)


class StoredCall(msgspec.Struct, frozen=True):
    """A function call the assistant made (a `function_call` item)."""

    call_id: str
    name: str
    arguments: str  # JSON text, as written


class Turn(msgspec.Struct, frozen=True):
    role: str  # user, system, assistant or tool
    content: str
    tool_calls: list[StoredCall] | None = None  # an assistant's calls
    tool_call_id: str | None = None  # a tool turn: the call it answers (a `function_call_output`)
    parts: list[dict[str, Any]] | None = None  # a message with images: chat's content parts, in order


class ResponseParams(msgspec.Struct, kw_only=True, frozen=True):
    """What the response was asked to be; never changes."""

    request: PreparedRequest  # how to replay its token stream (prompt tail, stop strings), and the owner
    background: bool
    instructions: str | None
    previous_response_id: str | None
    max_output_tokens: int | None
    temperature: float | None
    top_p: float | None
    metadata: dict[str, str]
    user: str | None
    conversation: list[Turn]  # history and this input, without instructions: the next turn's start
    text_format: dict[str, Any] | None = None  # `text.format` as echoed; None: plain text
    tools: list[dict[str, Any]] | None = None  # function tools as asked (flat), echoed
    tool_choice: str | dict[str, Any] | None = None  # as asked; None: OpenAI's default (auto)
    parallel_tool_calls: bool | None = None  # as asked; None: true

    @property
    def id(self) -> str:
        return response_id(self.request.req_id)


class ResponseResult(msgspec.Struct, kw_only=True, frozen=True):
    """How the response ended."""

    completed_at: int  # unix seconds
    text: str = ""
    num_output_tokens: int = 0
    num_cached_tokens: int = 0
    num_reasoning_tokens: int = 0  # of the output, the thoughts' (reasoning/usage.py)
    error: RequestError | None = None  # failed: why


@dataclass(slots=True, frozen=True)
class StoredResponse:
    params: ResponseParams
    status: ResponseStatus
    result: ResponseResult | None


def response_id(req_id: str) -> str:
    return _ID_PREFIX + req_id


def req_id_of(any_id: str) -> str | None:
    """The request id inside a response id; None for anything that is not one."""
    return (
        any_id[len(_ID_PREFIX) :] if any_id.startswith(_ID_PREFIX) and len(any_id) > len(_ID_PREFIX) else None
    )


class ResponseStore:
    def __init__(self, redis: aioredis.Redis) -> None:
        self._redis = redis

    async def create(self, params: ResponseParams, status: ResponseStatus, ttl_s: int) -> None:
        key = response_key(params.request.req_id)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hset(key, mapping={_PARAMS: msgspec.msgpack.encode(params), _STATUS: status})
            pipe.expire(key, ttl_s)
            await pipe.execute()

    async def get(self, owner: str, any_id: str) -> StoredResponse | None:
        """The response, or None when unknown, expired or another key's."""
        req_id = req_id_of(any_id)
        if req_id is None:
            return None
        raw_params, raw_status, raw_result = await self._redis.hmget(
            response_key(req_id), [_PARAMS, _STATUS, _RESULT]
        )
        if raw_params is None or raw_status is None:
            return None
        params = msgspec.msgpack.decode(as_bytes(raw_params), type=ResponseParams)
        if params.request.message.owner != owner:
            return None
        result = (
            None if raw_result is None else msgspec.msgpack.decode(as_bytes(raw_result), type=ResponseResult)
        )
        status: ResponseStatus = as_str(raw_status)  # type: ignore[assignment]  # written by this module only
        return StoredResponse(params, status, result)

    async def finish(
        self, stored: StoredResponse, status: ResponseStatus, result: ResponseResult, ttl_s: int
    ) -> StoredResponse:
        """Record the end (unless one is recorded already); the response as it now stands."""
        key = response_key(stored.params.request.req_id)
        written = await self._redis.eval(_FINISH, 1, key, status, msgspec.msgpack.encode(result), ttl_s)
        if written:
            return StoredResponse(stored.params, status, result)
        again = await self.get(stored.params.request.message.owner, stored.params.id)
        return again or StoredResponse(stored.params, status, result)

    async def delete(self, stored: StoredResponse) -> None:
        await self._redis.delete(response_key(stored.params.request.req_id))

    async def has_started(self, req_id: str) -> bool:
        return bool(await self._redis.exists(token_stream(req_id)))

    async def has_ended(self, req_id: str) -> bool:
        """Whether the request's token stream holds its last event (a finish or an error)."""
        # Not only the last entry: a step in flight when the request was aborted may add a token or
        # two after the batcher's RequestError.
        last: Any = await self._redis.xrevrange(token_stream(req_id), count=_LAST_ENTRIES)
        for _, fields in last:
            event = decode_event(as_bytes(fields[FIELD]))
            if isinstance(event, RequestError | PoolingEvent) or event.finish_reason is not None:
                return True
        return False
