"""GET /v1/requests/{id}/stream (resume a stream) and GET /v1/requests/{id} (fetch a result).

Both replay the request's token stream from its start through the same code as the first answer, so
the text, its split into chunks and the final chunk are identical. Only the API key that created
the request can read it; any other gets 404, as for an unknown id, so ids cannot be probed. With no
keys configured, the unguessable id itself is the capability.
"""

from __future__ import annotations

import re

from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse

from common.redis_io.redis_conn import entry_key
from common.streams import token_stream
from gateway.app_state import GatewayState, State
from gateway.generation.flow import request_id_header
from gateway.security.auth import request_owner
from gateway.streaming.sse_stream import sse_response
from openai_frontend.completions.endpoints import ENDPOINTS
from openai_frontend.completions.logprobs import LogprobsFormatter
from openai_frontend.completions.stream import ChunkStream
from openai_frontend.follow.collect import collect
from openai_frontend.follow.request_follower import FollowPolicy
from openai_frontend.follow.stream_out import stream_out
from openai_frontend.generate.request import PreparedRequest, req_id_from
from openai_frontend.generate.request_meta import attach, load_meta
from openai_frontend.protocol.errors import OpenAIError

router = APIRouter()

# A fetch replays what the token stream holds; a request not finished within this is answered 409.
_FETCH_WAIT_S = 1.0


def _not_found(request_id: str) -> OpenAIError:
    return OpenAIError(404, f"no request {request_id!r} (unknown, expired, or not yours)", code="not_found")


async def _owned_request(request_id: str, http_request: Request, state: GatewayState) -> PreparedRequest:
    request = await load_meta(state.redis, req_id_from(request_id))
    if request is None or request.message.owner != request_owner(http_request):
        raise _not_found(request_id)
    return request


# An event id as the gateway sends it: a Redis stream entry id, ASCII digits only (int() alone would
# also take "1_0", "+1" or " 1", which replayed the whole stream).
_EVENT_ID = re.compile(r"[0-9]{1,20}-[0-9]{1,20}")


async def _last_event_id(http_request: Request, state: GatewayState, req_id: str) -> str | None:
    """The Last-Event-ID to resume after, which must be an event of this request's stream: an id past
    its end (or never sent) is a 400, not an empty replay that looks like a finished stream."""
    value = http_request.headers.get("last-event-id") or http_request.query_params.get("last_event_id")
    if not value:
        return None
    if _EVENT_ID.fullmatch(value) is None or not await state.redis.xrange(
        token_stream(req_id), value, value, count=1
    ):
        raise OpenAIError(
            400, f"Last-Event-ID {value!r} is not an event id of this stream", param="last_event_id"
        )
    return value


@router.get("/v1/requests/{request_id}/stream")
async def resume_stream(request_id: str, http_request: Request, state: State) -> StreamingResponse:
    """The events after Last-Event-ID (header, or `?last_event_id=`), or the whole stream without it."""
    request = await _owned_request(request_id, http_request, state)
    resume_after = await _last_event_id(http_request, state, request.req_id)
    logprobs = LogprobsFormatter(state.follower.tokenizer(request).tokenizer)
    chunks = ENDPOINTS[request.kind].chunks(
        request.response_id, request.created, request.model, request, logprobs
    )
    # Counted for operators and tests; following renews the request's follow deadline, which keeps it alive.
    await attach(state.redis, request.req_id)
    if request.resumable:
        follow = FollowPolicy(grace_s=state.settings.resume_grace_s, track=False)
    else:
        # Its life stays its first client's connection: another follower watches, and leaving
        # neither aborts it nor keeps it alive.
        follow = FollowPolicy(may_abort=False, track=False)
    events = stream_out(
        ChunkStream(chunks, [request]),
        state.follower,
        [request],
        follow,
        keepalive_s=state.settings.sse_keepalive_s,
        resume_after=None if resume_after is None else entry_key(resume_after),
    )
    return sse_response(events, request_id_header(request.req_id))


@router.get("/v1/requests/{request_id}")
async def fetch_result(request_id: str, http_request: Request, state: State) -> JSONResponse:
    """The finished request's non-streaming response object; 409 while it is still running."""
    request = await _owned_request(request_id, http_request, state)
    logprobs = LogprobsFormatter(state.follower.tokenizer(request).tokenizer)
    follow = FollowPolicy(may_abort=False, track=False, wait_s=_FETCH_WAIT_S)
    try:
        done = await collect(state.follower, [request], http_request, follow)
    except OpenAIError as exc:
        if exc.code != "timeout":
            raise
        message = "the request is still running; resume its stream or fetch it again later"
        raise OpenAIError(409, message, code="request_running") from exc
    body = ENDPOINTS[request.kind].body(
        [request], done, request.response_id, request.created, request.model, logprobs
    )
    return JSONResponse(body, headers=request_id_header(request.req_id))
