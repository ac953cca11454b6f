"""The Responses API: POST /v1/responses, GET / DELETE /v1/responses/{id}, POST .../{id}/cancel.

A response runs as one chat request (openai_frontend/responses/input.py) and is kept in Redis
(openai_frontend/responses/store.py) unless `store` is false. A foreground response lives as long as
its client's connection; a `background` one runs on by itself, is fetched by id, cancelled, or its
event stream replayed and resumed with `starting_after`. Only the API key that created a response can read it;
any other gets 404, as for an unknown id.
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse

from gateway.api.prepared_body import PreparedBodyRoute
from gateway.app_state import GatewayState, State
from gateway.generation.admission import admitted
from gateway.generation.flow import request_id_header
from gateway.prepare_pool import body_size
from gateway.security.auth import request_owner
from gateway.streaming.sse_stream import sse_response
from openai_frontend.follow.collect import collect
from openai_frontend.follow.request_follower import FollowPolicy
from openai_frontend.generate.request import PreparedRequest
from openai_frontend.generate.request_meta import kept
from openai_frontend.protocol.errors import OpenAIError, invalid_request
from openai_frontend.protocol.openai_schemas import ChatMessage
from openai_frontend.responses.follower import BACKGROUND, WATCHER, initial_status
from openai_frontend.responses.input import (
    chat_request,
    check_unsupported,
    input_messages,
    message_of,
    responses_names,
    turn_of,
)
from openai_frontend.responses.items import answer_turn, cut_call, output_items
from openai_frontend.responses.objects import response_body
from openai_frontend.responses.schemas import TERMINAL, ResponseObject, ResponsesRequest
from openai_frontend.responses.store import ResponseParams, ResponseResult, StoredResponse
from openai_frontend.responses.text import format_echo

router = APIRouter(route_class=PreparedBodyRoute)


def _not_found(response_id: str) -> OpenAIError:
    return OpenAIError(404, f"no response {response_id!r} (unknown, expired, or not yours)", code="not_found")


async def _owned(response_id: str, http_request: Request, state: GatewayState) -> StoredResponse:
    stored = await state.responses.store.get(request_owner(http_request), response_id)
    if stored is None:
        raise _not_found(response_id)
    return stored


async def _history(body: ResponsesRequest, http_request: Request, state: GatewayState) -> list[ChatMessage]:
    """The previous response's conversation and its answer: where this turn starts."""
    if body.previous_response_id is None:
        return []
    previous = await state.responses.store.get(request_owner(http_request), body.previous_response_id)
    if previous is None:
        raise OpenAIError(
            404,
            f"previous response {body.previous_response_id!r} not found (unknown, expired, or not yours)",
            param="previous_response_id",
            code="previous_response_not_found",
        )
    previous = await state.responses.settle(previous)
    if previous.status not in ("completed", "incomplete") or previous.result is None:
        raise invalid_request(
            f"previous response {body.previous_response_id!r} is {previous.status}; only a finished "
            "response can be continued",
            "previous_response_id",
        )
    answer = answer_turn(output_items(previous.params.request, previous.result.text))
    if cut_call(answer):
        raise invalid_request(
            f"previous response {body.previous_response_id!r} was cut by max_output_tokens inside a "
            "function call, whose arguments are incomplete; it cannot be continued",
            "previous_response_id",
        )
    return [message_of(t) for t in [*previous.params.conversation, answer]]


def _response_params(
    body: ResponsesRequest, request: PreparedRequest, conversation: list[ChatMessage]
) -> ResponseParams:
    return ResponseParams(
        request=kept(request),
        background=bool(body.background),
        instructions=body.instructions,
        previous_response_id=body.previous_response_id,
        max_output_tokens=body.max_output_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        metadata=body.metadata or {},
        user=body.user,
        conversation=[turn_of(m) for m in conversation],
        text_format=None if body.text is None else format_echo(body.text.format),
        tools=body.tools,
        tool_choice=body.tool_choice,
        parallel_tool_calls=body.parallel_tool_calls,
    )


@router.post("/v1/responses", response_model=ResponseObject)
async def create_response(
    body: ResponsesRequest, http_request: Request, state: State
) -> JSONResponse | StreamingResponse:
    check_unsupported(body)
    history = await _history(body, http_request, state)
    # A history is stored, not in the body: then the body's size does not measure the prompt.
    num_bytes = None if history else body_size(http_request)
    conversation = history + await state.prepare.run(num_bytes, input_messages, body, history)
    with responses_names():
        chat = await state.prepare.run(num_bytes, chat_request, body, conversation)
        # Counted by the queue bound until written: the stored record comes first.
        async with admitted(chat, http_request, state, num_bytes) as [request]:
            params = _response_params(body, request, conversation)
            persist = body.store is not False
            stored = StoredResponse(params, initial_status(params), None)
            if persist:
                # The request's lifetime, then the retention window (cut to that window when it ends).
                ttl_s = int(state.settings.request_timeout_s) + state.settings.retention_s
                await state.responses.store.create(params, stored.status, ttl_s)
            await state.follower.submit(request)
    headers = request_id_header(request.req_id)
    # A background response outlives its client; a foreground one is cancelled when its client leaves.
    follow = BACKGROUND if params.background else FollowPolicy()
    if body.stream:
        keepalive_s = state.settings.sse_keepalive_s
        return sse_response(state.responses.events(stored, follow, persist, keepalive_s=keepalive_s), headers)
    if params.background:
        state.responses.follow_in_background(stored)
        return JSONResponse(response_body(stored), headers=headers)
    done = await collect(state.follower, [request], http_request, follow)
    ended = await state.responses.finished(stored, done[0], persist)
    return JSONResponse(response_body(ended, store=persist), headers=headers)


@router.get("/v1/responses/{response_id}", response_model=ResponseObject)
async def retrieve_response(
    response_id: str,
    http_request: Request,
    state: State,
    stream: bool = False,
    starting_after: int | None = None,
) -> JSONResponse | StreamingResponse:
    """The response as it stands; with `stream=true`, its events replayed (after `starting_after`)
    and followed to the end. Leaving that stream never cancels the response."""
    if any(http_request.query_params.getlist(name) for name in ("include", "include[]")):
        raise invalid_request("include is not supported by this server", "include", "unsupported_parameter")
    stored = await _owned(response_id, http_request, state)
    req_id = stored.params.request.req_id
    if stream:
        if stored.status in TERMINAL and not await state.responses.store.has_started(req_id):
            raise OpenAIError(
                409,
                "this response's event stream has expired; fetch it without stream",
                code="stream_expired",
            )
        keepalive_s = state.settings.sse_keepalive_s
        events = state.responses.events(
            stored, WATCHER, keepalive_s=keepalive_s, starting_after=starting_after
        )
        return sse_response(events, request_id_header(req_id))
    stored = await state.responses.settle(stored)
    return JSONResponse(response_body(stored), headers=request_id_header(req_id))


@router.post("/v1/responses/{response_id}/cancel", response_model=ResponseObject)
async def cancel_response(response_id: str, http_request: Request, state: State) -> JSONResponse:
    """Stops a background response; one that already ended is answered as it is (idempotent)."""
    stored = await _owned(response_id, http_request, state)
    if not stored.params.background:
        raise invalid_request("only background responses can be cancelled", "response_id")
    stored = await state.responses.settle(stored)
    if stored.status not in TERMINAL:
        result = ResponseResult(completed_at=int(time.time()))
        stored = await state.responses.end(stored, "cancelled", result, persist=True)
        state.follower.abort_later(stored.params.request.req_id, "abort")
    return JSONResponse(response_body(stored), headers=request_id_header(stored.params.request.req_id))


@router.delete("/v1/responses/{response_id}")
async def delete_response(response_id: str, http_request: Request, state: State) -> dict[str, Any]:
    """Forgets the response; one still running is stopped, since nobody could read it any more."""
    stored = await _owned(response_id, http_request, state)
    await state.responses.store.delete(stored)
    if stored.status not in TERMINAL:
        state.follower.abort_later(stored.params.request.req_id, "abort")
    return {"id": stored.params.id, "object": "response", "deleted": True}
