"""GET /v1/models, GET /v1/models/{id} and GET (or HEAD) /health.

Every base model served, then every LoRA adapter loaded, in vLLM's ModelCard shape: an adapter's card
has its base model as `parent` and its directory as `root`, as vLLM's does.
"""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from gateway import health as gateway_health
from gateway.app_state import State
from openai_frontend.model.lora_registry import LoadedAdapter
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


def _adapter_card(adapter: LoadedAdapter, base: ServedModel) -> ModelCard:
    return ModelCard(
        id=adapter.lora_request.lora_name,
        created=adapter.created,
        root=adapter.lora_request.lora_path,
        parent=base.rules.name,
        max_model_len=base.rules.max_model_len,  # its base model's context
    )


@router.get("/v1/models")
async def list_models(state: State) -> ModelList:
    cards = [_card(served) for served in state.models.models]
    for adapter in await state.adapters.listing():
        base = state.models.find(adapter.base_model_name)
        if base is not None:  # an adapter of a model this gateway does not serve is not its to list
            cards.append(_adapter_card(adapter, base))
    return ModelList(data=cards)


# `{model:path}`: hub-style names hold a slash (`org/model`).
@router.get("/v1/models/{model:path}")
async def retrieve_model(model: str, state: State) -> ModelCard:
    """OpenAI's model object; 404 with an OpenAI error for any other id."""
    target = await state.target(model)
    if target.lora_request is None:
        return _card(target.served)
    adapter = await state.adapters.get(target.lora_request.lora_name)
    assert adapter is not None  # the target was just read from it
    return _adapter_card(adapter, target.served)


# Load balancers often probe with HEAD: same status and headers, no body.
@router.api_route("/health", methods=["GET", "HEAD"])
async def health(state: State) -> JSONResponse:
    """200 while requests can be served; 503 naming what is missing (gateway/health.py). While Redis
    is unreachable the body says "degraded": requests in flight wait for it (and go on once it is back)."""
    result = await gateway_health.check(state)
    return JSONResponse(result.body, status_code=result.status_code, headers=result.headers)
