"""From a validated body to requests on the stream: check, tokenize, bound the queue, rate-limit, submit.

The order matters: cheap refusals first, and the rate limit counts a request only once nothing else
will refuse it, so a 400 or a full queue never costs the client part of its quota.
"""

from __future__ import annotations

import functools
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from starlette.requests import Request

from common.stream_client import new_req_id
from common.streams import cell_keys, cell_of, placed_req_id
from gateway.app_state import GatewayState
from gateway.limits.cell_guard import request_bytes
from gateway.limits.cell_runners import cell_runners
from gateway.prepare_pool import body_size
from gateway.security.auth import request_owner
from openai_frontend.generate.image_prompts import has_image_parts
from openai_frontend.generate.request import PreparedRequest, with_message
from openai_frontend.generate.request_builder import prepare_choices
from openai_frontend.protocol.openai_schemas import ChatCompletionRequest, CompletionRequest
from openai_frontend.structured.constraint import asks_for_grammar


async def admit(
    body: CompletionRequest | ChatCompletionRequest, http_request: Request, state: GatewayState
) -> list[PreparedRequest]:
    """The request's choices (n per prompt), all submitted; raises OpenAIError when refused."""
    async with admitted(body, http_request, state, body_size(http_request)) as requests:
        if len(requests) == 1:
            # Kept so that the client can resume the stream or fetch the result by id, through any gateway.
            await state.follower.submit(requests[0], keep_meta=True)
            return requests
        for choice_request in requests:
            await state.follower.submit(choice_request)
        return requests


@asynccontextmanager
async def admitted(
    body: CompletionRequest | ChatCompletionRequest,
    http_request: Request,
    state: GatewayState,
    num_bytes: int | None,
) -> AsyncIterator[list[PreparedRequest]]:
    """The request's choices, checked, tokenized, within the queue bound and counted by the rate
    limit, for the caller to submit inside the block. Raises OpenAIError when refused. On leaving
    the block the queue bound stops counting them: written, the stream counts them; failed, nothing.
    `num_bytes` is the size of what the prompt is made of (the body's, gateway/prepare_pool.py
    `body_size`; None when unknown): a large one is templated and tokenized off the event loop."""
    requests = await _checked_requests(body, http_request, state, num_bytes)
    request = requests[0]
    try:
        yield requests
    finally:
        state.queue_bound.release(cell_of(request.req_id), request.req_id)


async def _checked_requests(
    body: CompletionRequest | ChatCompletionRequest,
    http_request: Request,
    state: GatewayState,
    num_bytes: int | None,
) -> list[PreparedRequest]:
    arrival_time = time.time()
    owner = request_owner(http_request)
    # A base model's name, or a LoRA adapter's (its requests carry it, on its base model's cells).
    target = await state.target(body.model)
    prepare = functools.partial(
        prepare_choices,
        body,
        target.served,
        arrival_time,
        owner=owner,
        queue_deadline=arrival_time + state.settings.max_queue_wait_s,
        req_id=new_req_id(),
        lora_request=target.lora_request,
    )
    # Building a grammar is heavy whatever the size (the first time it imports xgrammar), and so are
    # fetching, decoding and processing images.
    heavy = asks_for_grammar(body) or (
        isinstance(body, ChatCompletionRequest) and has_image_parts(body.messages)
    )
    requests = await state.prepare.run(None if heavy else num_bytes, prepare)
    # Placed once tokenized (the router weighs the prompt); every choice goes to the first's cell.
    # prompt_cache_key is a placement hint within its API key (gateway/cell_router.py).
    cache_key = f"{owner}\0{body.prompt_cache_key}" if body.prompt_cache_key else ""
    message = requests[0].message
    # An adapter's prompt blocks are hashed with its key, as the batcher's prefix cache hashes them;
    # a prompt's images key them too (the same placeholders with another image are another prefix).
    lora_key = b"" if message.lora_request is None else message.lora_request.cache_key
    image_keys = b"".join(f.identifier.encode() for f in message.mm_features or [])
    router = state.routers[target.served.rules.name]
    cell = await router.place(state.redis, message.prompt_token_ids, cache_key, lora_key + image_keys)
    requests = [with_message(r, req_id=placed_req_id(cell, r.req_id)) for r in requests]
    request = requests[0]
    # A pooling model's cell generates nothing: a 400 that says so, not a request that fails there.
    await cell_runners(http_request.app).check(state.redis, cell, None, request.num_prompt_tokens)
    # Each prompt once, and every choice's output.
    num_prompt_tokens = sum(r.num_prompt_tokens for r in requests[:: request.n])
    num_output_tokens = sum(r.message.sampling_params.max_tokens for r in requests)
    # Each choice's entry carries its prompt's images.
    num_image_bytes = sum(
        len(t.data) for r in requests for f in r.message.mm_features or [] for t in f.data.values()
    )
    num_bytes = request_bytes(len(requests), num_prompt_tokens, num_output_tokens, num_image_bytes)
    await state.cell_guard.check(state.redis, cell, num_bytes)
    await state.queue_bound.check(state.redis, cell_keys(cell), request.req_id, [r.req_id for r in requests])
    num_tokens = num_prompt_tokens + num_output_tokens
    try:
        await state.rate_limiter.check(owner, num_tokens, request.message.user)
    except BaseException:
        state.queue_bound.release(cell, request.req_id)  # refused: it never waits
        raise
    return requests
