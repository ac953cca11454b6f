"""The FastAPI application: `create_app(settings)` is the one entry point."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from common.redis_io.redis_conn import connect_async
from gateway.api import (
    routes_batches,
    routes_dashboard,
    routes_files,
    routes_generation,
    routes_lora,
    routes_messages,
    routes_metrics,
    routes_models,
    routes_pooling,
    routes_requests,
    routes_responses,
    routes_stored_chat,
    routes_tokenizer,
)
from gateway.api.error_handlers import install_error_handlers
from gateway.app_state import GatewayState
from gateway.batch_queue import BatchQueue
from gateway.cell_router import CellRouter
from gateway.limits.cell_guard import CellGuard
from gateway.limits.queue_bound import QueueBound
from gateway.limits.rate_limit import RateLimiter, RateLimits
from gateway.lora.static_modules import StaticAdapters
from gateway.model_setup import load_served_models
from gateway.observability.metrics import GatewayMetrics
from gateway.prepare_pool import PreparePool
from gateway.security.api_keys import ApiKeys
from gateway.security.auth import AuthMiddleware
from gateway.security.body_limit import BodySizeLimitMiddleware
from gateway.settings import GatewaySettings
from openai_frontend.batch.files_store import FileStore
from openai_frontend.batch.store import BatchStore
from openai_frontend.follow.request_follower import RequestFollower
from openai_frontend.model.lora_registry import LoRARegistry
from openai_frontend.model.served_models import ServedModels
from openai_frontend.responses.follower import ResponseFollower
from openai_frontend.responses.store import ResponseStore

_MULTIPART_OVERHEAD = 64 * 1024  # boundaries, part headers and the `purpose` field of an upload


def create_app(settings: GatewaySettings) -> FastAPI:
    """Build the app; the tokenizers load now (so a bad model dir fails fast), Redis on startup, and
    the static LoRA adapters are checked now and registered in Redis on startup."""
    models = load_served_models(settings)
    static_adapters = StaticAdapters.from_settings(settings, models)
    keys_file = None if settings.api_keys_file is None else str(settings.api_keys_file)
    api_keys = ApiKeys.from_settings(settings.api_key_hashes, keys_file)
    limits = RateLimits(settings.rate_limit_rpm, settings.rate_limit_tpm)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        redis = connect_async(settings.redis_url, settings.redis_cluster)
        metrics = GatewayMetrics(*models.names)
        follower = RequestFollower(
            redis,
            models,
            settings.request_timeout_s,
            metrics,
            settings.retention_s,
            settings.resume_grace_s,
        )
        batch_queue = BatchQueue(settings.redis_url)
        responses = ResponseFollower(follower, ResponseStore(redis), settings.retention_s)
        prepare = PreparePool(settings.prepare_threads, settings.prepare_inline_bytes)
        adapters = LoRARegistry(redis)
        static_adapters.start(adapters)
        app.state.gateway = GatewayState(
            settings=settings,
            models=models,
            adapters=adapters,
            redis=redis,
            follower=follower,
            metrics=metrics,
            rate_limiter=RateLimiter(
                redis, limits, RateLimits(settings.rate_limit_user_rpm, settings.rate_limit_user_tpm)
            ),
            files=FileStore(redis),
            batches=BatchStore(redis),
            batch_queue=batch_queue,
            responses=responses,
            routers=_routers(settings, models),
            cell_guard=CellGuard(settings.redis_memory_headroom),
            queue_bound=QueueBound(settings.max_queued_requests),
            prepare=prepare,
        )
        try:
            yield
        finally:
            await static_adapters.close()
            await responses.close()
            await follower.drain()
            batch_queue.close()
            prepare.close()
            await redis.aclose()

    app = FastAPI(title="cbserve gateway", lifespan=lifespan)
    install_error_handlers(app)
    routes = (
        routes_generation,
        routes_pooling,
        routes_responses,
        routes_requests,
        routes_models,
        routes_lora,
        routes_tokenizer,
        routes_stored_chat,
        routes_messages,
        routes_metrics,
        routes_dashboard,
        routes_files,
        routes_batches,
    )
    for route in routes:
        app.include_router(route.router)
    # Added last runs first: keys are checked before a byte of the body is read. An upload may be
    # as large as a file may be, plus its multipart framing.
    upload_limit = settings.max_file_bytes + _MULTIPART_OVERHEAD
    app.add_middleware(
        BodySizeLimitMiddleware,
        max_body_bytes=settings.max_body_bytes,
        path_limits={"/v1/files": upload_limit},
    )
    app.add_middleware(AuthMiddleware, keys=api_keys)
    return app


def _routers(settings: GatewaySettings, models: ServedModels) -> dict[str, CellRouter]:
    """Per base model, a router over its cells: with one model GATEWAY_CELLS (or CBSERVE_CELL, or
    every registered cell), as before; with GATEWAY_MODELS_CONFIG each model's own cells."""
    policy = (settings.cell_policy, settings.cell_prefix_weight, settings.cell_prefix_blocks)
    if settings.models_config is None:
        [served] = models.models
        return {
            served.rules.name: CellRouter(settings.placement_cells, *policy, discover=settings.discover_cells)
        }
    return {m.rules.name: CellRouter(list(m.rules.cells), *policy) for m in models.models}
