"""Where a pooling request goes from its prompts to its results (routes_pooling.py): placed in a cell,
checked against what the cell's workers serve, bounded and counted as generation is (the cell's
batcher and Redis headroom, the queue bound, the rate limit by prompt tokens), one request per prompt
queued, each one's `PoolingEvent` read back, and each counted in the gateway's request metrics."""

from __future__ import annotations

import time

from starlette.requests import Request

from common.protocol import GenerateRequest, PoolingEvent, SamplingParams
from common.stream_client import new_req_id, submit_once_on
from common.streams import cell_keys
from gateway.app_state import GatewayState
from gateway.limits.cell_guard import request_bytes
from gateway.limits.cell_runners import cell_runners
from gateway.security.auth import request_owner
from openai_frontend.model.served_model import ServedModel
from openai_frontend.pooling.bodies import PoolingJob
from openai_frontend.pooling.results import pooled
from openai_frontend.protocol.errors import OpenAIError


async def run_pooling(
    job: PoolingJob, served: ServedModel, http_request: Request, state: GatewayState
) -> list[PoolingEvent]:
    """Each prompt's result, in order, from `served`'s cells; raises OpenAIError when refused or failed."""
    owner = request_owner(http_request)
    arrival_time = time.time()
    cell = await state.routers[served.rules.name].place(state.redis, job.prompts[0][0], "")
    runners = cell_runners(http_request.app)
    for ids, _ in job.prompts:
        await runners.check(
            state.redis, cell, job.params, _num_read(len(ids), job.params.truncate_prompt_tokens)
        )
    messages = [
        GenerateRequest(
            req_id=new_req_id(cell),
            prompt_token_ids=ids,
            sampling_params=SamplingParams(),
            arrival_time=arrival_time,
            owner=owner,
            user=job.user,
            queue_deadline=arrival_time + state.settings.max_queue_wait_s,
            pooling_params=job.params,
            token_type_ids=types,
        )
        for ids, types in job.prompts
    ]
    req_ids = [m.req_id for m in messages]
    num_tokens = sum(len(m.prompt_token_ids) for m in messages)
    await state.cell_guard.check(state.redis, cell, request_bytes(len(messages), num_tokens, 0))
    await state.queue_bound.check(state.redis, cell_keys(cell), req_ids[0], req_ids)
    try:
        await state.rate_limiter.check(owner, num_tokens, job.user)
        async with state.redis.pipeline(transaction=False) as pipe:
            for message in messages:
                submit_once_on(pipe, message)
            await pipe.execute()
    finally:
        state.queue_bound.release(cell, req_ids[0])  # written, the stream counts them; refused, nothing
    reason, num_prompt_tokens = "abort", [len(m.prompt_token_ids) for m in messages]  # abort: the client left
    try:
        events = await pooled(state.follower, req_ids, state.settings.request_timeout_s)
        reason, num_prompt_tokens = "stop", [e.num_prompt_tokens for e in events]
        return events
    except OpenAIError as exc:
        # As generation counts them: a timed-out request as aborted, a failed one as an error.
        reason = "abort" if exc.code == "timeout" else "error"
        raise
    finally:
        state.metrics.count_pooled(served.rules.name, arrival_time, num_prompt_tokens, reason)


def _num_read(num_tokens: int, truncate: int | None) -> int:
    """The tokens the model reads of a prompt: its last `truncate` (-1: as many as the model takes,
    which the batcher cuts it to)."""
    if truncate is None:
        return num_tokens
    return min(num_tokens, truncate) if truncate > 0 else 1
