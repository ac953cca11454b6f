"""One `/v1/embeddings` batch line through the endpoint's own code (openai_frontend/pooling/): the
body read and its inputs tokenized as `POST /v1/embeddings` reads them, one pooling request per input,
and the endpoint's answer as the line's response body. As a generation line (lines.py), its requests
go at batch priority under ids derived from the batch and the line, each submitted at most once, so a
task that runs the batch again follows them instead of computing them twice; a task that hands the
batch on leaves them running."""

from __future__ import annotations

import time

from pydantic import ValidationError

from common.protocol import GenerateRequest, SamplingParams
from common.redis_io.result_lost import result_lost
from common.stream_client import submit_once_async
from openai_frontend.batch.input import InputLine
from openai_frontend.batch.lines import (
    BATCH_PRIORITY,
    LineContext,
    LineResult,
    ResultLost,
    Submitted,
    line_target,
    result_line,
)
from openai_frontend.model.model_target import ModelTarget
from openai_frontend.pooling.bodies import PoolingJob, embedding_answer, embedding_job
from openai_frontend.pooling.results import pooled
from openai_frontend.pooling.schemas import EmbeddingRequest
from openai_frontend.protocol.errors import OpenAIError, validation_error

EMBEDDINGS_ENDPOINT = "/v1/embeddings"


async def run_embedding_line(
    ctx: LineContext, line: InputLine, line_id: str, submitted: Submitted
) -> LineResult:
    """The line's output or error line; raises ResultLost when a result can no longer be read."""
    target: ModelTarget | None = None
    try:
        body = _body(line)
        target = await line_target(ctx, body.model)
        if target.lora_request is not None:  # the endpoint serves base models only, as the gateway's
            raise ctx.models.not_found(target.lora_request.lora_name)
        job = embedding_job(body, target.served)
    except OpenAIError as exc:
        return result_line(line, ctx.place(line_id, line.index, target), exc.status, exc.body())
    req_id = ctx.place(line_id, line.index, target)
    for message in _messages(ctx, job, req_id):
        submitted.req_ids.append(message.req_id)
        first_time = await submit_once_async(ctx.redis, message)
        if not first_time and await result_lost(ctx.redis, message.req_id):
            raise ResultLost(req_id)
    timeout_s = max(0.0, ctx.params.expires_at - time.time())
    try:
        events = await pooled(ctx.follower, list(submitted.req_ids), timeout_s, abort=False)
    except OpenAIError as exc:
        return result_line(line, req_id, exc.status, exc.body())
    return result_line(line, req_id, 200, embedding_answer(events, body.encoding_format, target.name))


def _body(line: InputLine) -> EmbeddingRequest:
    try:
        return EmbeddingRequest.model_validate(line.body)
    except ValidationError as exc:
        raise validation_error(exc.errors()) from None


def _messages(ctx: LineContext, job: PoolingJob, req_id: str) -> list[GenerateRequest]:
    """One request per input, the first under the line's id and the others `<id>-<i>` (as a
    generation's choices are named)."""
    params = ctx.params
    return [
        GenerateRequest(
            req_id=f"{req_id}-{i}" if i else req_id,
            prompt_token_ids=ids,
            sampling_params=SamplingParams(),
            arrival_time=float(params.created_at),
            priority=BATCH_PRIORITY,
            owner=params.owner,
            user=job.user,
            queue_deadline=float(params.expires_at),
            pooling_params=job.params,
            token_type_ids=types,
        )
        for i, (ids, types) in enumerate(job.prompts)
    ]
