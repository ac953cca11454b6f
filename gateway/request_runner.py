"""Submits a prepared request to Redis and follows it to its end; aborts it when the client goes away."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass

import redis.asyncio as aioredis
import redis.exceptions

from common.logging_setup import bind_request_id
from common.protocol import TokenEvent
from common.stream_client import abort_async, submit_async
from gateway.metrics import GatewayMetrics, RequestTracker
from gateway.output_processor import OutputProcessor
from gateway.request_builder import PreparedRequest
from gateway.served_model import ServedModel
from gateway.stream_reader import RequestFailed, RequestTimedOut, follow_token_stream
from gateway.token_mux import TokenStreamMux

logger = logging.getLogger(__name__)

# How long shutdown waits for aborts still on their way to Redis.
_ABORT_DRAIN_S = 5.0


@dataclass(slots=True, frozen=True)
class Output:
    entry_id: str  # token stream entry that produced this text: the SSE id
    text: str
    finish_reason: str | None
    num_output_tokens: int  # tokens generated so far, for usage
    token_ids: list[int]  # tokens accepted since the previous Output
    events: list[TokenEvent]  # their token events (with logprobs when the request asked)


class RequestRunner:
    def __init__(
        self,
        redis: aioredis.Redis,
        served: ServedModel,
        request_timeout_s: float,
        metrics: GatewayMetrics,
    ) -> None:
        self._redis = redis
        self._mux = TokenStreamMux(redis)  # one shared read for every token stream followed here
        self._served = served
        self._metrics = metrics
        self._request_timeout_s = request_timeout_s
        # Abort sends run as their own tasks: a cancelled stream cannot await anything in its finally.
        self._pending_aborts: set[asyncio.Task[None]] = set()

    async def submit(self, request: PreparedRequest) -> None:
        await submit_async(self._redis, request.to_message())
        logger.info(
            "request queued: %d prompt tokens, max_tokens %d",
            len(request.prompt_token_ids),
            request.sampling_params.max_tokens,
            extra={"request_id": request.req_id},
        )

    def abort_later(self, req_id: str, reason: str) -> None:
        """Tell the batcher to stop `req_id`, without awaiting (safe inside a cancelled task)."""
        task = asyncio.get_running_loop().create_task(self._send_abort(req_id, reason))
        self._pending_aborts.add(task)
        task.add_done_callback(self._pending_aborts.discard)

    async def _send_abort(self, req_id: str, reason: str) -> None:
        try:
            await abort_async(self._redis, req_id, reason)
        except redis.exceptions.RedisError as exc:
            logger.warning("could not abort %s (%s): %s", req_id, reason, exc, extra={"request_id": req_id})

    async def drain(self) -> None:
        if self._pending_aborts:
            await asyncio.wait(set(self._pending_aborts), timeout=_ABORT_DRAIN_S)
        await self._mux.close()

    async def outputs(self, request: PreparedRequest) -> AsyncGenerator[Output | None, None]:
        """Text deltas until the request finishes; None after a read that brought nothing to show.

        The Nones let callers check regularly that their client is still there. Raises RequestFailed
        when the request fails and RequestTimedOut past the request timeout. Leaving early (client gone,
        cancellation, timeout, Redis error) aborts the request in the batcher.
        """
        bind_request_id(request.req_id)  # this task's log lines are about this request from now on
        processor = OutputProcessor(self._served.tokenizer.tokenizer, request.prompt_token_ids, request.stop)
        tracker = self._metrics.track(request.arrival_time, len(request.prompt_token_ids))
        deadline = time.monotonic() + self._request_timeout_s
        done = False
        token_ids: list[int] = []
        events: list[TokenEvent] = []
        try:
            batches = follow_token_stream(self._mux, request.req_id, deadline=deadline)
            async with aclosing(batches):
                async for batch in batches:
                    read_at = time.monotonic()
                    ready: list[Output] = []
                    num_read = 0
                    for entry_id, event in batch:
                        num_read += 1
                        token_ids.append(event.token_id)
                        events.append(event)
                        delta = processor.process(event.token_id, event.finish_reason)
                        if delta.stop_string_hit:
                            self.abort_later(request.req_id, "stop")
                        if delta.text or delta.finish_reason is not None:
                            ready.append(
                                Output(
                                    entry_id,
                                    delta.text,
                                    delta.finish_reason,
                                    processor.num_output_tokens,
                                    token_ids,
                                    events,
                                )
                            )
                            token_ids, events = [], []
                        if delta.finish_reason is not None:
                            done = True
                            break
                    # Metrics first: a caller may stop iterating right after the last output.
                    tracker.on_tokens(num_read, read_at)
                    if done:
                        self._log_finished(tracker, ready[-1].finish_reason or "stop", read_at)
                    for out in ready:
                        yield out
                    if done:
                        return
                    if not ready:
                        yield None
        except RequestFailed as exc:
            done = True  # the request is over on the server side already
            tracker.finish("error")
            logger.warning("request failed: %s", exc)
            raise
        except RequestTimedOut:
            logger.warning("request %s timed out after %.0f s", request.req_id, self._request_timeout_s)
            raise
        finally:
            if not done:
                tracker.finish("abort")
                self.abort_later(request.req_id, "abort")

    @staticmethod
    def _log_finished(tracker: RequestTracker, reason: str, now: float) -> None:
        e2e = tracker.finish(reason, now)
        logger.info(
            "request finished (%s): %d prompt + %d output tokens, ttft %.3f s, e2e %.3f s",
            reason,
            tracker.num_prompt_tokens,
            tracker.num_output_tokens,
            tracker.ttft or 0.0,
            e2e,
        )
