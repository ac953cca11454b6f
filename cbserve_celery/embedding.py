"""The `cbserve.embed` task: a `/v1/embeddings` body's inputs as pooling requests through the stream
protocol, safe to run again for the same task id, as `cbserve.generate` is (generation.py).

The inputs are read and tokenized by the endpoint's own code (openai_frontend/pooling/bodies.py), one
request per input under ids derived from the task id (`<id>`, `<id>-1`, ...), each submitted once, so
a second run of the task reads the same results instead of computing them again. It returns the
endpoint's answer with float embeddings.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import redis
from celery import Celery, Task
from pydantic import ValidationError

from cbserve_celery.generation import GenerationFailed, task_req_id
from cbserve_celery.model_tokenizers import ModelTokenizers
from cbserve_celery.settings import CelerySettings
from common.protocol import GenerateRequest, PoolingEvent, SamplingParams
from common.stream_client import abort, submit_once, wait_pooled
from common.token_rules import RequestFailed, RequestTimedOut
from openai_frontend.pooling.bodies import PoolingJob, embedding_answer, embedding_job
from openai_frontend.pooling.schemas import EmbeddingRequest
from openai_frontend.protocol.errors import OpenAIError

EMBED_TASK = "cbserve.embed"


def run_embedding(
    r: redis.Redis, req_id: str, job: PoolingJob, *, timeout_s: float, owner: str = "celery"
) -> list[PoolingEvent]:
    """Submit each input's request (unless already submitted) and wait for every result, in order."""
    messages = [
        GenerateRequest(
            req_id=f"{req_id}-{i}" if i else req_id,
            prompt_token_ids=ids,
            sampling_params=SamplingParams(),
            arrival_time=time.time(),
            owner=owner,
            user=job.user,
            pooling_params=job.params,
            token_type_ids=types,
        )
        for i, (ids, types) in enumerate(job.prompts)
    ]
    for message in messages:
        submit_once(r, message)
    deadline = time.monotonic() + timeout_s
    try:
        return [wait_pooled(r, m.req_id, timeout_s=max(0.001, deadline - time.monotonic())) for m in messages]
    except (RequestTimedOut, RequestFailed) as exc:
        for message in messages:
            abort(r, message.req_id)  # the batcher ignores an abort of a finished request
        if isinstance(exc, RequestFailed):
            raise GenerationFailed(f"{exc.error.code}: {exc.error.message}") from None
        raise GenerationFailed(f"request {req_id} did not finish within {timeout_s:.0f} s") from None


def add_embed_task(
    app: Celery, settings: CelerySettings, tokenizers: ModelTokenizers, redis_of: Callable[[], redis.Redis]
) -> None:
    @app.task(name=EMBED_TASK, bind=True, shared=False)
    def embed(
        self: Task,
        input: str | list[str] | list[int] | list[list[int]],
        model: str | None = None,
        dimensions: int | None = None,
        normalize: bool | None = None,
        truncate_prompt_tokens: int | None = None,
    ) -> dict[str, Any]:
        """Embed `input` (a text, texts, token ids or lists of them, as `/v1/embeddings` takes it) with
        `model`, a model of the worker's models config (None: the worker's one, or first).

        Returns the `/v1/embeddings` answer (float embeddings) and the first request's `req_id`.
        """
        if model is not None and not tokenizers.knows(model):
            raise ValueError(f"model {model!r} is not in this worker's CBSERVE_CELERY_MODELS_CONFIG")
        served = tokenizers.served(model)
        if served is None:
            raise ValueError("embeddings need CBSERVE_CELERY_MODEL (or MODEL) on the worker")
        fields = {
            "dimensions": dimensions,
            "normalize": normalize,
            "truncate_prompt_tokens": truncate_prompt_tokens,
        }
        try:
            body = EmbeddingRequest.model_validate({"input": input, **fields})
            job = embedding_job(body, served)
        except ValidationError as exc:
            raise ValueError(f"invalid embedding request: {exc}") from None
        except OpenAIError as exc:
            raise ValueError(exc.message) from None
        req_id = task_req_id(str(self.request.id), tokenizers.cells(model) or [settings.cell])
        events = run_embedding(redis_of(), req_id, job, timeout_s=settings.request_timeout_s)
        return {**embedding_answer(events, "float", served.rules.name), "req_id": req_id}
