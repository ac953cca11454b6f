"""The pooling endpoints, served by a pooling model's cell (docs/api.md, *Embeddings, rerank and
score*): POST /v1/embeddings (OpenAI's), /rerank, /v1/rerank and /v2/rerank (the Jina / Cohere shape
vLLM serves), /score and /v1/score (vLLM's pairs), /classify and /v1/classify (vLLM's). A generation
model asked for any of them answers a 400 that says so (gateway/limits/cell_runners.py)."""

from __future__ import annotations

import time
from pathlib import Path

from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import JSONResponse

from common.protocol import PoolingTask
from gateway.api.prepared_body import PreparedBodyRoute
from gateway.app_state import GatewayState, State
from gateway.generation.pooling import run_pooling
from gateway.limits.cell_runners import cell_runners
from openai_frontend.model.served_model import ServedModel
from openai_frontend.pooling.bodies import (
    classification_answer,
    classification_job,
    embedding_answer,
    embedding_job,
    pair_job,
    rerank_answer,
    rerank_texts,
    score_answer,
    scores,
)
from openai_frontend.pooling.schemas import (
    ClassificationRequest,
    EmbeddingRequest,
    RerankRequest,
    ScoreRequest,
)
from openai_frontend.protocol.errors import invalid_request

router = APIRouter(route_class=PreparedBodyRoute)


@router.post("/v1/embeddings")
async def create_embeddings(body: EmbeddingRequest, http_request: Request, state: State) -> JSONResponse:
    served = state.models.get(body.model)
    job = await state.prepare.run(None, embedding_job, body, served)
    events = await run_pooling(job, served, http_request, state)
    return JSONResponse(embedding_answer(events, body.encoding_format, served.rules.name))


@router.post("/rerank")
@router.post("/v1/rerank")
@router.post("/v2/rerank")
async def rerank(body: RerankRequest, http_request: Request, state: State) -> JSONResponse:
    served = state.models.get(body.model)
    texts = rerank_texts(body, served)
    task = await _pair_task(served, http_request, state)
    job = await state.prepare.run(
        None, pair_job, body.query, texts, served, task, body.truncate_prompt_tokens
    )
    events = await run_pooling(job, served, http_request, state)
    values = scores(events, task, 1)
    num_tokens = sum(e.num_prompt_tokens for e in events)
    answer = rerank_answer(events[0].req_id, texts, values, body, served.rules.name, num_tokens)
    return JSONResponse(answer)


@router.post("/score")
@router.post("/v1/score")
async def score(body: ScoreRequest, http_request: Request, state: State) -> JSONResponse:
    served = state.models.get(body.model)
    task = await _pair_task(served, http_request, state)
    job = await state.prepare.run(
        None, pair_job, body.text_1, body.text_2, served, task, body.truncate_prompt_tokens
    )
    events = await run_pooling(job, served, http_request, state)
    num_first = 1 if isinstance(body.text_1, str) else len(body.text_1)
    values = scores(events, task, num_first)
    num_tokens = sum(e.num_prompt_tokens for e in events)
    created = int(time.time())
    return JSONResponse(score_answer(events[0].req_id, created, values, served.rules.name, num_tokens))


@router.post("/classify")
@router.post("/v1/classify")
async def classify(body: ClassificationRequest, http_request: Request, state: State) -> JSONResponse:
    served = state.models.get(body.model)
    job = await state.prepare.run(None, classification_job, body, served)
    events = await run_pooling(job, served, http_request, state)
    created = int(time.time())
    answer = classification_answer(events[0].req_id, created, events, served.rules.name, Path(served.root))
    return JSONResponse(answer)


async def _pair_task(served: ServedModel, http_request: Request, state: GatewayState) -> PoolingTask:
    """A cross-encoder scores pairs itself ("score"); an embedding model by the cosine ("embed")."""
    cell = state.routers[served.rules.name].cells[0]
    workers = await cell_runners(http_request.app).workers(state.redis, cell)
    tasks = {task for info in workers for task in info.pooling_tasks}
    if "score" in tasks or not workers:
        return "score"
    if "embed" in tasks:
        return "embed"
    raise invalid_request(
        f"model {served.rules.name!r} generates text and does not serve scores: scoring and reranking "
        "need a pooling model"
    )
