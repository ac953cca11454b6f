"""GET /v1/models, GET /v1/models/{id} and GET (or HEAD) /health."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from gateway import health as gateway_health
from gateway.app_state import State
from openai_frontend.generate.validation import check_model
from openai_frontend.model.served_model import ServedModel
from openai_frontend.protocol.openai_schemas import ModelCard, ModelList

router = APIRouter()


def _card(served: ServedModel) -> ModelCard:
    # `root` names the model, never the directory it was loaded from (that is the operator's business).
    return ModelCard(
        id=served.rules.name,
        created=served.created,
        root=served.rules.name,
        max_model_len=served.rules.max_model_len,
    )


@router.get("/v1/models")
async def list_models(state: State) -> ModelList:
    return ModelList(data=[_card(state.served)])


# `{model:path}`: hub-style names hold a slash (`org/model`).
@router.get("/v1/models/{model:path}")
async def retrieve_model(model: str, state: State) -> ModelCard:
    """OpenAI's model object; 404 with an OpenAI error for any other id."""
    check_model(model, state.served)
    return _card(state.served)


# Load balancers often probe with HEAD: same status and headers, no body.
@router.api_route("/health", methods=["GET", "HEAD"])
async def health(state: State) -> JSONResponse:
    """200 while requests can be served; 503 naming what is missing (gateway/health.py). While Redis
    is unreachable the body says "degraded": requests in flight wait for it (and go on once it is back)."""
    result = await gateway_health.check(state)
    return JSONResponse(result.body, status_code=result.status_code, headers=result.headers)
