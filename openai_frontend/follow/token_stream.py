"""Follows one request's token stream in Redis, dropping duplicate and stale-attempt events."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator

from common.protocol import PoolingEvent, PromptEvent, TokenEvent
from common.token_rules import EventFilter, RequestFailed, RequestTimedOut, accept_message
from openai_frontend.follow.token_mux import TICK_S, TokenStreamMux

__all__ = ["EventFilter", "RequestFailed", "RequestTimedOut", "follow_token_stream"]


async def follow_token_stream(
    mux: TokenStreamMux,
    req_id: str,
    *,
    deadline: float,
    last_id: str = "0-0",
    submitted: bool = False,
    final_only: bool = False,
) -> AsyncGenerator[list[tuple[str, TokenEvent | PromptEvent | PoolingEvent]], None]:
    """Yield the new token (and prompt) events of each read (possibly none, about once a second) until
    the last one; a pooling request's is its one `PoolingEvent`.

    Empty batches give the caller a regular chance to notice that its client went away. Raises
    RequestFailed on a RequestError event, or once the reader found the request cannot end (its
    state lost, no batcher: token_mux.py), and RequestTimedOut past `deadline` (time.monotonic()).
    `submitted`: the caller wrote the request to Redis (TokenStreamMux.subscribe); `final_only`: the
    events come in one batch once the stream ended, not read by read (a non-streaming answer).
    While Redis is unreachable the shared read retries and this keeps yielding empty batches.
    """
    event_filter = EventFilter()
    sub = await mux.subscribe(req_id, last_id, submitted, final_only)
    try:
        while True:
            remaining_s = deadline - time.monotonic()
            if remaining_s <= 0:
                raise RequestTimedOut(req_id)
            if sub.failure is not None and sub.queue.empty():  # every entry read before it is taken
                raise RequestFailed(sub.failure)
            try:
                item = sub.queue.get_nowait()
            except asyncio.QueueEmpty:
                if remaining_s > TICK_S:
                    # The reader hands every follower a batch, empty if need be, at least once a
                    # TICK_S (token_mux.py): no timer per token, which cost the gateway's CPU.
                    item = await sub.queue.get()
                else:
                    try:
                        async with asyncio.timeout(remaining_s):
                            item = await sub.queue.get()
                    except TimeoutError:
                        continue  # past the deadline: raised above
            batch: list[tuple[str, TokenEvent | PromptEvent | PoolingEvent]] = []
            for entry_id, message in item:
                event = accept_message(event_filter, req_id, entry_id, message)
                if event is None:
                    continue
                batch.append((entry_id, event))
                if isinstance(event, PoolingEvent) or event.finish_reason is not None:
                    yield batch
                    return
            yield batch
    finally:
        mux.unsubscribe(sub)
