"""GET /v1/models, GET /v1/models/{id} and GET (or HEAD) /health."""

from __future__ import annotations

import asyncio
import time
from typing import Annotated

import redis.exceptions
from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse

from common.streams import cell_keys
from gateway.api.error_handlers import REDIS_RETRY_AFTER_S
from gateway.app_state import GatewayState, get_state
from openai_frontend.generate.validation import check_model
from openai_frontend.model.served_model import ServedModel
from openai_frontend.protocol.openai_schemas import ModelCard, ModelList

router = APIRouter()

# A health probe must answer quickly even when Redis hangs.
_HEALTH_REDIS_TIMEOUT_S = 2.0


def _card(served: ServedModel) -> ModelCard:
    # `root` names the model, never the directory it was loaded from (that is the operator's business).
    return ModelCard(
        id=served.name, created=served.created, root=served.name, max_model_len=served.max_model_len
    )


@router.get("/v1/models")
async def list_models(state: Annotated[GatewayState, Depends(get_state)]) -> ModelList:
    return ModelList(data=[_card(state.served)])


# `{model:path}`: hub-style names hold a slash (`org/model`).
@router.get("/v1/models/{model:path}")
async def retrieve_model(model: str, state: Annotated[GatewayState, Depends(get_state)]) -> ModelCard:
    """OpenAI's model object; 404 with an OpenAI error for any other id."""
    check_model(model, state.served)
    return _card(state.served)


# Load balancers often probe with HEAD: same status and headers, no body.
@router.api_route("/health", methods=["GET", "HEAD"])
async def health(state: Annotated[GatewayState, Depends(get_state)]) -> JSONResponse:
    """200 while at least one worker's heartbeat is fresh; 503 otherwise. While Redis is unreachable
    the body says "degraded": requests in flight wait for it (and go on once it is back)."""
    timeout_s = state.settings.heartbeat_timeout_s
    cutoff_ms = int((time.time() - timeout_s) * 1000)
    try:
        async with asyncio.timeout(_HEALTH_REDIS_TIMEOUT_S):
            num_alive = 0
            await state.router.refresh(state.redis)
            for cell in state.router.cells:  # the workers of every cell it places in
                num_alive += int(await state.redis.zcount(cell_keys(cell).heartbeat, f"({cutoff_ms}", "+inf"))
    except (redis.exceptions.RedisError, TimeoutError) as exc:
        message = f"degraded: redis unreachable ({exc or type(exc).__name__})"
        headers = {"Retry-After": REDIS_RETRY_AFTER_S}
        return JSONResponse({"status": "degraded", "message": message}, status_code=503, headers=headers)
    if num_alive == 0:
        message = f"no worker heartbeat in the last {timeout_s:g} s"
        return JSONResponse({"status": "unavailable", "message": message}, status_code=503)
    return JSONResponse({"status": "ok", "num_workers": num_alive})
