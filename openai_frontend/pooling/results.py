"""The results of a pooling endpoint's requests: each request's `PoolingEvent`, read from its token
stream through the follower's shared read (one `XREAD` per cell). A request that fails fails the
whole answer; one left unfinished (timeout, or the client gone) is aborted in the batcher, unless
its caller leaves it running."""

from __future__ import annotations

import asyncio
import time
from contextlib import aclosing

from common.protocol import PoolingEvent
from openai_frontend.follow.request_follower import RequestFollower
from openai_frontend.follow.token_stream import RequestFailed, RequestTimedOut, follow_token_stream
from openai_frontend.protocol.errors import from_request_error, timed_out_error


async def pooled(
    follower: RequestFollower, req_ids: list[str], timeout_s: float, abort: bool = True
) -> list[PoolingEvent]:
    """Each request's result, in order; raises OpenAIError when one fails or time runs out. Without
    `abort` the unfinished ones are left running (a batch task handing its lines on to the next)."""
    deadline = time.monotonic() + timeout_s
    tasks = [asyncio.ensure_future(_one(follower, req_id, deadline)) for req_id in req_ids]
    try:
        return list(await asyncio.gather(*tasks))
    except RequestFailed as exc:
        raise from_request_error(exc.error) from None
    except RequestTimedOut:
        raise timed_out_error() from None
    finally:
        for req_id, task in zip(req_ids, tasks, strict=True):
            if not task.done() or task.cancelled() or task.exception() is not None:
                task.cancel()
                if abort:
                    follower.abort_later(req_id, "abort")


async def _one(follower: RequestFollower, req_id: str, deadline: float) -> PoolingEvent:
    batches = follow_token_stream(follower.mux, req_id, deadline=deadline, submitted=True)
    async with aclosing(batches):
        async for batch in batches:
            for _, event in batch:
                if isinstance(event, PoolingEvent):
                    return event
    raise RequestTimedOut(req_id)  # the stream ended without a result: a generation's, never a pooling's
