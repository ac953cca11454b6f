"""vLLM's tokenizer endpoints: POST /tokenize, POST /detokenize, GET /tokenizer_info (at the root,
where vLLM serves them and lm-eval's remote tokenizer looks for them)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body
from pydantic import ValidationError
from starlette.requests import Request

from gateway.api.prepared_body import PreparedBodyRoute
from gateway.app_state import State
from gateway.prepare_pool import body_size
from openai_frontend.generate.tokenize import detokenize, tokenize, tokenizer_info
from openai_frontend.model.served_model import ServedModel
from openai_frontend.protocol.errors import validation_error
from openai_frontend.protocol.tokenizer_schemas import (
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeChatRequest,
    TokenizeCompletionRequest,
    TokenizeResponse,
)

router = APIRouter(route_class=PreparedBodyRoute)


def _tokenize(body: dict[str, Any], served: ServedModel) -> TokenizeResponse:
    # Which of vLLM's two bodies it is decides the schema, so a refusal names the field at fault.
    schema = TokenizeChatRequest if "messages" in body else TokenizeCompletionRequest
    try:
        request = schema.model_validate(body)
    except ValidationError as exc:
        raise validation_error(exc.errors(), "vLLM tokenizer API") from None
    return tokenize(request, served)


@router.post("/tokenize")
async def tokenize_route(
    body: Annotated[dict[str, Any], Body()], http_request: Request, state: State
) -> TokenizeResponse:
    served = (await state.target(_model_of(body))).served  # an adapter tokenizes as its base model
    # A vision-language model's conversation may fetch and process images: off the event loop.
    num_bytes = None if served.vision is not None and "messages" in body else body_size(http_request)
    return await state.prepare.run(num_bytes, _tokenize, body, served)


@router.post("/detokenize")
async def detokenize_route(
    body: DetokenizeRequest, http_request: Request, state: State
) -> DetokenizeResponse:
    served = (await state.target(body.model)).served
    return await state.prepare.run(body_size(http_request), detokenize, body, served)


@router.get("/tokenizer_info")
async def tokenizer_info_route(state: State, model: str | None = None) -> dict[str, Any]:
    """The default model's tokenizer, or `?model=`'s."""
    return tokenizer_info((await state.target(model)).served)


def _model_of(body: dict[str, Any]) -> str | None:
    """The body's `model` where it is a string; the schema's check says what else is wrong."""
    model = body.get("model")
    return model if isinstance(model, str) else None
