"""What every route needs, created once per app in the lifespan and reached through `get_state`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import redis.asyncio as aioredis
from fastapi import Depends
from starlette.requests import Request

from common.streams import CellKeys, cell_keys
from gateway.batch_queue import BatchQueue
from gateway.cell_router import CellRouter
from gateway.limits.cell_guard import CellGuard
from gateway.limits.queue_bound import QueueBound
from gateway.limits.rate_limit import RateLimiter
from gateway.observability.metrics import GatewayMetrics
from gateway.prepare_pool import PreparePool
from gateway.settings import GatewaySettings
from openai_frontend.batch.files_store import FileStore
from openai_frontend.batch.store import BatchStore
from openai_frontend.follow.request_follower import RequestFollower
from openai_frontend.model.lora_registry import LoRARegistry
from openai_frontend.model.model_target import ModelTarget, resolve_model
from openai_frontend.model.served_models import ServedModels
from openai_frontend.responses.follower import ResponseFollower


@dataclass(slots=True, frozen=True)
class GatewayState:
    settings: GatewaySettings
    models: ServedModels  # the base models served (GATEWAY_MODEL's, or GATEWAY_MODELS_CONFIG's), by name
    adapters: LoRARegistry  # the LoRA adapters every gateway of the deployment serves, in Redis
    redis: aioredis.Redis  # the app's one client (it pools connections)
    follower: RequestFollower
    metrics: GatewayMetrics  # the gateway's own request metrics (batcher ones are read on scrape)
    rate_limiter: RateLimiter
    files: FileStore  # the Files API's files
    batches: BatchStore  # the Batch API's batches
    batch_queue: BatchQueue  # hands new batches to the Celery workers
    responses: ResponseFollower  # the Responses API's responses and their store
    routers: dict[str, CellRouter]  # per base model: which of its cells a new request goes to
    cell_guard: CellGuard  # whether that cell takes a new request now (a batcher, Redis headroom)
    queue_bound: QueueBound  # and whether its queue has room (GATEWAY_MAX_QUEUED_REQUESTS)
    prepare: PreparePool  # where a large request is parsed, templated and tokenized, off the loop

    async def target(self, requested: str | None) -> ModelTarget:
        """The base model, or LoRA adapter on one, that a request's `model` names; 404 for none."""
        return await resolve_model(self.models, self.adapters, requested)

    @property
    def cells(self) -> list[str]:
        """Every cell this gateway places requests in, the default model's first."""
        return list(dict.fromkeys(cell for router in self.routers.values() for cell in router.cells))

    def home_cell(self, model: str | None = None) -> str:
        """The cell whose batcher the dashboard and the `cbserve:` batcher metrics show for a base
        model (404 for none): with one model CBSERVE_CELL, as before; else the model's first cell."""
        served = self.models.get(model)
        if self.settings.models_config is None:
            return self.settings.cell
        return self.routers[served.rules.name].cells[0]

    def home_keys(self, model: str | None = None) -> CellKeys:
        return cell_keys(self.home_cell(model))


def get_state(request: Request) -> GatewayState:
    state = request.app.state.gateway
    assert isinstance(state, GatewayState)
    return state


# A route's parameter `state: State` is the app's GatewayState.
State = Annotated[GatewayState, Depends(get_state)]
