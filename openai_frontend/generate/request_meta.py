"""A request's record (request.py) stored in Redis at submit time, for rendering its stream again.

Any gateway can then resume the stream (`GET /v1/requests/{id}/stream`) or answer a fetch by id with
chunks identical to the first gateway's: same kind, id, `created`, model name, stop strings, and the
prompt's last tokens (all the incremental detokenizer looks at). The hash also holds `attach`, a
counter bumped by every resuming client, for operators and tests; what keeps a resumed request alive
is its follow deadline (openai_frontend/follow/deadlines.py).
"""

from __future__ import annotations

from typing import Any

import msgspec
import redis.asyncio as aioredis

from common.protocol import SamplingParams
from common.streams import request_meta
from openai_frontend.generate.request import PreparedRequest, with_message
from openai_frontend.text.detokenizer import NUM_CONTEXT_TOKENS

_META, _ATTACH = b"m", b"attach"


def kept(request: PreparedRequest) -> PreparedRequest:
    """The record as stored: the prompt's last tokens only (all the detokenizer looks at), no
    sampling params (a structured output's grammar can be large; nothing replayed needs them) and no
    images (their tensors travel on the requests stream)."""
    tail = request.message.prompt_token_ids[-NUM_CONTEXT_TOKENS:]
    return with_message(request, prompt_token_ids=tail, sampling_params=SamplingParams(), mm_features=None)


def save_meta(pipe: Any, request: PreparedRequest, ttl_s: int) -> None:
    """Queue the writes on `pipe` (the submit pipeline), so the hash exists before the request does."""
    key = request_meta(request.req_id)
    pipe.hset(key, mapping={_META: msgspec.msgpack.encode(kept(request)), _ATTACH: 0})
    pipe.expire(key, ttl_s)


async def load_meta(redis: aioredis.Redis, req_id: str) -> PreparedRequest | None:
    raw = await redis.hget(request_meta(req_id), _META)
    if raw is None:
        return None
    assert isinstance(raw, bytes)  # connect_async leaves replies undecoded
    return msgspec.msgpack.decode(raw, type=PreparedRequest)


async def attach(redis: aioredis.Redis, req_id: str) -> int:
    """Count a resuming client in; returns the count so far."""
    return int(await redis.hincrby(request_meta(req_id), _ATTACH, 1))
