"""The OpenAI batch object, and what cbserve keeps about a batch to build it (no I/O)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

import msgspec
from pydantic import BaseModel

from openai_frontend.model.served_model import ModelRules

Status = Literal[
    "validating", "failed", "in_progress", "finalizing", "completed", "expired", "cancelling", "cancelled"
]
# Still owed work by a batch task; every other status is final.
ACTIVE: tuple[Status, ...] = ("validating", "in_progress", "finalizing", "cancelling")
ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
COMPLETION_WINDOWS = {"24h": 24 * 3600}
# The Celery task that runs a batch: the gateway queues it by this name (gateway/batch_queue.py)
# and the Celery worker registers it under it (cbserve_celery/batch_task.py).
RUN_BATCH_TASK = "cbserve.run_batch"
# The hash fields that change after creation, each written on its own (see store.py).
TIMESTAMPS = (
    "in_progress_at",
    "finalizing_at",
    "completed_at",
    "failed_at",
    "expired_at",
    "cancelling_at",
    "cancelled_at",
)


class BatchParams(msgspec.Struct, kw_only=True, frozen=True):
    """A batch's fixed fields, written once at creation."""

    id: str
    endpoint: str  # every line's url must be this
    input_file_id: str
    completion_window: str
    created_at: int  # unix seconds
    expires_at: int  # created_at + the completion window: lines unfinished then expire
    retain_until: int  # unix seconds: the batch, its results and output files are deleted then
    owner: str  # the API key's name; never shown
    metadata: dict[str, str] | None = None
    # Every served model's rules when the batch was created, the default one first: the task reads
    # each line by the rules of the model it names.
    models: list[ModelRules]


def decode_params(raw: bytes) -> BatchParams:
    """A batch's params as stored. One stored before several models held its one model's rules whole
    (`rules`), and one stored before that four of them at the top level: the others read as their
    defaults, as its lines ran then."""
    fields = msgspec.json.decode(raw)
    if "models" not in fields:
        if "rules" not in fields:
            caps = {
                key: fields.pop(key)
                for key in ("max_model_len", "max_prompt_tokens", "max_tokens")
                if key in fields
            }
            fields["rules"] = {"name": fields.pop("model"), **caps}
        fields["models"] = [fields.pop("rules")]
    return msgspec.convert(fields, BatchParams)


class BatchError(BaseModel):
    code: str
    message: str
    param: str | None = None
    line: int | None = None  # 1-based line of the input file


class BatchErrors(BaseModel):
    object: Literal["list"] = "list"
    data: list[BatchError]


class RequestCounts(BaseModel):
    total: int
    completed: int
    failed: int


class BatchObject(BaseModel):
    id: str
    object: Literal["batch"] = "batch"
    endpoint: str
    errors: BatchErrors | None = None
    input_file_id: str
    completion_window: str
    status: Status
    output_file_id: str | None = None
    error_file_id: str | None = None
    created_at: int
    in_progress_at: int | None = None
    expires_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    request_counts: RequestCounts
    metadata: dict[str, str] | None = None
    model: str | None = None


@dataclass(slots=True, frozen=True)
class BatchState:
    """A batch as read from Redis: its params, status, changing fields and result counts."""

    params: BatchParams
    status: Status
    fields: dict[str, str]  # in_progress_at, output_file_id, errors (JSON), total, ...
    num_completed: int
    num_failed: int

    @property
    def is_active(self) -> bool:
        return self.status in ACTIVE

    def to_object(self) -> BatchObject:
        f = self.fields
        errors = (
            BatchErrors(data=[BatchError(**e) for e in json.loads(f["errors"])]) if "errors" in f else None
        )
        times: dict[str, Any] = {name: int(f[name]) for name in TIMESTAMPS if name in f}
        return BatchObject(
            id=self.params.id,
            endpoint=self.params.endpoint,
            errors=errors,
            input_file_id=self.params.input_file_id,
            completion_window=self.params.completion_window,
            status=self.status,
            output_file_id=f.get("output_file_id"),
            error_file_id=f.get("error_file_id"),
            created_at=self.params.created_at,
            expires_at=self.params.expires_at,
            request_counts=RequestCounts(
                total=int(f.get("total", 0)), completed=self.num_completed, failed=self.num_failed
            ),
            metadata=self.params.metadata,
            # OpenAI's batch names its one model; lines here may name any served one.
            model=self.params.models[0].name if len(self.params.models) == 1 else None,
            **times,
        )
