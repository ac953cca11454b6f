"""POST /v1/completions."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any

from fastapi import APIRouter, Depends
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse

from gateway.admission import admit
from gateway.logprobs import LogprobsFormatter
from gateway.openai_schemas import (
    CompletionChoice,
    CompletionRequest,
    CompletionResponse,
    UsageInfo,
    response_exclude,
)
from gateway.request_builder import PreparedRequest
from gateway.request_runner import Output
from gateway.respond import respond
from gateway.state import GatewayState, get_state
from gateway.streaming import Completed, usage

router = APIRouter()


class CompletionChunks:
    """Streamed chunks of /v1/completions: echoed prompts, text deltas, then an optional usage chunk."""

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
        # Where each choice's next token starts in its text, for logprobs' text_offset.
        self._offsets = [len(request.echo_text or "")] * request.n

    def _chunk(self, choices: list[CompletionChoice], usage: UsageInfo | None = None) -> str:
        chunk = CompletionResponse(
            id=self._id, created=self._created, model=self._model, choices=choices, usage=usage
        )
        return chunk.model_dump_json(exclude=self._exclude)

    def opening(self) -> list[str]:
        echo = self._request.echo_text
        if not echo:
            return []
        return [self._chunk([CompletionChoice(index=i, text=echo)]) for i in range(self._request.n)]

    def delta(self, index: int, out: Output) -> str:
        logprobs = None
        if self._request.logprobs:
            logprobs, self._offsets[index] = self._logprobs.completion(out.events, self._offsets[index])
        choice = CompletionChoice(
            index=index,
            text=out.text,
            logprobs=logprobs,
            finish_reason=out.finish_reason,
            token_ids=out.token_ids,
        )
        return self._chunk([choice])

    def usage(self, usage: UsageInfo) -> str:
        return self._chunk([], usage)


@router.post("/v1/completions", response_model=CompletionResponse)
async def create_completion(
    body: CompletionRequest, http_request: Request, state: Annotated[GatewayState, Depends(get_state)]
) -> JSONResponse | StreamingResponse:
    requests = await admit(body, http_request, state)
    return await respond("completion", requests, http_request, state, CompletionChunks, completion_response)


def completion_response(
    requests: Sequence[PreparedRequest],
    done: list[Completed],
    response_id: str,
    created: int,
    model: str,
    formatter: LogprobsFormatter,
) -> dict[str, Any]:
    """The non-streaming body (also what a fetch by id returns)."""
    request = requests[0]
    echo = request.echo_text or ""
    choices = [
        CompletionChoice(
            index=i,
            text=echo + c.text,
            logprobs=formatter.completion(c.events, len(echo))[0] if request.logprobs else None,
            finish_reason=c.finish_reason,
            token_ids=c.token_ids,
        )
        for i, c in enumerate(done)
    ]
    response = CompletionResponse(
        id=response_id,
        created=created,
        model=model,
        choices=choices,
        usage=usage(requests, [c.num_output_tokens for c in done]),
    )
    return response.model_dump(exclude=response_exclude(return_token_ids=request.return_token_ids))
