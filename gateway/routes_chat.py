"""POST /v1/chat/completions."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any

from fastapi import APIRouter, Depends
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse

from gateway.admission import admit
from gateway.logprobs import LogprobsFormatter
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
from gateway.request_builder import PreparedRequest
from gateway.request_runner import Output
from gateway.respond import respond
from gateway.state import GatewayState, get_state
from gateway.streaming import Completed, usage

router = APIRouter()


class ChatChunks:
    """Streamed chunks of /v1/chat/completions: the role first, content deltas, optional usage."""

    def __init__(
        self,
        response_id: str,
        created: int,
        model: str,
        request: PreparedRequest,
        logprobs: LogprobsFormatter,
    ) -> None:
        self._id, self._created, self._model = response_id, created, model
        self._request = request
        self._logprobs = logprobs
        self._exclude = response_exclude(
            return_token_ids=request.return_token_ids, include_usage=request.include_usage
        )

    def _chunk(self, choices: list[ChatChunkChoice], usage: UsageInfo | None = None) -> str:
        chunk = ChatCompletionChunk(
            id=self._id, created=self._created, model=self._model, choices=choices, usage=usage
        )
        return chunk.model_dump_json(exclude=self._exclude)

    def opening(self) -> list[str]:
        return [
            self._chunk([ChatChunkChoice(index=i, delta={"role": "assistant", "content": ""})])
            for i in range(self._request.n)
        ]

    def delta(self, index: int, out: Output) -> str:
        delta = {"content": out.text} if out.text else {}
        logprobs = self._logprobs.chat(out.events) if self._request.logprobs else None
        choice = ChatChunkChoice(
            index=index,
            delta=delta,
            logprobs=logprobs,
            finish_reason=out.finish_reason,
            token_ids=out.token_ids,
        )
        return self._chunk([choice])

    def usage(self, usage: UsageInfo) -> str:
        return self._chunk([], usage)


@router.post("/v1/chat/completions", response_model=ChatCompletionResponse)
async def create_chat_completion(
    body: ChatCompletionRequest, http_request: Request, state: Annotated[GatewayState, Depends(get_state)]
) -> JSONResponse | StreamingResponse:
    requests = await admit(body, http_request, state)
    return await respond("chat", requests, http_request, state, ChatChunks, chat_response)


def chat_response(
    requests: Sequence[PreparedRequest],
    done: list[Completed],
    response_id: str,
    created: int,
    model: str,
    formatter: LogprobsFormatter,
) -> dict[str, Any]:
    """The non-streaming body (also what a fetch by id returns)."""
    request = requests[0]
    choices = [
        ChatChoice(
            index=i,
            message=AssistantMessage(content=c.text),
            logprobs=formatter.chat(c.events) if request.logprobs else None,
            finish_reason=c.finish_reason,
            token_ids=c.token_ids,
        )
        for i, c in enumerate(done)
    ]
    response = ChatCompletionResponse(
        id=response_id,
        created=created,
        model=model,
        choices=choices,
        usage=usage(requests, [c.num_output_tokens for c in done]),
    )
    return response.model_dump(exclude=response_exclude(return_token_ids=request.return_token_ids))
