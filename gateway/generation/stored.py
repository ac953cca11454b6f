"""Keeping a chat completion asked with `store: true`: its answer, as the client got it, with the
messages that asked for it (openai_frontend/stored/). A streamed one is replayed from its token
stream just before the stream's `[DONE]`, so it is stored by the time its client has it all."""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, Sequence
from contextlib import aclosing

from starlette.requests import Request

from gateway.app_state import GatewayState
from gateway.security.auth import request_owner
from openai_frontend.completions.chat import CHAT
from openai_frontend.completions.logprobs import LogprobsFormatter
from openai_frontend.completions.stream import DONE
from openai_frontend.follow.collect import collect
from openai_frontend.follow.request_follower import FollowPolicy
from openai_frontend.follow.stream_out import StreamEvent
from openai_frontend.generate.request import PreparedRequest
from openai_frontend.protocol.errors import OpenAIError
from openai_frontend.protocol.openai_schemas import ChatCompletionRequest
from openai_frontend.stored.chat_completions import StoredChatCompletions

logger = logging.getLogger(__name__)

# A finished request's token stream is replayed at once; this only bounds a stream that is not there.
_REPLAY_WAIT_S = 5.0


class _Replay:
    """The replay's own reader: it never goes away."""

    async def is_disconnected(self) -> bool:
        return False


def store_of(state: GatewayState) -> StoredChatCompletions:
    return StoredChatCompletions(state.redis, state.settings.stored_completions_ttl_s)


async def save(
    state: GatewayState, http_request: Request, body: ChatCompletionRequest, answer: dict[str, object]
) -> None:
    messages = [m.model_dump(exclude_none=True) for m in body.messages]
    await store_of(state).save(request_owner(http_request), dict(answer), messages, body.metadata or {})


async def storing(
    events: AsyncGenerator[StreamEvent, None],
    state: GatewayState,
    http_request: Request,
    body: ChatCompletionRequest,
    requests: Sequence[PreparedRequest],
) -> AsyncGenerator[StreamEvent, None]:
    """The stream's events, the completion stored (when it finished) right before the last one."""
    async with aclosing(events) as stream:
        async for event in stream:
            if event is DONE:
                await _replay_and_save(state, http_request, body, requests)
            yield event


async def _replay_and_save(
    state: GatewayState,
    http_request: Request,
    body: ChatCompletionRequest,
    requests: Sequence[PreparedRequest],
) -> None:
    request = requests[0]
    formatter = LogprobsFormatter(state.follower.tokenizer(request).tokenizer)
    follow = FollowPolicy(may_abort=False, track=False, wait_s=_REPLAY_WAIT_S)
    try:
        done = await collect(state.follower, requests, _Replay(), follow)
    except OpenAIError as exc:  # it failed or did not finish: there is no completion to keep
        logger.info("stream not stored: %s", exc.message, extra={"request_id": request.req_id})
        return
    answer = CHAT.body(requests, done, request.response_id, request.created, request.model, formatter)
    await save(state, http_request, body, answer)
