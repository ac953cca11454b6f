"""POST /v1/chat/completions."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse

from gateway.api.generation import generate
from gateway.app_state import GatewayState, get_state
from openai_frontend.chat_response import CHAT
from openai_frontend.openai_schemas import ChatCompletionRequest, ChatCompletionResponse

router = APIRouter()


@router.post("/v1/chat/completions", response_model=ChatCompletionResponse)
async def create_chat_completion(
    body: ChatCompletionRequest, http_request: Request, state: Annotated[GatewayState, Depends(get_state)]
) -> JSONResponse | StreamingResponse:
    return await generate(CHAT, body, http_request, state)
