"""The OpenAI Batch API: create, retrieve, list and cancel batches.

Creating a batch records it (status `validating`, with a copy of its input file) and queues the
Celery task `cbserve.run_batch` (cbserve_celery/batch_task.py), which validates the lines, runs them
at batch priority through the same requests stream as interactive requests, and writes the output
and error files. Only the API key that created a batch can see or cancel it, and a key has at most
GATEWAY_MAX_BATCHES_PER_KEY batches in flight (gateway/security/quotas.py).
"""

from __future__ import annotations

import json
import secrets
import time
from typing import Annotated, Any

from fastapi import APIRouter, Query
from pydantic import BaseModel, ConfigDict
from starlette.requests import Request

from gateway.api.routes_files import file_not_found
from gateway.app_state import GatewayState, State
from gateway.batch_queue import BatchQueueUnavailable
from gateway.security.auth import request_owner
from gateway.security.quotas import check_batch_quota
from openai_frontend.batch.objects import COMPLETION_WINDOWS, ENDPOINTS, BatchObject, BatchParams, BatchState
from openai_frontend.protocol.errors import OpenAIError, invalid_request
from openai_frontend.protocol.list_page import list_page
from openai_frontend.protocol.strings import Id, Word

router = APIRouter()

# OpenAI's bounds on metadata.
MAX_METADATA_PAIRS, MAX_METADATA_KEY, MAX_METADATA_VALUE = 16, 64, 512


class BatchCreateRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    input_file_id: Id
    endpoint: Word
    completion_window: Word
    metadata: dict[str, str] | None = None


def _not_found(batch_id: str) -> OpenAIError:
    return OpenAIError(404, f"No such Batch object: {batch_id}", code="batch_not_found")


def _check_create(body: BatchCreateRequest) -> None:
    if body.endpoint not in ENDPOINTS:
        raise invalid_request(
            f"endpoint must be one of {', '.join(ENDPOINTS)}, got {body.endpoint!r}", "endpoint"
        )
    if body.completion_window not in COMPLETION_WINDOWS:
        raise invalid_request(
            f"completion_window must be one of {', '.join(COMPLETION_WINDOWS)}, "
            f"got {body.completion_window!r}",
            "completion_window",
        )
    metadata = body.metadata or {}
    if len(metadata) > MAX_METADATA_PAIRS:
        raise invalid_request(f"metadata holds at most {MAX_METADATA_PAIRS} pairs", "metadata")
    if any(len(k) > MAX_METADATA_KEY or len(v) > MAX_METADATA_VALUE for k, v in metadata.items()):
        raise invalid_request(
            f"metadata keys hold at most {MAX_METADATA_KEY} characters, values {MAX_METADATA_VALUE}",
            "metadata",
        )


def _params(body: BatchCreateRequest, owner: str, state: GatewayState) -> BatchParams:
    now = int(time.time())
    return BatchParams(
        id=f"batch_{secrets.token_hex(16)}",
        endpoint=body.endpoint,
        input_file_id=body.input_file_id,
        completion_window=body.completion_window,
        created_at=now,
        expires_at=now + COMPLETION_WINDOWS[body.completion_window],
        retain_until=now + state.settings.file_expires_s,
        owner=owner,
        metadata=body.metadata,
        models=[served.rules for served in state.models.models],
    )


async def _owned(batch_id: str, http_request: Request, state: GatewayState) -> BatchState:
    batch = await state.batches.get(batch_id, request_owner(http_request))
    if batch is None:
        raise _not_found(batch_id)
    return batch


@router.post("/v1/batches", response_model=BatchObject)
async def create_batch(body: BatchCreateRequest, http_request: Request, state: State) -> dict[str, Any]:
    _check_create(body)
    owner = request_owner(http_request)
    input_file = await state.files.get(owner, body.input_file_id)
    if input_file is None:
        raise file_not_found(body.input_file_id, "input_file_id")
    if input_file.purpose != "batch":
        raise invalid_request(
            f"file {body.input_file_id} has purpose {input_file.purpose!r}; a batch needs purpose 'batch'",
            "input_file_id",
        )
    await check_batch_quota(state.batches, owner, state.settings.max_batches_per_key)
    params = _params(body, owner, state)
    if not await state.batches.create(params):
        raise file_not_found(body.input_file_id, "input_file_id")  # deleted meanwhile
    try:
        await state.batch_queue.enqueue(params.id)
    except BatchQueueUnavailable as exc:
        errors = [{"code": "batch_queue_unavailable", "message": str(exc)}]
        await state.batches.transition(
            params.id, ["validating"], "failed", failed_at=int(time.time()), errors=json.dumps(errors)
        )
        raise OpenAIError(503, str(exc), type="server_error", code="batch_queue_unavailable") from exc
    return (await _owned(params.id, http_request, state)).to_object().model_dump()


@router.get("/v1/batches/{batch_id}", response_model=BatchObject)
async def retrieve_batch(batch_id: str, http_request: Request, state: State) -> dict[str, Any]:
    return (await _owned(batch_id, http_request, state)).to_object().model_dump()


@router.post("/v1/batches/{batch_id}/cancel", response_model=BatchObject)
async def cancel_batch(batch_id: str, http_request: Request, state: State) -> dict[str, Any]:
    batch = await _owned(batch_id, http_request, state)
    now = int(time.time())
    # Not started yet: nothing runs, so it is cancelled at once (a task that takes it later sees that).
    # Running: the task sees `cancelling`, aborts the lines in flight and writes what finished.
    if not (
        await state.batches.transition(
            batch_id, ["validating"], "cancelled", cancelling_at=now, cancelled_at=now
        )
        or await state.batches.transition(batch_id, ["in_progress"], "cancelling", cancelling_at=now)
        or batch.status == "cancelling"
    ):
        raise OpenAIError(
            409, f"batch {batch_id} is {batch.status} and cannot be cancelled", code="batch_not_cancellable"
        )
    return (await _owned(batch_id, http_request, state)).to_object().model_dump()


@router.get("/v1/batches")
async def list_batches(
    http_request: Request,
    state: State,
    after: str | None = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
) -> dict[str, Any]:
    batches, has_more = await state.batches.listing(request_owner(http_request), after=after, limit=limit)
    return list_page([b.to_object().model_dump() for b in batches], has_more)
