"""POST /v1/chat/completions."""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Depends
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse

from gateway.openai_schemas import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    UsageInfo,
    response_exclude,
)
from gateway.request_builder import PreparedRequest, prepare_request
from gateway.routes_completions import SSE_HEADERS
from gateway.state import GatewayState, get_state
from gateway.streaming import collect, stream_sse

router = APIRouter()


class ChatChunks:
    """Streamed chunks of /v1/chat/completions: the role first, content deltas, optional usage."""

    def __init__(self, response_id: str, created: int, model: str, request: PreparedRequest) -> None:
        self._id, self._created, self._model = response_id, created, model
        self._exclude = response_exclude(
            return_token_ids=request.return_token_ids, include_usage=request.include_usage
        )

    def _chunk(self, choices: list[ChatChunkChoice], usage: UsageInfo | None = None) -> str:
        chunk = ChatCompletionChunk(
            id=self._id, created=self._created, model=self._model, choices=choices, usage=usage
        )
        return chunk.model_dump_json(exclude=self._exclude)

    def opening(self) -> list[str]:
        return [self._chunk([ChatChunkChoice(delta={"role": "assistant", "content": ""})])]

    def delta(self, text: str, finish_reason: str | None, token_ids: list[int]) -> str:
        delta = {"content": text} if text else {}
        choice = ChatChunkChoice(delta=delta, finish_reason=finish_reason, token_ids=token_ids)
        return self._chunk([choice])

    def usage(self, usage: UsageInfo) -> str:
        return self._chunk([], usage)


@router.post("/v1/chat/completions", response_model=ChatCompletionResponse)
async def create_chat_completion(
    body: ChatCompletionRequest, http_request: Request, state: Annotated[GatewayState, Depends(get_state)]
) -> JSONResponse | StreamingResponse:
    arrival_time = time.time()
    request = prepare_request(body, state.served, arrival_time)
    await state.runner.submit(request)
    response_id, created = f"chatcmpl-{request.req_id}", int(arrival_time)
    if request.stream:
        chunks = ChatChunks(response_id, created, state.served.name, request)
        return StreamingResponse(
            stream_sse(state.runner, request, chunks), media_type="text/event-stream", headers=SSE_HEADERS
        )
    done = await collect(state.runner, request, http_request)
    message = AssistantMessage(content=done.text)
    response = ChatCompletionResponse(
        id=response_id,
        created=created,
        model=state.served.name,
        choices=[ChatChoice(message=message, finish_reason=done.finish_reason, token_ids=done.token_ids)],
        usage=done.usage,
    )
    return JSONResponse(
        response.model_dump(exclude=response_exclude(return_token_ids=request.return_token_ids))
    )
