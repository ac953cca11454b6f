"""From a validated body to requests on the stream: check, tokenize, bound the queue, rate-limit, submit.

The order matters: cheap refusals first, and the rate limit counts a request only once nothing else
will refuse it, so a 400 or a full queue never costs the client part of its quota.
"""

from __future__ import annotations

import asyncio
import functools
import time

from starlette.requests import Request

from gateway.app_state import GatewayState
from gateway.security.auth import request_owner
from gateway.security.queue_depth import check_queue
from openai_frontend.openai_schemas import ChatCompletionRequest, CompletionRequest
from openai_frontend.request_builder import PreparedRequest, fan_out, prepare_request
from openai_frontend.request_meta import Kind, meta_of
from openai_frontend.structured_outputs import asks_for_grammar


async def admit(
    kind: Kind, body: CompletionRequest | ChatCompletionRequest, http_request: Request, state: GatewayState
) -> list[PreparedRequest]:
    """The request's choices (one per `n`), all submitted; raises OpenAIError when refused."""
    arrival_time = time.time()
    owner = request_owner(http_request)
    prepare = functools.partial(
        prepare_request,
        body,
        state.served,
        arrival_time,
        owner=owner,
        queue_deadline=arrival_time + state.settings.max_queue_wait_s,
    )
    # Checking a grammar builds it (and the first time imports xgrammar): off the event loop.
    request = await asyncio.to_thread(prepare) if asks_for_grammar(body) else prepare()
    await check_queue(state.redis, state.settings.max_queued_requests, request.n)
    num_tokens = len(request.prompt_token_ids) + request.n * request.sampling_params.max_tokens
    await state.rate_limiter.check(owner, num_tokens)
    requests = fan_out(request)
    if len(requests) == 1:
        # Kept so that the client can resume the stream or fetch the result by id, through any gateway.
        await state.runner.submit(request, meta_of(request, kind, state.served.name))
        return requests
    for choice_request in requests:
        await state.runner.submit(choice_request)
    return requests
