"""vLLM's tokenizer endpoints: POST /tokenize, POST /detokenize, GET /tokenizer_info (at the root,
where vLLM serves them and lm-eval's remote tokenizer looks for them)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body
from pydantic import ValidationError

from gateway.app_state import State
from openai_frontend.generate.tokenize import detokenize, tokenize, tokenizer_info
from openai_frontend.protocol.errors import validation_error
from openai_frontend.protocol.tokenizer_schemas import (
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeChatRequest,
    TokenizeCompletionRequest,
    TokenizeResponse,
)

router = APIRouter()


@router.post("/tokenize")
async def tokenize_route(body: Annotated[dict[str, Any], Body()], state: State) -> TokenizeResponse:
    # Which of vLLM's two bodies it is decides the schema, so a refusal names the field at fault.
    schema = TokenizeChatRequest if "messages" in body else TokenizeCompletionRequest
    try:
        request = schema.model_validate(body)
    except ValidationError as exc:
        raise validation_error(exc.errors(), "vLLM tokenizer API") from None
    return tokenize(request, state.served)


@router.post("/detokenize")
async def detokenize_route(body: DetokenizeRequest, state: State) -> DetokenizeResponse:
    return detokenize(body, state.served)


@router.get("/tokenizer_info")
async def tokenizer_info_route(state: State) -> dict[str, Any]:
    return tokenizer_info(state.served)
