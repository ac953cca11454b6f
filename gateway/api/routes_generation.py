"""POST /v1/completions and POST /v1/chat/completions: each names only its schema and its answer
shapes; the flow they share is generation.py's."""

from __future__ import annotations

from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse

from gateway.api.prepared_body import PreparedBodyRoute
from gateway.app_state import State
from gateway.generation.flow import generate
from openai_frontend.completions.chat import CHAT
from openai_frontend.completions.completion import COMPLETION
from openai_frontend.completions.schemas import ChatCompletionResponse, CompletionResponse
from openai_frontend.protocol.openai_schemas import ChatCompletionRequest, CompletionRequest

router = APIRouter(route_class=PreparedBodyRoute)


@router.post("/v1/completions", response_model=CompletionResponse)
async def create_completion(
    body: CompletionRequest, http_request: Request, state: State
) -> JSONResponse | StreamingResponse:
    return await generate(COMPLETION, body, http_request, state)


@router.post("/v1/chat/completions", response_model=ChatCompletionResponse)
async def create_chat_completion(
    body: ChatCompletionRequest, http_request: Request, state: State
) -> JSONResponse | StreamingResponse:
    return await generate(CHAT, body, http_request, state)
