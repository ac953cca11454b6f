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
from openai_frontend.model.served_model import ServedModel
from openai_frontend.responses.follower import ResponseFollower


@dataclass(slots=True, frozen=True)
class GatewayState:
    settings: GatewaySettings
    served: ServedModel
    redis: aioredis.Redis  # the app's one client (it pools connections)
    follower: RequestFollower
    metrics: GatewayMetrics  # the gateway's own request metrics (batcher ones are read on scrape)
    rate_limiter: RateLimiter
    files: FileStore  # the Files API's files
    batches: BatchStore  # the Batch API's batches
    batch_queue: BatchQueue  # hands new batches to the Celery workers
    responses: ResponseFollower  # the Responses API's responses and their store
    router: CellRouter  # which cell a new request goes to
    cell_guard: CellGuard  # whether that cell takes a new request now (a batcher, Redis headroom)
    queue_bound: QueueBound  # and whether its queue has room (GATEWAY_MAX_QUEUED_REQUESTS)
    prepare: PreparePool  # where a large request is parsed, templated and tokenized, off the loop

    @property
    def keys(self) -> CellKeys:
        """The keys of the cell this gateway places its requests in (CBSERVE_CELL)."""
        return cell_keys(self.settings.cell)


def get_state(request: Request) -> GatewayState:
    state = request.app.state.gateway
    assert isinstance(state, GatewayState)
    return state


# A route's parameter `state: State` is the app's GatewayState.
State = Annotated[GatewayState, Depends(get_state)]
