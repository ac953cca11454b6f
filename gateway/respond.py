"""The tail both generation routes share: stream SSE chunks, or collect the choices into one body."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal

from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse

from gateway.logprobs import LogprobsFormatter
from gateway.request_builder import PreparedRequest
from gateway.request_meta import response_id
from gateway.request_runner import Follow
from gateway.state import GatewayState
from gateway.streaming import ChunkFormatter, Completed, collect, stream_sse

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}

# (response id, created, model name, the first request, logprobs formatter) -> the endpoint's chunks
MakeChunks = Callable[[str, int, str, PreparedRequest, LogprobsFormatter], ChunkFormatter]
# (requests, their completions, response id, created, model name, formatter) -> the endpoint's body
BuildBody = Callable[
    [Sequence[PreparedRequest], list[Completed], str, int, str, LogprobsFormatter], dict[str, Any]
]


def request_id_header(req_id: str) -> dict[str, str]:
    """Every answer names its request, so a client can resume it (GET /v1/requests/{id}/stream)."""
    return {"X-Request-Id": req_id}


def client_follow(requests: Sequence[PreparedRequest], resume_grace_s: float) -> Follow:
    """A client that goes away cancels its request at once (as OpenAI and vLLM do), unless it asked
    for `resumable`: then the request runs on for the resume window. Only a single choice can be
    resumed (n > 1 streams carry no event ids)."""
    resumable = len(requests) == 1 and requests[0].resumable
    return Follow(grace_s=resume_grace_s if resumable else 0.0)


async def respond(
    kind: Literal["completion", "chat"],
    requests: Sequence[PreparedRequest],
    http_request: Request,
    state: GatewayState,
    make_chunks: MakeChunks,
    build_body: BuildBody,
) -> JSONResponse | StreamingResponse:
    request = requests[0]
    rid, created = response_id(kind, request.req_id), int(request.arrival_time)
    formatter = LogprobsFormatter(state.served.tokenizer.tokenizer)
    headers = request_id_header(request.req_id)
    follow = client_follow(requests, state.settings.resume_grace_s)
    if request.stream:
        chunks = make_chunks(rid, created, state.served.name, request, formatter)
        return StreamingResponse(
            stream_sse(state.runner, requests, chunks, follow),
            media_type="text/event-stream",
            headers={**SSE_HEADERS, **headers},
        )
    done = await collect(state.runner, requests, http_request, follow)
    body = build_body(requests, done, rid, created, state.served.name, formatter)
    return JSONResponse(body, headers=headers)
