"""POST /v1/completions."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse

from gateway.api.generation import generate
from gateway.app_state import GatewayState, get_state
from openai_frontend.completion_response import COMPLETION
from openai_frontend.openai_schemas import CompletionRequest, CompletionResponse

router = APIRouter()


@router.post("/v1/completions", response_model=CompletionResponse)
async def create_completion(
    body: CompletionRequest, http_request: Request, state: Annotated[GatewayState, Depends(get_state)]
) -> JSONResponse | StreamingResponse:
    return await generate(COMPLETION, body, http_request, state)
