"""POST /v1/completions."""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Depends
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse

from gateway.openai_schemas import (
    CompletionChoice,
    CompletionRequest,
    CompletionResponse,
    UsageInfo,
    response_exclude,
)
from gateway.request_builder import PreparedRequest, prepare_request
from gateway.state import GatewayState, get_state
from gateway.streaming import collect, stream_sse

router = APIRouter()

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class CompletionChunks:
    """Streamed chunks of /v1/completions: text deltas, then an optional usage chunk."""

    def __init__(self, response_id: str, created: int, model: str, request: PreparedRequest) -> None:
        self._id, self._created, self._model = response_id, created, model
        self._exclude = response_exclude(
            return_token_ids=request.return_token_ids, include_usage=request.include_usage
        )

    def _chunk(self, choices: list[CompletionChoice], usage: UsageInfo | None = None) -> str:
        chunk = CompletionResponse(
            id=self._id, created=self._created, model=self._model, choices=choices, usage=usage
        )
        return chunk.model_dump_json(exclude=self._exclude)

    def opening(self) -> list[str]:
        return []

    def delta(self, text: str, finish_reason: str | None, token_ids: list[int]) -> str:
        return self._chunk([CompletionChoice(text=text, finish_reason=finish_reason, token_ids=token_ids)])

    def usage(self, usage: UsageInfo) -> str:
        return self._chunk([], usage)


@router.post("/v1/completions", response_model=CompletionResponse)
async def create_completion(
    body: CompletionRequest, http_request: Request, state: Annotated[GatewayState, Depends(get_state)]
) -> JSONResponse | StreamingResponse:
    arrival_time = time.time()
    request = prepare_request(body, state.served, arrival_time)
    await state.runner.submit(request)
    response_id, created = f"cmpl-{request.req_id}", int(arrival_time)
    if request.stream:
        chunks = CompletionChunks(response_id, created, state.served.name, request)
        return StreamingResponse(
            stream_sse(state.runner, request, chunks), media_type="text/event-stream", headers=SSE_HEADERS
        )
    done = await collect(state.runner, request, http_request)
    response = CompletionResponse(
        id=response_id,
        created=created,
        model=state.served.name,
        choices=[
            CompletionChoice(text=done.text, finish_reason=done.finish_reason, token_ids=done.token_ids)
        ],
        usage=done.usage,
    )
    return JSONResponse(
        response.model_dump(exclude=response_exclude(return_token_ids=request.return_token_ids))
    )
