"""The flow both generation routes share: admit the body, then stream SSE chunks or answer one body.

Each route (routes_generation.py) names only its schema and its answer shapes
(`openai_frontend.completions.chat.CHAT`, `openai_frontend.completions.completion.COMPLETION`).
"""

from __future__ import annotations

from collections.abc import Sequence

from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse

from gateway.app_state import GatewayState
from gateway.generation.admission import admit
from gateway.generation.stored import save, storing
from gateway.streaming.sse_stream import sse_response
from openai_frontend.completions.endpoint import Endpoint
from openai_frontend.completions.logprobs import LogprobsFormatter
from openai_frontend.completions.stream import ChunkStream
from openai_frontend.follow.collect import collect
from openai_frontend.follow.request_follower import FollowPolicy
from openai_frontend.follow.stream_out import stream_out
from openai_frontend.generate.request import PreparedRequest
from openai_frontend.protocol.openai_schemas import ChatCompletionRequest, CompletionRequest


def request_id_header(req_id: str) -> dict[str, str]:
    """Every answer names its request, so a client can resume it (GET /v1/requests/{id}/stream)."""
    return {"X-Request-Id": req_id}


def client_follow(requests: Sequence[PreparedRequest], resume_grace_s: float) -> FollowPolicy:
    """A client that goes away cancels its request at once (as OpenAI and vLLM do), unless it asked
    for `resumable`: then the request runs on for the resume window. Only a single choice can be
    resumed (n > 1 streams carry no event ids)."""
    resumable = len(requests) == 1 and requests[0].resumable
    return FollowPolicy(grace_s=resume_grace_s if resumable else 0.0)


async def generate(
    endpoint: Endpoint,
    body: CompletionRequest | ChatCompletionRequest,
    http_request: Request,
    state: GatewayState,
) -> JSONResponse | StreamingResponse:
    requests = await admit(body, http_request, state)
    request = requests[0]
    rid, created = request.response_id, request.created
    formatter = LogprobsFormatter(state.follower.tokenizer(request).tokenizer)
    headers = request_id_header(request.req_id)
    follow = client_follow(requests, state.settings.resume_grace_s)
    if request.stream:
        chunks = endpoint.chunks(rid, created, request.model, request, formatter, requests)
        keepalive_s = state.settings.sse_keepalive_s
        events = stream_out(
            ChunkStream(chunks, requests), state.follower, requests, follow, keepalive_s=keepalive_s
        )
        if request.store and isinstance(body, ChatCompletionRequest):
            events = storing(events, state, http_request, body, requests)
        return sse_response(events, headers)
    done = await collect(state.follower, requests, http_request, follow)
    answer = endpoint.body(requests, done, rid, created, request.model, formatter)
    if request.store and isinstance(body, ChatCompletionRequest):
        await save(state, http_request, body, answer)
    return JSONResponse(answer, headers=headers)
