"""What every route needs, created once per app in the lifespan and reached through `get_state`."""

from __future__ import annotations

from dataclasses import dataclass

import redis.asyncio as aioredis
from starlette.requests import Request

from gateway.batch_queue import BatchQueue
from gateway.batch_store import BatchStore
from gateway.files_store import FileStore
from gateway.metrics import GatewayMetrics
from gateway.rate_limit import RateLimiter
from gateway.request_runner import RequestRunner
from gateway.served_model import ServedModel
from gateway.settings import GatewaySettings


@dataclass(slots=True, frozen=True)
class GatewayState:
    settings: GatewaySettings
    served: ServedModel
    redis: aioredis.Redis  # the app's one client (it pools connections)
    runner: RequestRunner
    metrics: GatewayMetrics  # the gateway's own request metrics (batcher ones are read on scrape)
    rate_limiter: RateLimiter
    files: FileStore  # the Files API's files
    batches: BatchStore  # the Batch API's batches
    batch_queue: BatchQueue  # hands new batches to the Celery workers


def get_state(request: Request) -> GatewayState:
    state = request.app.state.gateway
    assert isinstance(state, GatewayState)
    return state
