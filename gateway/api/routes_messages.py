"""The Anthropic Messages API: POST /v1/messages and POST /v1/messages/count_tokens.

A message runs as one chat request (openai_frontend/anthropic/input.py) on the same admission,
queue, rate limit and request follower as /v1/chat/completions; its answer is the Message object or its
stream of Anthropic's events. Errors on these paths are in Anthropic's shape (gateway/errors.py), and the
API key may come as `x-api-key` (gateway/security/auth.py); `anthropic-version` and `anthropic-beta`
headers are accepted and change nothing.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import JSONResponse

from gateway.api.prepared_body import PreparedBodyRoute
from gateway.app_state import State
from gateway.generation.admission import admitted
from gateway.generation.flow import request_id_header
from gateway.prepare_pool import body_size
from gateway.streaming.sse_stream import sse_response
from openai_frontend.anthropic.input import anthropic_terms, chat_request
from openai_frontend.anthropic.message import message_body
from openai_frontend.anthropic.schemas import CountTokensRequest, MessagesRequest
from openai_frontend.anthropic.stream import MessageStream
from openai_frontend.follow.collect import collect
from openai_frontend.follow.request_follower import FollowPolicy
from openai_frontend.follow.stream_out import stream_out
from openai_frontend.generate.request_builder import prompt_ids_of
from openai_frontend.model.served_model import ServedModel

router = APIRouter(route_class=PreparedBodyRoute)


def _headers(req_id: str) -> dict[str, str]:
    # `request-id` is where Anthropic's SDKs read a response's id from (`_request_id`).
    return {**request_id_header(req_id), "request-id": req_id}


@router.post("/v1/messages")
async def create_message(body: MessagesRequest, http_request: Request, state: State) -> Any:
    num_bytes = body_size(http_request)
    with anthropic_terms():
        chat = await state.prepare.run(num_bytes, chat_request, body)
        async with admitted(chat, http_request, state, num_bytes) as [request]:
            await state.follower.submit(request)
    # A client that goes away cancels its message, as on the chat endpoint.
    follow = FollowPolicy()
    tokenizer = state.follower.tokenizer(request)
    if body.stream:
        encoder = MessageStream(request, tokenizer)
        keepalive_s = state.settings.sse_keepalive_s
        events = stream_out(encoder, state.follower, [request], follow, keepalive_s=keepalive_s)
        return sse_response(events, _headers(request.req_id))
    [done] = await collect(state.follower, [request], http_request, follow)
    return JSONResponse(message_body(request, done, tokenizer), headers=_headers(request.req_id))


def _num_prompt_tokens(body: CountTokensRequest, served: ServedModel) -> int:
    # What the chat request would queue, tools included; an adapter counts as its base model does.
    return len(prompt_ids_of(chat_request(body), served))


@router.post("/v1/messages/count_tokens")
async def count_tokens(body: CountTokensRequest, http_request: Request, state: State) -> dict[str, int]:
    """The prompt's tokens, as /v1/messages would count them in `usage.input_tokens`."""
    # Tools are checked by building their grammars (the first time importing xgrammar): off the
    # event loop whatever the size, as a large body is.
    num_bytes = None if body.tools else body_size(http_request)
    with anthropic_terms():
        served = (await state.target(body.model)).served
        if served.vision is not None:  # its images are fetched and processed: off the loop too
            num_bytes = None
        return {"input_tokens": await state.prepare.run(num_bytes, _num_prompt_tokens, body, served)}
