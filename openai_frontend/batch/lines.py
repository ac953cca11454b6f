"""One batch line through the interactive endpoints' own code, so it answers exactly as they would.

Validation, chat template and tokenization (`prepare_choices`), the rules of the model the line names
(the batch's `ModelRules`, the gateway's own; a LoRA adapter's base model's), detokenization and stop
strings (`RequestFollower`, through `collect`), and the response body (completions/chat.py,
completions/completion.py) are the ones `POST /v1/chat/completions` and `POST /v1/completions` use;
only the submission differs: at batch priority, under an id derived from the batch and the line, placed
in a cell of the line's model chosen by the line's index, and at most once (`submit_once`), so a batch
task that runs again follows the line's request instead of generating it twice. A line the endpoint
would refuse gets the endpoint's status and error object; a line for a model whose tokenizer the task
lacks gets a 500 saying so.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis
from pydantic import ValidationError

from common.redis_io.result_lost import result_lost
from common.stream_client import submit_once_async
from common.streams import DEFAULT_CELL, placed_req_id
from openai_frontend.batch.input import InputLine
from openai_frontend.batch.objects import BatchParams
from openai_frontend.completions.endpoints import ENDPOINTS
from openai_frontend.completions.logprobs import LogprobsFormatter
from openai_frontend.follow.collect import collect
from openai_frontend.follow.request_follower import FollowPolicy, RequestFollower
from openai_frontend.generate.image_prompts import has_image_parts
from openai_frontend.generate.request import Kind, PreparedRequest, response_id
from openai_frontend.generate.request_builder import prepare_choices
from openai_frontend.model.lora_registry import LoRARegistry
from openai_frontend.model.model_target import ModelTarget, resolve_model
from openai_frontend.model.served_models import ServedModels
from openai_frontend.protocol.errors import OpenAIError, invalid_request, validation_error
from openai_frontend.protocol.openai_schemas import ChatCompletionRequest, CompletionRequest

logger = logging.getLogger(__name__)

# Lower runs first (common/protocol.py): every interactive request (0) is admitted before a batch line.
BATCH_PRIORITY = 1
# Stop strings still abort in the batcher; a task handing the line over to its next run does not.
_FOLLOW = FollowPolicy(track=False, leave_running=True)


class ResultLost(Exception):
    """The line's request finished while no task followed it, and its token stream has expired."""


class _NoClient:
    """A batch line's answer is always awaited: it never disconnects."""

    async def is_disconnected(self) -> bool:
        return False


_NO_CLIENT = _NoClient()


@dataclass(slots=True, frozen=True)
class LineContext:
    params: BatchParams
    models: ServedModels  # the batch's rules, each with this worker's tokenizer of that model
    redis: aioredis.Redis
    follower: RequestFollower
    adapters: LoRARegistry | None = None  # the deployment's LoRA adapters a line may name
    cell: str = DEFAULT_CELL  # where lines of a model without cells of its own go (CBSERVE_CELL)
    # Models of the batch this worker has no tokenizer for: their lines fail saying so.
    unserved: frozenset[str] = frozenset()

    @property
    def kind(self) -> Kind:
        return "chat" if self.params.endpoint == "/v1/chat/completions" else "completion"

    def place(self, line_id: str, index: int, target: ModelTarget | None) -> str:
        """The line's request id, placed in one of its model's cells (by the line's index, so that
        every run of the batch places it alike), or in the task's cell."""
        cells = target.served.rules.cells if target is not None else ()
        return placed_req_id(cells[index % len(cells)] if cells else self.cell, line_id)


@dataclass(slots=True)
class LineResult:
    ok: bool  # goes to the output file (else to the error file)
    line: bytes  # the JSONL line, without its newline


@dataclass(slots=True)
class Submitted:
    req_ids: list[str] = field(default_factory=list)  # what a cancel must abort


def line_req_id(batch_id: str, index: int, attempt: int = 0) -> str:
    """The request id of a line: the same every time the line runs, until its result is lost."""
    return f"{batch_id}-{index}" if attempt == 0 else f"{batch_id}-{index}.{attempt}"


def result_line(line: InputLine, req_id: str, status: int, body: dict[str, Any]) -> LineResult:
    """A line of the output (status 200) or error file, in OpenAI's shape."""
    response = {"status_code": status, "request_id": req_id, "body": body}
    out = {"id": f"batch_req_{req_id.removeprefix('batch_')}", "custom_id": line.custom_id}
    return LineResult(status == 200, json.dumps({**out, "response": response, "error": None}).encode())


def unrun_line(line: InputLine, req_id: str, code: str, message: str) -> LineResult:
    """An error line for a request that never ran to its end (the batch expired)."""
    out = {"id": f"batch_req_{req_id.removeprefix('batch_')}", "custom_id": line.custom_id}
    error = {"code": code, "message": message}
    return LineResult(False, json.dumps({**out, "response": None, "error": error}).encode())


def _body(ctx: LineContext, line: InputLine) -> CompletionRequest | ChatCompletionRequest:
    """The line's body, as the endpoint reads it; raises OpenAIError as it would."""
    schema = ChatCompletionRequest if ctx.kind == "chat" else CompletionRequest
    try:
        body = schema.model_validate(line.body)
    except ValidationError as exc:
        raise validation_error(exc.errors()) from None
    if body.stream:
        raise invalid_request("stream is not supported in a batch: each line gets one response", "stream")
    if body.store:
        # A line's answer is kept in the batch's output file; it is not a stored chat completion.
        raise invalid_request("store is not supported in a batch: the output file holds each answer", "store")
    return body


async def line_target(ctx: LineContext, requested: str | None) -> ModelTarget:
    """The model (or LoRA adapter) the line names; a 500 when it is one this worker has no tokenizer
    for, else the endpoint's 404 for an unknown one."""
    try:
        return await resolve_model(ctx.models, ctx.adapters, requested)
    except OpenAIError:
        adapter = await ctx.adapters.get(requested) if ctx.adapters is not None and requested else None
        base = adapter.base_model_name if adapter is not None else requested
        if base in ctx.unserved:
            raise OpenAIError(
                500,
                f"the Celery worker running this batch has no tokenizer for model `{base}`: start it with "
                "CBSERVE_CELERY_MODELS_CONFIG, the gateway's models config",
                type="server_error",
                code="model_not_loaded",
            ) from None
        raise


def _prepare(
    ctx: LineContext, body: CompletionRequest | ChatCompletionRequest, target: ModelTarget, req_id: str
) -> list[PreparedRequest]:
    """The endpoint's checks and tokenization for the line's body; raises OpenAIError as it would."""
    params = ctx.params
    return prepare_choices(
        body,
        target.served,
        float(params.created_at),  # timeouts count from here: a line may run until the batch expires
        owner=params.owner,
        queue_deadline=float(params.expires_at),
        req_id=req_id,
        priority=BATCH_PRIORITY,
        lora_request=target.lora_request,
    )


async def run_line(ctx: LineContext, line: InputLine, line_id: str, submitted: Submitted) -> LineResult:
    """The line's output or error line, its request id `line_id` placed in a cell of its model.
    Raises ResultLost when its result can no longer be read."""
    target = None
    try:
        body = _body(ctx, line)
        target = await line_target(ctx, body.model)
        req_id = ctx.place(line_id, line.index, target)
        if isinstance(body, ChatCompletionRequest) and has_image_parts(body.messages):
            # Fetching, decoding and processing images would hold up the batch's other lines.
            requests = await asyncio.to_thread(_prepare, ctx, body, target, req_id)
        else:
            requests = _prepare(ctx, body, target, req_id)
    except OpenAIError as exc:
        req_id = ctx.place(line_id, line.index, target)
        return result_line(line, req_id, exc.status, exc.body())
    for request in requests:
        submitted.req_ids.append(request.req_id)
        first_time = await submit_once_async(ctx.redis, request.message)
        if not first_time and await result_lost(ctx.redis, request.req_id):
            raise ResultLost(req_id)
    try:
        done = await collect(ctx.follower, requests, _NO_CLIENT, _FOLLOW)
    except OpenAIError as exc:
        return result_line(line, req_id, exc.status, exc.body())
    formatter = LogprobsFormatter(target.served.tokenizer.tokenizer)
    build = ENDPOINTS[ctx.kind].body
    answer = build(
        requests, done, response_id(ctx.kind, req_id), ctx.params.created_at, target.name, formatter
    )
    return result_line(line, req_id, 200, answer)
